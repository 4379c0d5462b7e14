"""The α-entmax threshold τ: the one safeguarded Newton solver both attention paths use.

For rows x = (α − 1)·scores (−inf off the attended set) and β = 1/(α − 1),

    F(τ) = Σ_j [x_j − τ]₊^β,   α-entmax(x) = [x − τ*]₊^β  with  F(τ*) = 1.

F decreases in τ; with y = x − max x, τ* ∈ [−1, 0) (the maximum alone contributes F(−1) ≥ 1). Newton's
method runs on h(τ) = F(τ)^{1/β} − 1, a norm of (y − τ)₊ and so convex for α ≤ 2: a step from below never
overshoots and a step from above lands below. Its step from τ is

    τ₁ = τ + β (F − F^{1 − 1/β}) / (−F′(τ)).

:func:`newton_threshold` keeps a bracket [lo, hi] around τ* and bisects whenever the step would leave it,
so it converges for every α > 1 and every row; callers give F and −F′ as a function of τ (dense rows here,
rows spread over several blocks in :mod:`attention_kernels.bucketed.torch_path`). For α = 1.5 and α = 2,
Newton only has to find the support: on it, F(τ) = 1 is a quadratic or linear equation that
:func:`exact_support_step` solves exactly, which is the sort-based value.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attention_kernels.entmax.dense import entmax_normalize

MAX_NEWTON_STEPS = 100
"""Bisection alone halves the unit bracket each step; 100 steps exhaust float64."""

MassAndSlope = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""τ (…) ↦ (F(τ), −F′(τ)) per row."""


def newton_threshold(
    mass_and_slope: MassAndSlope,
    tau: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    beta: float,
    tol: float,
    done: torch.Tensor | None = None,
) -> torch.Tensor:
    """τ (…) with F(τ) = 1 per row, by Newton steps on h = F^{1/β} − 1 safeguarded by bisection.

    ``tau`` is the starting point inside the bracket [lo, hi] (F(lo) ≥ 1 > F(hi)); a row settles when its
    step or its bracket is within ``tol``, and then keeps its τ. ``done`` (…) marks rows that are settled
    from the start (rows with no key, say). A row with no slope gets a step that is not finite and is
    bisected instead.
    """
    for _ in range(MAX_NEWTON_STEPS):
        mass, slope = mass_and_slope(tau)
        lo = torch.where(mass >= 1, tau, lo)
        hi = torch.where(mass < 1, tau, hi)
        newton = tau + beta * (mass - mass.pow(1.0 - 1.0 / beta)) / slope
        settled = ((newton - tau).abs() <= tol) | (hi - lo <= tol)
        if done is not None:
            settled |= done
        inside = (newton > lo) & (newton < hi)  # a step onto the bracket's end could cycle: bisect instead
        tau = torch.where(settled, tau, torch.where(inside, newton, 0.5 * (lo + hi)))
        if bool(settled.all()):
            break
    return tau


def newton_step(tau: torch.Tensor, mass: torch.Tensor, slope: torch.Tensor, beta: float) -> torch.Tensor:
    """One Newton step on h(τ) = F(τ)^{1/β} − 1 from τ, given F(τ) and −F′(τ) (:func:`mass_and_slope`); a
    row with no entry above τ has no slope and takes it as 1 (a finite step, where a solve would bisect)."""
    return tau + beta * (mass - mass.pow(1.0 - 1.0 / beta)) / slope.masked_fill(slope == 0, 1.0)


def count_positive(diff: torch.Tensor) -> torch.Tensor:
    """Number of positive entries per row of diff (…, L) ≥ 0, in diff's dtype (sign is 0 or 1 there):
    one pass, where ``count_nonzero`` would first copy a bool tensor to int64."""
    return torch.sign(diff).sum(-1)


