"""The α-entmax Jacobian's weights: for p = α-entmax(s), ∂p/∂s = diag(g) − g gᵀ / Σ g with g = p^{2−α}.

So a backward pass is ds = g·(dp − r), r = Σ g·dp / Σ g per query: the only α-specific part is g, which
:func:`entmax_gradient_weight` computes without touching the zeros off the support.
"""

from __future__ import annotations

import torch


def support_power(x: torch.Tensor, exponent: float) -> torch.Tensor:
    """x^e where x > 0 and 0 elsewhere, for x ≥ 0 (a new tensor): 0^e would be 1, or ∞ for e < 0."""
    return torch.where(x > 0, x, 1.0).pow_(exponent).masked_fill_(x <= 0, 0)


def entmax_gradient_weight(probs: torch.Tensor, alpha: float) -> torch.Tensor:
    """g = p^{2−α} of α-entmax probabilities p, elementwise: p itself for softmax (the same tensor, not a
    copy), the support's indicator for sparsemax, 0 off the support. The Jacobian of p = α-entmax(s) is
    diag(g) − g gᵀ / Σ g.

    For α = 1.5, √p is taken as p · (max(p, tiny))^{−1/2}: exactly 0 off the support, within two ulps of
    √p on it (below the smallest normal float, where p is negligible, smaller), and several times faster
    than ``sqrt`` on CPU over mostly-zero tensors, whose zeros take a slow path in the square root."""
    if alpha == 1.0:
        return probs
    if alpha == 2.0:
        return (probs > 0).to(probs.dtype)
    if alpha == 1.5:
        return probs.clamp_min(torch.finfo(probs.dtype).tiny).rsqrt_().mul_(probs)
    return support_power(probs, 2.0 - alpha)
