"""Longformer baseline: g random global tokens per sentence and head, on top of the window.

For every sentence and head, with P the positions holding a real token (a query or a key),

    R ⊆ P drawn uniformly without replacement,  |R| = min(g, |P|),      Ĝ = {(i, j) : i ∈ R or j ∈ R},

so a global token attends every key and is attended by every query; predicted_graph then keeps the valid
(and, when causal, j ≤ i) pairs. The reference code draws g = randint(2, t) positions with replacement over
the padded length; here exactly min(g, |P|) distinct real positions are drawn, from a generator seeded by
(seed, layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from pipeline.predictors.base import (
    HeadInputs,
    Prediction,
    Predictor,
    layer_generator,
    positive_int,
    random_subset,
    register,
)


@register
@dataclass(frozen=True)
class LongformerPredictor(Predictor):
    """``global_random`` random real positions become global rows and columns (paper grid g = 4 … 20)."""

    name = "longformer"
    scope = "batch"
    needs_projections = False
    global_random: int = 4
    seed: int = 0

    def check(self) -> None:
        positive_int(self.name, "global_random", self.global_random)
        positive_int(self.name, "seed", self.seed, least=0)

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        b, heads, n = inputs.q.shape[:3]
        m = inputs.k.shape[2]
        # positions are shared by queries and keys (the same tokens in self-attention); cross-attention
        # pads the shorter side so a position is real when it is real on either side
        length = max(n, m)
        real = F.pad(inputs.q_valid, (0, length - n)) | F.pad(inputs.k_valid, (0, length - m))  # (b, L)
        chosen = random_subset(
            real[:, None].expand(b, heads, length), self.global_random, layer_generator(self.seed, layer)
        )  # (b, h, L)
        mask = chosen[..., :n, None] | chosen[..., None, :m]  # (b, h, n, m)
        return Prediction(mask=mask)
