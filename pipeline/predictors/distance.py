"""Distance predictor: Ĝ = {(i, j) : ‖q′_i − k′_j‖₂ ≤ t} on projected queries and keys.

Quadratic in the sequence length by nature, but each comparison costs r instead of d operations.
"""

from __future__ import annotations

import torch


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
