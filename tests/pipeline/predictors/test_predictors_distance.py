"""Distance predictor against ‖q′_i − k′_j‖₂ ≤ t evaluated pair by pair."""

import math

import torch

from pipeline.predictors.distance import distance_mask


def test_distance_matches_loops():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 6, 4, generator=gen)
    k = torch.randn(2, 3, 5, 4, generator=gen)
    for t in (0.5, 1.0, 2.5):
        mask = distance_mask(q, k, t)
        assert mask.shape == (2, 3, 6, 5)
        for b in range(2):
            for h in range(3):
                for i in range(6):
                    for j in range(5):
                        d = math.dist(q[b, h, i].tolist(), k[b, h, j].tolist())
                        assert mask[b, h, i, j].item() == (d <= t)


def test_distance_threshold_is_inclusive():
    # ‖(0, 0) − (3, 4)‖ = 5 exactly; the expanded form ‖q‖² + ‖k‖² − 2q·k could round either way
    q = torch.tensor([[[[0.0, 0.0]]]])
    k = torch.tensor([[[[3.0, 4.0], [3.0, 4.001]]]])
    assert distance_mask(q, k, 5.0).tolist() == [[[[True, False]]]]
