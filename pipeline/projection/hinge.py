"""Contrastive hinge loss that pulls gold query–key pairs together in the projected space.

For query i of a (sentence, head), with positives P_i = {j : (i, j) ∈ G} and negatives N_i drawn uniformly
without replacement from the candidates C_i = {j valid, j ∉ P_i, and j ≤ i when causal}:

    ℓ_i = relu( ω + Σ_{j∈P_i} ‖q′_i − k′_j‖² − Σ_{j∈N_i} ‖q′_i − k′_j‖² ),    |N_i| = min(|P_i|, |C_i|).

A causal query never draws a future key: it could never attend one, so pushing it away teaches nothing.
When fewer candidates than positives exist (e.g. the first tokens of a causal sentence), all candidates are
used and the sums are left unbalanced, as they are. The loss averages ℓ_i over the queries with at least one
positive (a query without positives contributes the constant ω and no gradient), then over the (sentence,
head) cells that have such a query.

The sums of squared distances never materialise an (n, m, r) tensor: with S the signed selection
(+1 on P_i, −1 on N_i),

    Σ_j S_ij ‖q_i − k_j‖² = (Σ_j S_ij) ‖q_i‖² − 2 q_i · (S k)_i + (S ‖k‖²)_i.
"""

from __future__ import annotations

import torch

from attention_kernels.attended import valid_pairs


def sample_negatives(
    positives: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(batch, heads, n, m) mask of min(|P_i|, |C_i|) keys per row drawn uniformly from ``candidates``.

    ``positives`` and ``candidates`` are boolean and broadcast to (batch, heads, n, m); the two must be
    disjoint. Every candidate gets a uniform score in [0, 1) (non-candidates −1); the |P_i| best scored
    keys of a row, kept only where they are candidates, are a uniform sample without replacement.
    """
    positives, candidates = torch.broadcast_tensors(positives, candidates)
    n_pos = positives.sum(-1, keepdim=True)  # (b, h, n, 1)
    k_max = int(n_pos.max()) if n_pos.numel() else 0
    if k_max == 0:
        return torch.zeros_like(candidates)
    scores = torch.rand(candidates.shape, generator=generator, device=candidates.device)
    scores = scores.masked_fill(~candidates, -1.0)
    top = scores.topk(k_max, dim=-1).indices  # (b, h, n, k_max), best first
    take = torch.arange(k_max, device=top.device) < n_pos  # rank < |P_i|
    return torch.zeros_like(candidates).scatter(-1, top, take) & candidates


def selected_squared_distances(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(batch, heads, n): Σ_j w_ij ‖q_i − k_j‖² for q (b, h, n, r), k (b, h, m, r), weights (b, h, n, m)."""
    k_sq = k.square().sum(-1, keepdim=True)  # (b, h, m, 1)
    return (
        weights.sum(-1) * q.square().sum(-1) - 2 * (q * (weights @ k)).sum(-1) + (weights @ k_sq).squeeze(-1)
    )


def hinge_losses(
    q_proj: torch.Tensor,
    k_proj: torch.Tensor,
    gold: torch.Tensor,
    q_valid: torch.Tensor,
    k_valid: torch.Tensor,
    *,
    causal: bool,
    generator: torch.Generator | None = None,
    omega: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (sentence, head) mean loss (batch, heads) and whether the cell has a query with a positive.

    ``q_proj`` (batch, heads, n, r), ``k_proj`` (batch, heads, m, r), ``gold`` (batch, heads, n, m) bool,
    ``q_valid`` (batch, n), ``k_valid`` (batch, m). Cells without such a query hold 0.
    """
    allowed = valid_pairs(q_valid, k_valid, causal=causal)[:, None]  # (b, 1, n, m)
    pos = gold & allowed
    neg = sample_negatives(pos, allowed & ~pos, generator)
    weights = pos.to(q_proj.dtype) - neg.to(q_proj.dtype)
    per_query = torch.relu(omega + selected_squared_distances(q_proj, k_proj, weights))  # (b, h, n)
    counted = pos.any(-1)  # (b, h, n)
    n_counted = counted.sum(-1)  # (b, h)
    per_cell = (per_query * counted).sum(-1) / n_counted.clamp_min(1)
    return per_cell, n_counted > 0


def hinge_loss(
    q_proj: torch.Tensor,
    k_proj: torch.Tensor,
    gold: torch.Tensor,
    q_valid: torch.Tensor,
    k_valid: torch.Tensor,
    *,
    causal: bool,
    generator: torch.Generator | None = None,
    omega: float = 1.0,
) -> torch.Tensor:
    """Scalar loss: mean over queries with a positive, then over (sentence, head) cells; see the module."""
    per_cell, counted = hinge_losses(
        q_proj, k_proj, gold, q_valid, k_valid, causal=causal, generator=generator, omega=omega
    )
    return (per_cell * counted).sum() / counted.sum().clamp_min(1)
