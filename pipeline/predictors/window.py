"""Window baseline: the predictor predicts no pair, Ĝ = (∅ ∪ W ∪ G) ∩ C ∩ V.

Everything comes from the pattern :func:`~pipeline.predictors.base.predicted_graph` OR-es in: the band
W = {(i, j) : |i − j| ≤ ⌊w/2⌋} and the first g rows and columns (:mod:`attention_kernels.attended`). Scored
with w = 0 and g = 0 it predicts nothing; swept over w it is the window baseline, a hard one to beat.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.predictors.base import HeadInputs, Prediction, Predictor, register


@register
@dataclass(frozen=True)
class WindowPredictor(Predictor):
    """No learned pairs: the window and global pattern alone."""

    name = "window"
    needs_projections = False

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        b, n, m = inputs.q.shape[0], inputs.q.shape[2], inputs.k.shape[2]
        # one head row broadcasts over every head
        return Prediction(mask=torch.zeros(b, 1, n, m, dtype=torch.bool, device=inputs.q.device))
