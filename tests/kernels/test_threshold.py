"""The one α-entmax threshold solver: its τ reproduces the sort/bisection normaliser's, on dense rows and on
rows spread over blocks as the bucketed path holds them."""

from __future__ import annotations

import pytest
import torch

from attention_kernels.bucketed.torch_path import _newton_threshold, _SpreadRows
from attention_kernels.entmax.dense import entmax_normalize
from attention_kernels.entmax.threshold import (
    entmax_threshold,
    exact_support_step,
    newton_threshold,
    threshold_from_probabilities,
)


def rows(seed: int = 0) -> torch.Tensor:
    """(6, 40) float64 scores, −inf on a few keys, one row with no key at all."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(6, 40, generator=gen, dtype=torch.float64) * 3
    scores[1, 5:] = float("-inf")
    scores[4] = float("-inf")
    return scores


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
def test_newton_threshold_gives_the_normaliser_s_probabilities(alpha):
    scores = rows()
    tau, top = entmax_threshold(scores * (alpha - 1.0), None, alpha)  # τ − max, max
    live = torch.isfinite(tau)
    assert live.tolist() == [True, True, True, True, False, True]
    x = (alpha - 1.0) * scores[live] - (tau + top)[live][:, None]
    probs = x.clamp_min(0) ** (1.0 / (alpha - 1.0))
    torch.testing.assert_close(probs, entmax_normalize(scores[live], alpha), atol=1e-10, rtol=0)
    expected = threshold_from_probabilities(scores[live], alpha).squeeze(-1)
    torch.testing.assert_close((tau + top)[live], expected, atol=1e-9, rtol=0)


def test_exact_support_step_solves_alpha_1_5_on_the_right_support():
    """From any τ with τ*'s support, the quadratic on that support gives τ* itself."""
    y = torch.tensor([[0.0, -0.3, -0.5, -2.0]], dtype=torch.float64)  # entmax15 support: the first three
    # Σ_{j≤3} (y_j − τ)² = 1  ⇒  3τ² + 1.6τ + 0.34 − 1 = 0, the root below −0.5
    truth = (-1.6 - (1.6**2 + 4 * 3 * 0.66) ** 0.5) / 6
    start = torch.tensor([truth + 0.01], dtype=torch.float64)  # not τ*, same support
    tau = exact_support_step(y, start, 2.0, torch.empty_like(y))
    torch.testing.assert_close(tau, torch.tensor([truth], dtype=torch.float64), atol=1e-14, rtol=0)


def test_the_solver_keeps_its_bracket_and_respects_done_rows():
    """A row marked done never moves; the others converge to F(τ) = 1 (α = 2, sparsemax: Σ (y − τ)₊ = 1)."""
    y = torch.tensor([[0.0, -0.2, -0.4], [0.0, -5.0, -5.0]], dtype=torch.float64)

    def mass_and_slope(tau):
        d = (y - tau[:, None]).clamp_min(0)
        return d.sum(-1), (d > 0).to(y.dtype).sum(-1)

    lo, hi = torch.full((2,), -1.0, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    done = torch.tensor([False, True])
    tau = newton_threshold(mass_and_slope, lo.clone(), lo, hi, 1.0, 1e-15, done=done)
    torch.testing.assert_close(
        tau[0], torch.tensor(-1.6 / 3, dtype=torch.float64), atol=1e-12, rtol=0
    )  # −0.6 − 3τ = 1
    assert tau[1] == -1.0


@pytest.mark.parametrize("alpha", [1.25, 1.7])
def test_bucketed_rows_spread_over_blocks_get_the_dense_threshold(alpha):
    """The bucketed path's rows (a query's keys in two parts) and the dense rows share the solver's answer."""
    scores = rows(1)[[0, 2, 3, 5]]  # four queries with keys
    x = (alpha - 1.0) * (scores - scores.amax(-1, keepdim=True))  # x − max, as the path gives it
    parts = [x[:, :25].contiguous(), x[:, 25:].contiguous()]  # (4, 25), (4, 15)
    owners = [torch.arange(4), torch.arange(4)]
    count = torch.full((4,), 40.0, dtype=torch.float64)
    spread = _newton_threshold(parts, [0.0, 0.0], count, alpha, _SpreadRows(owners, 4))
    dense, _ = entmax_threshold(x.clone(), None, alpha)
    torch.testing.assert_close(spread, dense, atol=1e-12, rtol=0)
