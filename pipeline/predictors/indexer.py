"""τ-indexer: predict each query's α-entmax support by applying entmax's own rule to low-rank scores.

α-entmax keeps key j of query i exactly when (α − 1) z_ij > τ_i, the threshold that makes the row sum to 1
(entmax15's convention: p_j = [z_j/2 − τ]₊²). The indexer estimates the scores cheaply, at rank r ≪ d,

    z′_ij = s · (A q_i)·(B k_j),      A, B ∈ ℝ^{r × d} per head,  s the model's scaling,

each low-rank row on its own 7-bit grid (:mod:`attention_kernels.index_grid`: the CPU kernel multiplies
the codes in integers),

and applies the same rule per query, with a safety margin δ ≥ 0:

    τ′_i = the α-entmax threshold of the row z′_i over the keys query i may attend,
    Ĝ_i  = {j may be attended : (α − 1) z′_ij ≥ τ′_i − δ}.

Buckets force one cut shared by all queries; the entmax threshold is per query, and the number of keys it
keeps adapts to each row. A and B come from a PCA of the training queries and keys (``fitting="pca"``,
training-free, A = B) or are distilled from the teacher's attention (``fitting="distill"``); see
:mod:`pipeline.predictors.indexer_fit`. In a model, entmax over Ĝ with exact scores recomputes τ on the
selected keys, so whenever Ĝ_i holds the teacher's support the output is the teacher's (sparse-consistency).

A row's prediction depends on the query and every key it may attend (scope "row"), which a decoder has at
each step, so the indexer runs in every attention kind.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor

from attention_kernels.entmax.threshold import threshold_from_probabilities
from attention_kernels.index_grid import on_grid
from pipeline.errors import UserError
from pipeline.predictors.base import HeadInputs, Prediction, Predictor, positive_int, register
from pipeline.predictors.indexer_fit import FITS, distill_maps, low_rank, principal_basis


def indexed_set(scores: Tensor, pairs: Tensor, alpha: float, margin: float) -> Tensor:
    """(b, h, n, m) bool Ĝ_i = {j ∈ pairs_i : (α − 1) z′_ij ≥ τ′_i − δ} (see the module docstring)."""
    masked = scores.masked_fill(~pairs, float("-inf"))
    tau = threshold_from_probabilities(masked, alpha)  # (b, h, n, 1)
    return ((alpha - 1.0) * scores >= tau - margin) & pairs


@register
@dataclass(frozen=True)
class IndexerPredictor(Predictor):
    """Per-query entmax threshold on rank-``rank`` scores, widened by ``margin`` (δ, in units of (α − 1) z).

    Fit knobs: the rank, the ``fitting`` (``pca`` or ``distill``), the α whose threshold is predicted (the
    teacher's), and the distillation's ``epochs`` and ``lr`` (unused by ``pca``).
    """

    name = "indexer"
    fitted = True
    needs_projections = False
    scope = "row"
    fit_knobs = ("rank", "fitting", "alpha", "epochs", "lr")
    rank: int = 8
    margin: float = 0.0
    alpha: float = 1.5
    fitting: str = "pca"
    epochs: int = 3
    lr: float = 0.01

    def check(self) -> None:
        positive_int(self.name, "rank", self.rank)
        positive_int(self.name, "epochs", self.epochs)
        for knob, least in (("margin", 0.0), ("lr", 0.0)):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < least:
                raise UserError(f"{self.name}.{knob} must be a number >= {least}; got {value!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or not self.alpha > 1:
            raise UserError(
                f"{self.name}.alpha must be a number > 1 (entmax with exact zeros); got {self.alpha!r}"
            )
        if self.fitting not in FITS:
            raise UserError(f"{self.name}.fitting must be one of {', '.join(FITS)}; got {self.fitting!r}")

    def fit_layer(self, layer: int, batches: Iterable[HeadInputs], seed: int) -> dict[str, Tensor]:
        batches = list(batches)
        if not batches:
            raise UserError(f"{self.name}: no training batches for layer {layer}")
        head_dim = batches[0].q.shape[-1]
        if self.rank > head_dim:
            raise UserError(f"{self.name}.rank = {self.rank} exceeds the head dimension {head_dim}")
        basis = principal_basis(batches, self.rank)  # (h, r, d)
        if self.fitting == "pca":
            return {"q_map": basis, "k_map": basis.clone()}
        q_map, k_map, _ = distill_maps(
            batches, basis, basis, alpha=float(self.alpha), epochs=self.epochs, lr=self.lr, seed=seed
        )
        return {"q_map": q_map, "k_map": k_map}

    def layer_state_shapes(
        self, heads: int | None, rank: int | None, head_dim: int | None
    ) -> dict[str, tuple[int | None, ...]]:
        # the maps' rank is this predictor's own knob, not the projections'
        return {"q_map": (heads, self.rank, head_dim), "k_map": (heads, self.rank, head_dim)}

    def index_queries(self, layer: int, q: Tensor) -> Tensor:
        """The low-rank queries A q (b, h, n, r) of ``layer``, float32."""
        return low_rank(q, self._map(layer, "q_map", q))

    def index_keys(self, layer: int, k: Tensor) -> Tensor:
        """The low-rank keys B k (b, h, m, r) of ``layer``, float32: z′ is the model's scaling times their dot
        products with the low-rank queries, each row of both on its 7-bit grid (what ``select`` and
        :func:`attention_kernels.indexed.attention` compute; the CPU kernel codes the rows itself)."""
        return low_rank(k, self._map(layer, "k_map", k))

    def _map(self, layer: int, name: str, x: Tensor) -> Tensor:
        linear_map = self.layer_state(layer)[name]  # (h, r, d)
        if linear_map.shape[-1] != x.shape[-1]:
            raise UserError(
                f"{self.describe()}: layer {layer}'s maps expect head dimension {linear_map.shape[-1]}, "
                f"the inputs have {x.shape[-1]}"
            )
        return linear_map

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        return self.select(self.index_queries(layer, inputs.q), self.index_keys(layer, inputs.k), inputs)

    def select(self, q_index: Tensor, k_index: Tensor, inputs: HeadInputs) -> Prediction:
        """Ĝ from the low-rank queries (b, h, n, r) and keys (b, h, m, r) of ``inputs``' pairs, each row
        on its 7-bit grid."""
        low_keys = on_grid(k_index).transpose(-1, -2)
        scores = (on_grid(q_index) @ low_keys) * inputs.score_scale()  # (b, h, n, m) z′
        return Prediction(mask=indexed_set(scores, inputs.pairs(), float(self.alpha), float(self.margin)))
