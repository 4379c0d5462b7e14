"""The graph sweep: every predictor setting × window size × global tokens, scored on a held-out graph store.

A *grid* names, per method, lists of knob values; their product gives the predictors. Fitted methods
(k-means, Routing, Reformer) come from the predictor state file: the grid's fit knobs choose among the
stored states (every stored state when it names none), its other knobs (k-means top-k) multiply them. Each
predictor is then crossed with every window size and global-token count (a method's grid may name its own
``window`` and ``global_tokens`` lists instead), and all settings are scored layer by layer on the store's
sentences (:func:`~pipeline.predictors.scoring.score_settings`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from attention_kernels.attended import window_radius
from pipeline.errors import UserError
from pipeline.graphs.store import GraphStore
from pipeline.predictors.base import PREDICTORS, Predictor, make_predictor
from pipeline.predictors.metrics import GraphScoreSums, summarize
from pipeline.predictors.scoring import Setting, score_settings
from pipeline.projection.model import HeadProjections


def _products(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, keys in sorted order."""
    keys = sorted(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def grid_predictors(
    method: str, grid: Mapping[str, Sequence[Any]], stored: Sequence[Predictor], state_path: str
) -> list[Predictor]:
    """The predictors of ``method`` the grid names; fitted ones taken from ``stored`` (see module doc)."""
    if method not in PREDICTORS:
        allowed = ", ".join(sorted(PREDICTORS))
        raise UserError(f"evaluate.methods.{method}: unknown predictor; allowed: {allowed}")
    cls = PREDICTORS[method]
    if not cls.fitted:
        # distinct predictors only: a knob may override another (quantization's tokens_per_bin replaces bins)
        return list(dict.fromkeys(make_predictor(method, **knobs) for knobs in _products(grid)))
    fit_grid = {k: v for k, v in grid.items() if k in cls.fit_knobs}
    chosen = [
        p
        for p in stored
        if p.name == method and all(getattr(p, k) in values for k, values in fit_grid.items())
    ]
    for key, values in fit_grid.items():
        for value in values:
            if not any(getattr(p, key) == value for p in chosen):
                fitted = sorted({getattr(p, key) for p in stored if p.name == method})
                raise UserError(
                    f"evaluate.methods.{method}.{key} = {value}: {state_path} holds no {method} state with "
                    f"{key} = {value} (fitted: {fitted or 'none'}); fit it in the cluster stage"
                )
    if not chosen:
        raise UserError(f"evaluate.methods.{method}: {state_path} holds no fitted {method} state")
    other = {k: v for k, v in grid.items() if k not in cls.fit_knobs}
    return [p.with_knobs(**knobs) for p in chosen for knobs in _products(other)]


PATTERN_KEYS = ("window", "global_tokens")  # grid keys that set a method's pattern, not a predictor knob


def method_settings(
    method: str,
    grid: Mapping[str, Sequence[Any]],
    stored: Sequence[Predictor],
    state_path: str,
    *,
    windows: Sequence[int],
    global_tokens: Sequence[int],
) -> list[Setting]:
    """The settings of one method: its grid's predictors × its windows and global-token counts (the grid's
    own ``window`` / ``global_tokens`` lists when it names them, else ``windows`` / ``global_tokens``)."""
    windows = grid.get("window", windows)
    global_tokens = grid.get("global_tokens", global_tokens)
    for window in windows:
        try:
            window_radius(window)
        except ValueError as err:
            raise UserError(f"evaluate.methods.{method}.window: {err}") from None
    for count in global_tokens:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UserError(f"evaluate.methods.{method}.global_tokens must list integers >= 0; got {count!r}")
    knobs = {k: v for k, v in grid.items() if k not in PATTERN_KEYS}
    return grid_settings(grid_predictors(method, knobs, stored, state_path), windows, global_tokens)


def label(predictor: Predictor, keys: Sequence[str], window: int, global_tokens: int) -> str:
    """``kmeans(buckets=8, top_k=1) w=3 g=1``: the method, the knobs ``keys``, and the pattern."""
    knobs = ", ".join(f"{k}={getattr(predictor, k)}" for k in keys)
    return f"{predictor.name}({knobs}) w={window} g={global_tokens}"


def varying_knobs(predictors: Sequence[Predictor]) -> list[str]:
    """The knobs whose values differ among ``predictors`` (of one method): those that name a setting."""
    if not predictors:
        return []
    knobs = predictors[0].knobs()
    return [k for k in knobs if len({repr(getattr(p, k)) for p in predictors}) > 1]


def grid_settings(
    predictors: Sequence[Predictor], windows: Sequence[int], global_tokens: Sequence[int]
) -> list[Setting]:
    """Every predictor crossed with every window size and global-token count."""
    return [Setting(p, w, g) for p in predictors for w in windows for g in global_tokens]


def gold_sparsity(full_row: Mapping[str, Any]) -> dict[str, Any]:
    """The teacher's own sparsity 1 − |G|/|V| from the scores of a setting that attends every valid pair.

    With Ĝ = V a sentence's precision is |G ∩ V| / |V|, so its gold sparsity is 1 − precision, averaged
    over the same sentences, heads and layers as every other score: no pass of its own over the store.
    """
    table = [[None if p is None else 1.0 - p for p in row] for row in full_row["per_layer_head"]["precision"]]
    return {"sparsity": 1.0 - full_row["precision"], "per_layer_head": table}


def sweep_graphs(
    store: GraphStore,
    kind: str,
    settings: Sequence[Setting],
    projections: Mapping[int, HeadProjections],
    indices: Sequence[int],
    *,
    batch_size: int = 64,
    query_rows: Mapping[int, np.ndarray] | None = None,
) -> list[tuple[Setting, dict[str, Any]]]:
    """Every setting with its scores on ``indices``, in one pass over the store: JSON-ready rows (on the
    ``query_rows`` of each sentence alone, given those: :func:`~pipeline.predictors.scoring.score_settings`).
    """
    per_layer: list[list[GraphScoreSums]] = [[] for _ in settings]
    for layer in tqdm(range(store.layers), desc=f"score {len(settings)} settings", unit="layer"):
        sums = score_settings(
            store,
            kind,
            layer,
            settings,
            indices,
            projections=projections.get(layer),
            batch_size=batch_size,
            query_rows=query_rows,
        )
        for collected, layer_sums in zip(per_layer, sums, strict=True):
            collected.append(layer_sums)
    predictors = list(dict.fromkeys(s.predictor for s in settings))
    methods = {p.name for p in predictors}
    label_keys = {method: varying_knobs([p for p in predictors if p.name == method]) for method in methods}
    rows = []
    for setting, layer_sums in zip(settings, per_layer, strict=True):
        p = setting.predictor
        rows.append(
            (
                setting,
                {
                    "method": p.name,
                    "knobs": p.knobs(),
                    "window": setting.window,
                    "global_tokens": setting.global_tokens,
                    "label": label(p, label_keys[p.name], setting.window, setting.global_tokens),
                    **summarize(layer_sums),
                },
            )
        )
    return rows
