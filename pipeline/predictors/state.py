"""Fitted predictor state on disk: one safetensors file holding the state of several fitted predictors.

Tensors are named ``{state key}/layer{L}.{tensor}``, the state key being the method and its fit knobs
(``kmeans[buckets=8,iterations=25,...]``, :meth:`Predictor.state_key`); the header holds JSON under
``"predictors"``: ``{"format_version": 1, "states": {state key: {"name", "knobs", "layers"}}, "extra":
{...}}``, where ``extra`` records what the state was fitted on (graph store, projections, split). This
module is the only reader; it verifies the file (:mod:`pipeline.tensor_file`), its format version, that its
values are finite, and that every layer holds the tensors its predictor's knobs call for in the shapes
they call for (:meth:`Predictor.layer_state_shapes`); given an :class:`~pipeline.origin.Origin` and the
projections' ranks, against the teacher's heads and the projections too.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import UserError
from pipeline.finite import first_non_finite
from pipeline.origin import Origin
from pipeline.predictors.base import Predictor, make_predictor
from pipeline.tensor_file import read_tensor_file, write_tensor_file

METADATA_KEY = "predictors"
# The header's layout; a file without it was written before versions were recorded, or by another tool.
FORMAT_VERSION = 1


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
                tensors[f"{key}/layer{layer}.{name}"] = tensor
    header = {"format_version": FORMAT_VERSION, "states": states, "extra": dict(extra or {})}
    write_tensor_file(path, tensors, METADATA_KEY, header)


class StateFile:
    """A predictor state file, read and verified once: its header and tensors.

    With ``origin``, the file must have been fitted on the origin's teacher, and every state must cover the
    origin's layers with one slice per head; ``ranks`` ({layer: rank}) are the ranks of the projections the
    predictors will project with. Every problem is a one-line :class:`UserError`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        origin: Origin | None = None,
        *,
        ranks: Mapping[int, int] | None = None,
    ) -> None:
        self.path = Path(path)
        self.origin, self.ranks = origin, dict(ranks or {})
        header, self.tensors = read_tensor_file(
            path, METADATA_KEY, "predictor state file", "run cluster", version=FORMAT_VERSION
        )
        states, extra = header.get("states"), header.get("extra")
        if not isinstance(states, dict) or not isinstance(extra, dict):
            raise UserError(f"{path}: the predictor state header lacks its 'states' or 'extra' object")
        self.states: dict[str, Any] = states
        self.extra: dict[str, Any] = extra
        # the writer refuses these; a file holding them was edited (its hash rewritten to match)
        if (name := first_non_finite(self.tensors)) is not None:
            raise UserError(f"{path}: {name} holds non-finite values; re-run cluster")
        if origin is not None:
            origin.check_teacher(path, extra.get("graphs", {}))
            for key, entry in states.items():
                origin.check_layers(f"{path} [{key}]", entry["layers"])
            for name, tensor in self.tensors.items():
                origin.check_heads(path, name, tensor.shape[0] if tensor.dim() else 0)

    def stored(self) -> list[Predictor]:
        """The predictors the file records, built from their knobs, still without state."""
        try:
            return [make_predictor(e["name"], **e["knobs"]) for _, e in sorted(self.states.items())]
        except (KeyError, TypeError) as err:
            raise UserError(f"{self.path}: a state entry is malformed ({err!r}); run cluster again") from None

    def fill(self, predictor: Predictor) -> Predictor:
        """Give ``predictor`` its state (matched by state key); returns it."""
        key = predictor.state_key()
        if key not in self.states:
            stored = ", ".join(sorted(self.states)) or "none"
            raise UserError(f"{self.path} holds no state for {predictor.describe()}; it holds: {stored}")
        for layer in self.states[key]["layers"]:
            prefix = f"{key}/layer{layer}."
            layer_state = {n[len(prefix) :]: t for n, t in self.tensors.items() if n.startswith(prefix)}
            self._check_shapes(predictor, layer, layer_state)
            predictor.set_layer_state(layer, layer_state)
        return predictor

    def _check_shapes(self, predictor: Predictor, layer: int, state: Mapping[str, torch.Tensor]) -> None:
        """``layer``'s tensors are exactly those ``predictor``'s knobs call for, in their shapes, for the
        origin's heads and head size and the projections' rank where those are known."""
        heads = self.origin.heads if self.origin is not None else None
        head_dim = self.origin.head_dim if self.origin is not None else None
        rank = self.ranks.get(layer)
        expected = predictor.layer_state_shapes(heads, rank, head_dim)
        where = f"{self.path}: {predictor.state_key()}/layer{layer}"
        if set(state) != set(expected):
            raise UserError(
                f"{where} holds tensors {sorted(state)}; {predictor.name} needs {sorted(expected)}; "
                "re-run cluster"
            )
        for name, want in expected.items():
            have = tuple(state[name].shape)
            if len(have) != len(want) or any(w not in (None, h) for h, w in zip(have, want, strict=False)):
                shown = ", ".join("any" if w is None else str(w) for w in want)
                context = [f"{heads} heads" if heads else "", f"rank-{rank} projections" if rank else ""]
                given = " and ".join(c for c in context if c)
                raise UserError(
                    f"{where}.{name} has shape {have}; {predictor.describe()}"
                    f"{' with ' + given if given else ''} needs ({shown}); re-run cluster"
                )


