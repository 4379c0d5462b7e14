"""Held-out scoring of predictors on a graph store: the one place predicted graphs meet gold graphs.

For one layer of one attention kind, the sentences ``indices`` are read in padded batches, projected once
by that layer's :class:`~pipeline.projection.model.HeadProjections` (when given), and every
(predictor, window, global tokens) setting is scored on them (:mod:`pipeline.predictors.metrics`): each
predictor predicts once per batch, and each of its pattern settings costs one mask; what the scores take
from the gold graph alone is computed once per batch (:class:`~pipeline.predictors.metrics.GoldGraph`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.graphs.batches import iter_batches
from pipeline.graphs.store import GraphStore
from pipeline.predictors.base import (
    HeadInputs,
    Prediction,
    Predictor,
    learned_pairs,
    predicted_graph,
    with_pattern,
)
from pipeline.predictors.metrics import GoldGraph, GraphScoreSums
from pipeline.projection.model import HeadProjections


@dataclass(frozen=True)
class Setting:
    """A predictor with the pattern OR-ed into its graph: window size w (0 or odd) and g global tokens."""

    predictor: Predictor
    window: int = 0
    global_tokens: int = 0

    def graph(self, prediction: Prediction, inputs: HeadInputs) -> torch.Tensor:
        """(b, h | 1, n, m) bool: ``prediction`` with this setting's pattern, within the valid pairs."""
        return predicted_graph(
            prediction,
            inputs.q_valid,
            inputs.k_valid,
            causal=inputs.causal,
            window=self.window,
            global_tokens=self.global_tokens,
        )


@torch.no_grad()
def layer_inputs(
    store: GraphStore,
    kind: str,
    layer: int,
    indices: Sequence[int],
    *,
    projections: HeadProjections | None = None,
    batch_size: int = 64,
) -> Iterator[tuple[HeadInputs, torch.Tensor]]:
    """(inputs, gold (b, h, n, m) bool) for padded batches of ``indices``, projected when ``projections``."""
    causal = store.causal(kind)
    for batch in iter_batches(store, kind=kind, layer=layer, indices=indices, batch_size=batch_size):
        q_proj, k_proj = projections(batch["q"], batch["k"]) if projections is not None else (None, None)
        inputs = HeadInputs(
            q=batch["q"],
            k=batch["k"],
            q_valid=batch["q_valid"],
            k_valid=batch["k_valid"],
            causal=causal,
            q_proj=q_proj,
            k_proj=k_proj,
            scaling=store.scaling,
        )
        yield inputs, batch["gold"]


def _rows_mask(query_rows: Mapping[int, np.ndarray], sentences: Sequence[int], width: int) -> torch.Tensor:
    """(b, width) bool: each sentence's chosen query rows, False past its end."""
    mask = np.zeros((len(sentences), width), bool)
    for b, sentence in enumerate(sentences):
        rows = np.asarray(query_rows[sentence], bool)
        mask[b, : len(rows)] = rows
    return torch.from_numpy(mask)


@torch.no_grad()
def score_settings(
    store: GraphStore,
    kind: str,
    layer: int,
    settings: Sequence[Setting],
    indices: Sequence[int],
    *,
    projections: HeadProjections | None = None,
    batch_size: int = 64,
    query_rows: Mapping[int, np.ndarray] | None = None,
) -> list[GraphScoreSums]:
    """Per-head score sums of every setting on the sentences ``indices`` of ``layer``, in order.

    ``query_rows`` (stored sentence index → (n,) bool) scores those query rows of each sentence alone (an
    mqar example's answers): the predictors still see every query, the scores count only those rows."""
    sums = [GraphScoreSums.zeros(store.heads) for _ in settings]
    done = 0  # the sentences of ``indices`` in the batches so far: iter_batches keeps their order
    by_predictor: dict[int, list[int]] = {}
    for position, setting in enumerate(settings):
        by_predictor.setdefault(id(setting.predictor), []).append(position)
    for inputs, gold in layer_inputs(
        store, kind, layer, indices, projections=projections, batch_size=batch_size
    ):
        scored = inputs.q_valid  # (b, n)
        if query_rows is not None:
            chunk = [int(i) for i in indices[done : done + len(scored)]]
            scored = scored & _rows_mask(query_rows, chunk, scored.shape[1])
        done += len(scored)
        target = GoldGraph.of(gold, scored, inputs.k_valid, causal=inputs.causal)
        for positions in by_predictor.values():
            learned = learned_pairs(settings[positions[0]].predictor.predict(layer, inputs))
            for position in positions:
                setting = settings[position]
                graph = with_pattern(
                    learned, target.valid, window=setting.window, global_tokens=setting.global_tokens
                )
                sums[position] = sums[position] + target.scores(graph)
    return sums


@torch.no_grad()
def sentence_graph(
    store: GraphStore,
    kind: str,
    layer: int,
    sentence: int,
    setting: Setting,
    *,
    projections: HeadProjections | None = None,
) -> torch.Tensor:
    """(h | 1, n, m) bool predicted graph of one sentence of ``layer``, exactly as it is scored."""
    inputs, _ = next(layer_inputs(store, kind, layer, [sentence], projections=projections, batch_size=1))
    return setting.graph(setting.predictor.predict(layer, inputs), inputs)[0]
