"""Fitted predictor state on disk: one safetensors file holding the state of several fitted predictors.

Tensors are named ``{state key}/layer{L}.{tensor}``, the state key being the method and its fit knobs
(``kmeans[buckets=8,iterations=25,...]``, :meth:`Predictor.state_key`); the header holds JSON under
``"predictors"``: ``{"states": {state key: {"name", "knobs", "layers"}}, "extra": {...}}``, where ``extra``
records what the state was fitted on (graph store, projections, split). This module is the only reader.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from pipeline.atomic import atomic_path
from pipeline.errors import UserError
from pipeline.predictors.base import Predictor, make_predictor

METADATA_KEY = "predictors"


def save_states(
    path: str | os.PathLike, predictors: Sequence[Predictor], extra: Mapping[str, Any] | None = None
) -> None:
    """Write every fitted layer of ``predictors`` (distinct state keys) to ``path`` atomically."""
    tensors, states = {}, {}
    for predictor in predictors:
        key = predictor.state_key()
        if key in states:
            raise ValueError(f"two predictors share the state key {key}")
        states[key] = {"name": predictor.name, "knobs": predictor.knobs(), "layers": predictor.state_layers}
        for layer in predictor.state_layers:
            for name, tensor in predictor.layer_state(layer).items():
                tensors[f"{key}/layer{layer}.{name}"] = tensor.detach().cpu().contiguous()
    header = {"states": states, "extra": dict(extra or {})}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={METADATA_KEY: json.dumps(header, sort_keys=True)})


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON header of a state file; one-line errors for a missing or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"predictor state file {path} not found")
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
    except SafetensorError as err:
        raise UserError(f"{path}: not a safetensors file ({err})") from None
    if METADATA_KEY not in meta:
        raise UserError(f"{path}: not a predictor state file (no {METADATA_KEY!r} metadata)")
    return json.loads(meta[METADATA_KEY])


def load_state(path: str | os.PathLike, predictor: Predictor) -> Predictor:
    """Fill ``predictor`` with its fitted state from ``path`` (matched by state key); returns it."""
    return _fill(path, read_header(path), predictor)


def _fill(path: str | os.PathLike, header: dict[str, Any], predictor: Predictor) -> Predictor:
    key = predictor.state_key()
    if key not in header["states"]:
        stored = ", ".join(sorted(header["states"])) or "none"
        raise UserError(f"{path} holds no state for {predictor.describe()}; it holds: {stored}")
    with safe_open(str(path), framework="pt") as handle:
        names = [name for name in handle.keys() if name.startswith(f"{key}/")]  # noqa: SIM118
        for layer in header["states"][key]["layers"]:
            prefix = f"{key}/layer{layer}."
            predictor.set_layer_state(
                layer, {n[len(prefix) :]: handle.get_tensor(n) for n in names if n.startswith(prefix)}
            )
    return predictor


def _stored(header: dict[str, Any]) -> list[Predictor]:
    """The predictors a header records, built from their knobs, still without state."""
    return [make_predictor(entry["name"], **entry["knobs"]) for _, entry in sorted(header["states"].items())]


def load_states(path: str | os.PathLike) -> list[Predictor]:
    """Every predictor stored in ``path``, built from its recorded knobs and filled with its state (their
    classes must be registered: import :mod:`pipeline.predictors`)."""
    header = read_header(path)
    return [_fill(path, header, predictor) for predictor in _stored(header)]


def select_state(path: str | os.PathLike, predictor: Predictor) -> Predictor:
    """``predictor`` with the state in ``path`` whose fit knobs match the ones it was given explicitly.

    Fit knobs left at their defaults are taken from the stored state when exactly one stored state of the
    method matches the others (so ``kmeans(buckets=8)`` finds centroids fitted with any iteration count);
    a one-line error lists the fitted states when none or several match. Only the match's tensors are read.
    """
    defaults = type(predictor)()
    given = {
        k: getattr(predictor, k) for k in predictor.fit_knobs if getattr(predictor, k) != getattr(defaults, k)
    }
    header = read_header(path)
    stored = [p for p in _stored(header) if p.name == predictor.name]
    exact = [p for p in stored if p.state_key() == predictor.state_key()]
    matches = exact or [p for p in stored if all(getattr(p, k) == v for k, v in given.items())]
    if len(matches) != 1:
        fitted = "; ".join(p.describe() for p in stored) or "none"
        problem = "no state" if not matches else "several states"
        raise UserError(f"{path} holds {problem} for {predictor.describe()}; fitted: {fitted}")
    other = {k: v for k, v in predictor.knobs().items() if k not in predictor.fit_knobs}
    return _fill(path, header, matches[0]).with_knobs(**other)
