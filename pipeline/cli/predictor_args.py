"""Command-line options naming one predictor setting, shared by ``inspect`` and ``configure``."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from pipeline.errors import UserError
from pipeline.predictors import PREDICTORS


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
        help="fitted predictor state file (kmeans: centroids.safetensors)",
    )


def parse_knobs(items: list[str]) -> dict[str, Any]:
    """``["buckets=8", "top_k=2"]`` → ``{"buckets": 8, "top_k": 2}`` (values read as YAML scalars)."""
    knobs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--knob {item!r} is not KEY=VALUE")
        knobs[key] = yaml.safe_load(value)
    return knobs
