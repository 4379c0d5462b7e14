"""Command-line options naming one predictor setting, shared by ``inspect`` and ``configure``."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

import yaml

from pipeline.errors import UserError
from pipeline.params.base import knob_value_problem, parse_yaml, short_repr, yaml_problem
from pipeline.predictors import PREDICTORS

KNOB = re.compile(r"[a-z_]+")


def add_predictor_arguments(group: argparse._ActionsContainer, *, method_help: str) -> None:
    """--method, --knob KEY=VALUE (repeatable), --window, --global, --projections, --state (--centroids)."""
    group.add_argument("--method", choices=sorted(PREDICTORS), help=method_help)
    group.add_argument(
        "--knob", action="append", default=[], metavar="KEY=VALUE", help="a predictor knob (repeatable)"
    )
    group.add_argument("--window", type=int, default=0, help="window size w OR-ed in: 0 or odd (default 0)")
    group.add_argument("--global", dest="global_tokens", type=int, default=0, help="global first tokens")
    group.add_argument("--projections", help="projections file (predictors on projected queries and keys)")
    group.add_argument(
        "--state",
        "--centroids",
        dest="state",
        help="fitted predictor state file (the cluster stage's state.safetensors)",
    )


def knob_names() -> list[str]:
    """Every predictor's knob names, sorted."""
    return sorted({field.name for cls in PREDICTORS.values() for field in dataclasses.fields(cls)})


def parse_knobs(items: list[str]) -> dict[str, Any]:
    """``["buckets=8", "top_k=2"]`` → ``{"buckets": 8, "top_k": 2}``: each value one YAML scalar, read and
    bounded as a knob in the params file is (:func:`pipeline.params.base.knob_value_problem`); the predictor
    checks the knob's own range when it is built.

    Every malformed flag is one line naming the flag, what it got and the form allowed; a knob the method
    lacks is :func:`~pipeline.predictors.base.make_predictor`'s to name, with that method's knobs.
    """
    knobs = {}
    for item in items:
        flag = f"--knob {short_repr(item)}"
        key, sep, text = item.partition("=")
        if not sep or not KNOB.fullmatch(key):
            raise UserError(
                f"{flag}: not KEY=VALUE; allowed: --knob KEY=VALUE, KEY one of {', '.join(knob_names())}"
            )
        try:
            value = parse_yaml(text)
        except yaml.YAMLError as err:
            raise UserError(f"{flag}: the value is not valid YAML ({yaml_problem(err)})") from None
        problem = knob_value_problem(key, value)
        if problem:
            raise UserError(f"{flag}: {problem}")
        knobs[key] = value
    return knobs
