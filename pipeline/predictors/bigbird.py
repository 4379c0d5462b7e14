"""BigBird baseline: r random keys per query, on top of the window and global pattern.

For every sentence, head and valid query i, with A_i = {j : key j is real, and j ≤ i when causal} the keys
query i may attend,

    R_i ⊆ A_i drawn uniformly without replacement,  |R_i| = min(r, |A_i|),      Ĝ = {(i, j) : j ∈ R_i},

independently per sentence, head and query. The window and the global tokens of BigBird are the pattern
:func:`~pipeline.predictors.base.predicted_graph` OR-es in (the evaluation sets w and g), so R_i may
overlap them. The reference code confines the draws to the first 2r + 5 tokens; here they range over all
of A_i. Draws come from a generator seeded by (seed, layer), so a batch always gets the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from attention_kernels.attended import valid_pairs
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
class BigBirdPredictor(Predictor):
    """``random_keys`` keys per query, uniform among those it may attend (paper grid r = 2 … 20)."""

    name = "bigbird"
    scope = "batch"
    needs_projections = False
    random_keys: int = 4
    seed: int = 0

    def check(self) -> None:
        positive_int(self.name, "random_keys", self.random_keys)
        positive_int(self.name, "seed", self.seed, least=0)

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        heads = inputs.q.shape[1]
        allowed = valid_pairs(inputs.q_valid, inputs.k_valid, causal=inputs.causal)  # (b, n, m)
        allowed = allowed[:, None].expand(-1, heads, -1, -1)  # (b, h, n, m)
        mask = random_subset(allowed, self.random_keys, layer_generator(self.seed, layer))
        return Prediction(mask=mask)
