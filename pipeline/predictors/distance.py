"""Distance predictor: Ĝ = {(i, j) : ‖q′_i − k′_j‖₂ ≤ t} on projected queries and keys.

Quadratic in the sequence length by nature, but each comparison costs r instead of d operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.errors import UserError
from pipeline.predictors.base import HeadInputs, Prediction, Predictor, register


def pairwise_distances(q_proj: torch.Tensor, k_proj: torch.Tensor) -> torch.Tensor:
    """(batch, heads, n, m) Euclidean distances between (batch, heads, n, r) and (batch, heads, m, r) points.

    Computed from explicit differences rather than ‖q‖² + ‖k‖² − 2 q·k, so a pair sitting exactly on the
    threshold is classified the same way as by a direct evaluation of the definition.
    """
    *lead, n, r = q_proj.shape
    m = k_proj.shape[-2]
    dist = torch.cdist(
        q_proj.reshape(-1, n, r), k_proj.reshape(-1, m, r), compute_mode="donot_use_mm_for_euclid_dist"
    )
    return dist.reshape(*lead, n, m)


def distance_mask(q_proj: torch.Tensor, k_proj: torch.Tensor, threshold: float) -> torch.Tensor:
    """(batch, heads, n, m) boolean mask [‖q′_i − k′_j‖₂ ≤ threshold]."""
    return pairwise_distances(q_proj, k_proj) <= threshold


@register
@dataclass(frozen=True)
class DistancePredictor(Predictor):
    """Ĝ = {‖q′_i − k′_j‖₂ ≤ threshold}: a mask (the only learned predictor that is not buckets)."""

    name = "distance"
    threshold: float = 1.0

    def check(self) -> None:
        if (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, int | float)
            or not self.threshold >= 0  # NaN too
        ):
            raise UserError(f"distance.threshold must be a number >= 0; got {self.threshold!r}")

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        return Prediction(mask=distance_mask(*inputs.projected(), self.threshold))
