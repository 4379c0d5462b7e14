"""Scores of a predicted attention graph Ĝ against the gold graph G, per sentence and head.

Only valid pairs count: V = {(i, j) : i, j real tokens, and j ≤ i when causal}, so a causal sentence of
length L has L(L+1)/2 pairs. With Ĝ and G restricted to V:

    sparsity  = 1 − |Ĝ| / |V|
    recall    = |Ĝ ∩ G| / |G|
    precision = |Ĝ ∩ G| / |Ĝ|
    exact     = |{i : G_i ≠ ∅, G_i ⊆ Ĝ_i}| / |{i : G_i ≠ ∅}|   (fraction of queries with recall 1)

A score whose denominator is zero for a sentence (no valid pair, no gold edge, no predicted edge, no query
with a gold edge) is undefined and that sentence is left out of that score's average rather than counted
as perfect. With entmax every valid query has at least one gold key, so recall and exact are then always
defined. Scores are averaged over sentences first, then over heads and layers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from attention_kernels.attended import valid_pairs

SCORES = ("sparsity", "recall", "precision", "exact")


@dataclasses.dataclass
class GraphScoreSums:
    """Per-head sums over sentences of each score, and how many sentences each sum covers.

    ``sums[name]`` and ``counts[name]`` are float64 (heads,) tensors; add instances to accumulate batches.
    """

    sums: dict[str, torch.Tensor]
    counts: dict[str, torch.Tensor]

    @classmethod
    def zeros(cls, n_heads: int) -> GraphScoreSums:
        """Empty sums for ``n_heads`` heads."""
        z = torch.zeros(n_heads, dtype=torch.float64)
        return cls({s: z.clone() for s in SCORES}, {s: z.clone() for s in SCORES})

    def __add__(self, other: GraphScoreSums) -> GraphScoreSums:
        return GraphScoreSums(
            {s: self.sums[s] + other.sums[s] for s in SCORES},
            {s: self.counts[s] + other.counts[s] for s in SCORES},
        )

    def means(self) -> dict[str, torch.Tensor]:
        """Per-head averages over sentences, float64 (heads,); NaN where no sentence defines the score."""
        return {s: self.sums[s] / self.counts[s] for s in SCORES}


def _count(x: Tensor, dims: int | tuple[int, ...]) -> Tensor:
    """int32 number of True entries of bool ``x`` over ``dims`` (its bytes summed: a bool sum or ``any``
    would widen every entry to int64 first, several times slower)."""
    return x.view(torch.uint8).sum(dims, dtype=torch.int32)


@dataclasses.dataclass(frozen=True)
class GoldGraph:
    """A batch's gold graph within the valid pairs, with what every score takes from it alone: computed
    once, then any number of predicted graphs are scored against it (:meth:`scores`)."""

    valid: Tensor  # (b, 1, n, m) bool V
    gold: Tensor  # (b, h, n, m) bool G ∩ V
    n_valid: Tensor  # (b, 1) float64 |V|
    n_gold: Tensor  # (b, h) float64 |G|
    gold_rows: Tensor  # (b, h, n) int32 |G_i|
    n_gold_rows: Tensor  # (b, h) float64 |{i : G_i ≠ ∅}|

    @classmethod
    def of(cls, gold: Tensor, q_valid: Tensor, k_valid: Tensor, *, causal: bool) -> GoldGraph:
        """``gold`` (b, h, n, m) bool, valid masks (b, n|m)."""
        valid = valid_pairs(q_valid, k_valid, causal=causal)[:, None]  # (b, 1, n, m)
        gold = gold & valid
        gold_rows = _count(gold, -1)
        return cls(
            valid=valid,
            gold=gold,
            n_valid=_count(valid, (-1, -2)).to(torch.float64),
            n_gold=gold_rows.sum(-1).to(torch.float64),
            gold_rows=gold_rows,
            n_gold_rows=gold_rows.gt(0).sum(-1).to(torch.float64),
        )

    def scores(self, pred: Tensor) -> GraphScoreSums:
        """Per-head sums over the batch's sentences of the scores of ``pred`` (b, h | 1, n, m) bool."""
        pred = pred & self.valid
        hit_rows = _count(pred & self.gold, -1)  # (b, h, n)
        shape = hit_rows.shape[:2]
        n_pred = _count(pred, (-1, -2)).to(torch.float64).expand(shape)
        n_hit = hit_rows.sum(-1).to(torch.float64)
        # a query is exact when every gold key is predicted
        exact_rows = (self.gold_rows > 0) & (hit_rows == self.gold_rows)
        n_valid, n_gold, n_gold_rows = (
            x.expand(shape) for x in (self.n_valid, self.n_gold, self.n_gold_rows)
        )
        per_sentence = {
            "sparsity": (1 - n_pred / n_valid, n_valid > 0),
            "recall": (n_hit / n_gold, n_gold > 0),
            "precision": (n_hit / n_pred, n_pred > 0),
            "exact": (exact_rows.sum(-1) / n_gold_rows, n_gold_rows > 0),
        }
        sums = {s: torch.where(ok, v, 0.0).sum(0).cpu() for s, (v, ok) in per_sentence.items()}
        counts = {s: ok.sum(0).to(torch.float64).cpu() for s, (_, ok) in per_sentence.items()}
        return GraphScoreSums(sums, counts)


def graph_scores(
    pred: Tensor,
    gold: Tensor,
    q_valid: Tensor,
    k_valid: Tensor,
    *,
    causal: bool,
) -> GraphScoreSums:
    """Score a batch: ``pred`` and ``gold`` are (batch, heads | 1, n, m) bool, valid masks (batch, n|m).

    Returns the per-head sums over the batch's sentences of the per-sentence scores.
    """
    return GoldGraph.of(gold, q_valid, k_valid, causal=causal).scores(pred)


def summarize(per_layer: Sequence[GraphScoreSums]) -> dict[str, object]:
    """Average over sentences, then over heads and layers (heads with an undefined score are skipped).

    Returns ``{score: float}`` for the overall averages plus ``"per_layer_head"``: ``{score: [[...]]}``
    (layers × heads, ``None`` where undefined), ready for JSON.
    """
    table = {s: torch.stack([layer.means()[s] for layer in per_layer]) for s in SCORES}  # (layers, heads)
    overall: dict[str, object] = {s: table[s].nanmean().item() for s in SCORES}
    overall["per_layer_head"] = {
        s: [[None if math.isnan(v) else v for v in row] for row in table[s].tolist()] for s in SCORES
    }
    return overall