def mass_and_slope(
    y: torch.Tensor, tau: torch.Tensor, beta: float, diff: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """F(τ) = Σ [y − τ]₊^β and −F′(τ) per row of y (…, L); ``diff`` is a scratch buffer of y's shape."""
    torch.sub(y, tau[..., None], out=diff).clamp_min_(0)
    if beta == 1.0:
        return diff.sum(-1), count_positive(diff)
    if beta == 2.0:
        slope = 2.0 * diff.sum(-1)
        return diff.square_().sum(-1), slope
    active = diff > 0
    mass = diff.pow(beta).sum(-1)
    slope = beta * torch.where(active, diff, 1.0).pow(beta - 1.0).masked_fill(~active, 0).sum(-1)
    return mass, slope


def exact_support_step(y: torch.Tensor, tau: torch.Tensor, beta: float, diff: torch.Tensor) -> torch.Tensor:
    """τ* (…) solved exactly on the support {y > τ} for β = 1 (α = 2) or β = 2 (α = 1.5).

    With u = y − τ > 0 on the support, Σ (u − δ) = 1 or Σ (u − δ)² = 1 gives δ; the smaller root is written
    so that a small δ has no cancellation. Exact when τ already has τ*'s support. ``diff``: scratch (…, L).
    """
    torch.sub(y, tau[..., None], out=diff).clamp_min_(0)
    count = count_positive(diff).clamp_min_(1)
    s1 = diff.sum(-1)
    if beta == 1.0:
        return tau + (s1 - 1.0) / count
    f = diff.square_().sum(-1) - 1.0
    root = (s1 * s1 - count * f).clamp_min(0).sqrt()
    return tau + f / (s1 + root).masked_fill(s1 + root == 0, 1.0)


def entmax_threshold(
    x: torch.Tensor, guess: torch.Tensor | None, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(τ − max, max) per row of x = (α − 1)·scores (…, L), −inf on masked entries.

    ``guess`` (…) is a starting point (any value, e.g. the threshold of a similar row): a close one saves
    Newton steps. x is shifted in place by its row maximum; τ comes back in those shifted units (add the
    returned row maxima (…) for τ itself), +inf on rows with no finite entry. For α = 1.5 and α = 2 Newton
    stops at 10⁻³ (its next, quadratic, step far below any gap between scores), takes that step, and
    :func:`exact_support_step` finishes on the support; otherwise it runs to the dtype's resolution.
    """
    beta = 1.0 / (alpha - 1.0)
    top = x.amax(-1)  # (…)
    empty = torch.isneginf(top)
    top = top.masked_fill_(empty, 0.0)
    y = x.sub_(top[..., None])  # (…, L) ≤ 0 or −inf
    lo = torch.full_like(top, -1.0)  # F(−1) ≥ 1: the maximum alone contributes 1
    hi = torch.zeros_like(top)  # F(0) = 0 < 1
    tau = lo if guess is None else (guess - top).nan_to_num_(nan=-1.0).clamp_(-1.0, 0.0)
    exact_step = beta in (1.0, 2.0)
    tol = 1e-3 if exact_step else 4 * torch.finfo(x.dtype).eps
    diff = torch.empty_like(y)
    tau = newton_threshold(lambda t: mass_and_slope(y, t, beta, diff), tau, lo, hi, beta, tol, done=empty)
    if exact_step:
        tau = newton_step(tau, *mass_and_slope(y, tau, beta, diff), beta)
        tau = exact_support_step(y, tau, beta, diff)
    return tau.masked_fill_(empty, float("inf")), top


def threshold_from_probabilities(
    scores: torch.Tensor, alpha: float, probs: torch.Tensor | None = None
) -> torch.Tensor:
    """(…, 1) τ of α-entmax over the last dim of ``scores`` (−inf marks excluded keys; −inf for a row with
    none), so that p_j = [(α − 1) z_j − τ]₊^{1/(α−1)}.

    The probabilities come from the dense normaliser (:func:`attention_kernels.entmax.dense.entmax_normalize`:
    sort for α = 1.5 and 2, bisection otherwise), or are ``probs`` where the caller already has them; τ is
    read off the row's top key, which is always in the support: τ = (α − 1) z_max − p_max^{α−1}.
    """
    if probs is None:
        probs = entmax_normalize(scores, alpha)
    top_score, top = scores.max(dim=-1, keepdim=True)
    tau = (alpha - 1.0) * top_score - probs.gather(-1, top).pow(alpha - 1.0)
    return tau.masked_fill(torch.isneginf(top_score), float("-inf"))
