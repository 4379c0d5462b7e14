"""Differentiable top-k without replacement (SAMSA, Lenhat et al. 2024, § 4.2): a hard forward, the
gradient of a soft proxy (straight-through).

For a pool of P items x (d-dimensional) with scores s, rank the pool by s; the top k are selected, the next
k compete. The forward returns exactly the selected items. The backward is that of the proxy, for selected
item i and competitors j:

    p_ij = σ((s_i − s_j) / τ),   proxy_i = mean_j [p_ij x_i + (1 − p_ij) x_j]
                                         = mean_j(p_ij) x_i + Σ_j (1 − p_ij)/k · x_j    (k competitors)

so an item gains score by beating its competitors where that helps the loss, and a competitor gains score
where it would have helped instead. Items with score −inf are absent: never a competitor, and a selected
one (a pool of fewer than k finite scores) gets no proxy gradient. With no competitor at all (a pool of at
most k items) every item is selected and passes its gradient through unchanged.

Several queries may each rank their own view of one pool: ``items`` (..., P, d) is shared, ``scores``
(..., Q, P) and the indices (..., Q, ·) are per query (Q = 1: one ranking for all).
"""

from __future__ import annotations

import torch
from torch import Tensor


def top_k_split(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Indices of the top min(k, P) scores (selected) and of the next min(k, P − k) (competing) along the
    last dimension of ``scores`` (..., P), each in descending order of score."""
    ranked = scores.topk(min(2 * k, scores.shape[-1]), dim=-1, sorted=True).indices
    return ranked[..., :k], ranked[..., k:]


def gather_items(items: Tensor, index: Tensor) -> Tensor:
    """Items (..., P, d) at ``index`` (..., Q, K): (..., Q, K, d)."""
    flat = index.flatten(-2)  # (..., Q·K)
    picked = torch.gather(items, -2, flat[..., None].expand(*flat.shape, items.shape[-1]))
    return picked.unflatten(-2, index.shape[-2:])


def soft_proxy(
    items: Tensor, scores: Tensor, selected: Tensor, competing: Tensor, temperature: float
) -> Tensor:
    """The soft proxy (..., Q, k, d) of the selected items (see the module docstring).

    ``items`` (..., P, d); ``scores`` (..., Q, P); ``selected`` (..., Q, k) and ``competing`` (..., Q, c)
    index the pool. Smooth in items and scores wherever the scores are finite.
    """
    chosen, rivals = scores.gather(-1, selected), scores.gather(-1, competing)  # (..., Q, k), (..., Q, c)
    chosen_ok, rivals_ok = chosen.isfinite(), rivals.isfinite()
    chosen, rivals = chosen.masked_fill(~chosen_ok, 0.0), rivals.masked_fill(~rivals_ok, 0.0)
    present = (chosen_ok[..., :, None] & rivals_ok[..., None, :]).to(items.dtype)  # (..., Q, k, c)
    wins = torch.sigmoid((chosen[..., :, None] - rivals[..., None, :]) / temperature)  # p_ij (..., Q, k, c)
    count = present.sum(-1)  # (..., Q, k) competitors of each selected item
    stay = torch.where(count > 0, (wins * present).sum(-1) / count.clamp(min=1), 1.0)  # mean_j p_ij
    swap = (1 - wins) * present / count.clamp(min=1)[..., None]  # (1 − p_ij) / c
    return stay[..., None] * gather_items(items, selected) + swap @ gather_items(items, competing)


def straight_through_pick(
    items: Tensor, scores: Tensor, selected: Tensor, competing: Tensor, temperature: float
) -> Tensor:
    """The selected items (..., Q, k, d), exactly, with the gradient of :func:`soft_proxy` (shapes there).

    Without autograd (no_grad, inference) only the selected items are gathered.
    """
    hard = gather_items(items, selected)
    if not torch.is_grad_enabled():
        return hard
    proxy = soft_proxy(items, scores, selected, competing, temperature)
    return hard.detach() + (proxy - proxy.detach())