def load_state(
    path: str | os.PathLike,
    predictor: Predictor,
    origin: Origin | None = None,
    *,
    ranks: Mapping[int, int] | None = None,
) -> Predictor:
    """Fill ``predictor`` with its fitted state from ``path`` (matched by state key); returns it.
    ``origin`` and ``ranks`` as :class:`StateFile` takes them."""
    return StateFile(path, origin, ranks=ranks).fill(predictor)


def load_states(
    path: str | os.PathLike, origin: Origin | None = None, *, ranks: Mapping[int, int] | None = None
) -> list[Predictor]:
    """Every predictor stored in ``path``, built from its recorded knobs and filled with its state (their
    classes must be registered: import :mod:`pipeline.predictors`); ``origin`` and ``ranks`` as
    :class:`StateFile` takes them."""
    file = StateFile(path, origin, ranks=ranks)
    return [file.fill(predictor) for predictor in file.stored()]


def select_state(
    path: str | os.PathLike,
    predictor: Predictor,
    origin: Origin | None = None,
    *,
    explicit: Collection[str] | None = None,
    ranks: Mapping[int, int] | None = None,
) -> Predictor:
    """``predictor`` with the state in ``path`` whose fit knobs match the ones it was given explicitly:
    those named in ``explicit`` (the knobs a user wrote), or without it those that differ from the defaults.

    The other fit knobs are taken from the stored state when exactly one stored state of the method matches
    the given ones (so ``kmeans(buckets=8)`` finds centroids fitted with any iteration count); a one-line
    error lists the fitted states when none or several match. ``origin`` and ``ranks`` as :class:`StateFile`
    takes them.
    """
    defaults = type(predictor)()
    given = {
        k: getattr(predictor, k)
        for k in predictor.fit_knobs
        if (k in explicit if explicit is not None else getattr(predictor, k) != getattr(defaults, k))
    }
    file = StateFile(path, origin, ranks=ranks)
    stored = [p for p in file.stored() if p.name == predictor.name]
    exact = [p for p in stored if p.state_key() == predictor.state_key()]
    matches = exact or [p for p in stored if all(getattr(p, k) == v for k, v in given.items())]
    if len(matches) != 1:
        fitted = "; ".join(p.describe() for p in stored) or "none"
        problem = "no state" if not matches else "several states"
        raise UserError(f"{path} holds {problem} for {predictor.describe()}; fitted: {fitted}")
    other = {k: v for k, v in predictor.knobs().items() if k not in predictor.fit_knobs}
    return file.fill(matches[0]).with_knobs(**other)
