"""Reformer baseline: angular LSH of the projected queries and keys by one random rotation per head.

With R ∈ ℝ^{r × β/2}, R_ab ~ N(0, 1), drawn once per layer and head and shared by queries and keys,

    f(x) = argmax [x R ; −x R] ∈ {0, …, β − 1},      Ĝ = {(i, j) : f(q′_i) = f(k′_j)}.

Points at a small angle tend to share the argmax, so similar vectors share a bucket. Because queries and keys
are hashed alike (Reformer's shared-QK space), a token whose query and key are close lands in one bucket on
both sides: recall is high, sparsity low. Equal coordinates go to the lower bucket. R is fitted state (drawn,
not learned) from a generator seeded by (seed, layer); the reference code reseeds the global RNG instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from pipeline.errors import UserError
from pipeline.predictors.base import (
    HeadInputs,
    Prediction,
    Predictor,
    layer_generator,
    padding_to_none,
    positive_int,
    register,
)


def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """int32 (batch, heads, n, 1) bucket argmax [xR; −xR], −1 on padding.

    ``x`` is (batch, heads, n, r), ``rotations`` (heads, r, β/2), ``valid`` (batch, n).
    """
    rotated = torch.einsum("bhnr,hrc->bhnc", x, rotations.to(x))  # (b, h, n, β/2)
    ids = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1, keepdim=True)  # (b, h, n, 1)
    return padding_to_none(ids, valid)


@register
@dataclass(frozen=True)
class ReformerPredictor(Predictor):
    """One random rotation per head hashes q′ and k′ into ``buckets`` shared buckets (paper grid 2 … 12)."""

    name = "reformer"
    fitted = True
    fit_knobs = ("buckets", "seed")
    buckets: int = 4
    seed: int = 0

    def check(self) -> None:
        is_int = isinstance(self.buckets, int) and not isinstance(self.buckets, bool)
        if not is_int or self.buckets < 2 or self.buckets % 2:
            raise UserError(f"reformer.buckets must be an even integer >= 2; got {self.buckets!r}")
        positive_int(self.name, "seed", self.seed, least=0)

    def fit_layer(self, layer: int, batches: Iterable[HeadInputs], seed: int) -> dict[str, torch.Tensor]:
        # nothing is learned from the data: a batch only gives the number of heads and the rank r; the
        # rotations follow the seed knob (part of the state key), not the fitting run's seed
        first = next(iter(batches), None)
        if first is None:
            raise UserError(f"reformer: no training batches for layer {layer}")
        _, heads, _, rank = first.projected()[0].shape
        rotations = torch.randn(heads, rank, self.buckets // 2, generator=layer_generator(self.seed, layer))
        return {"rotations": rotations}  # (h, r, β/2)

    def layer_state_shapes(
        self, heads: int | None, rank: int | None, head_dim: int | None
    ) -> dict[str, tuple[int | None, ...]]:
        return {"rotations": (heads, rank, self.buckets // 2)}

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        rotations = self.layer_state(layer)["rotations"]
        q_proj, k_proj = inputs.projected()
        return Prediction(
            q_buckets=lsh_buckets(q_proj, rotations, inputs.q_valid),
            k_buckets=lsh_buckets(k_proj, rotations, inputs.k_valid),
        )
