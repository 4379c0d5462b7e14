"""Fitting the τ-indexer's low-rank maps A, B (h, r, d) on a graph store's training sentences.

- ``pca`` (training-free): A = B = the top r right-singular vectors of each head's stacked training
  queries and keys, i.e. the top eigenvectors of the Gram matrix Σ x xᵀ over every real query and key.
  Uncentred on purpose: attention scores are dot products, not distances from a mean.
- ``distill``: starting from ``pca``, A and B are trained so that α-entmax of the low-rank scores matches
  the teacher's attention p = α-entmax(s · q·kᵀ), with the Fenchel–Young loss of α-entmax
  (Blondel et al. 2020; Peters et al. 2019) generalised to a probability target y:

      L(z′; y) = ⟨p′ − y, z′⟩ + H_α(p′) − H_α(y),   p′ = α-entmax(z′),   H_α(p) = (1 − Σ p^α) / (α(α − 1)),

  which is ≥ 0, zero exactly when p′ = y, and has gradient p′ − y in z′. The ``entmax`` package's losses take
  class indices only, hence this one. Wherever p′ puts mass outside the teacher's support, the gradient
  lowers those scores; where it misses support keys, it raises them: what the indexer's threshold needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attention_kernels.entmax.dense import entmax_normalize
from pipeline.finite import require_finite
from pipeline.predictors.base import HeadInputs

FITS = ("pca", "distill")


def low_rank(x: Tensor, linear_map: Tensor) -> Tensor:
    """float32 (b, h, n, r) A x for vectors x (b, h, n, d) and a map A (h, r, d) per head."""
    return torch.einsum("bhnd,hrd->bhnr", x.float(), linear_map.float())


def low_rank_scores(q: Tensor, k: Tensor, q_map: Tensor, k_map: Tensor, scaling: float) -> Tensor:
    """(b, h, n, m) z′ = s · (A q)·(B k) for queries (b, h, n, d), keys (b, h, m, d), maps (h, r, d)."""
    return (low_rank(q, q_map) @ low_rank(k, k_map).transpose(-1, -2)) * scaling


def principal_basis(batches: Sequence[HeadInputs], rank: int) -> Tensor:
    """float32 (h, rank, d): per head, the top ``rank`` eigenvectors of Σ x xᵀ over real queries and keys.

    Rows are ordered by eigenvalue, largest first; each row's sign makes its largest-magnitude entry
    positive, so the basis is reproducible (the scores z′ do not depend on the signs).
    """
    gram = None
    for inputs in batches:
        q = inputs.q.double() * inputs.q_valid[:, None, :, None]  # (b, h, n, d), padding zeroed
        k = inputs.k.double() * inputs.k_valid[:, None, :, None]
        batch_gram = torch.einsum("bhnd,bhne->hde", q, q) + torch.einsum("bhmd,bhme->hde", k, k)
        gram = batch_gram if gram is None else gram + batch_gram  # (h, d, d)
    _, vectors = torch.linalg.eigh(gram)  # ascending eigenvalues; vectors in columns
    basis = vectors.flip(-1)[..., :rank].transpose(-1, -2)  # (h, r, d)
    top = basis.abs().argmax(dim=-1, keepdim=True)
    basis = basis * basis.gather(-1, top).sign()
    return basis.float().contiguous()


def tsallis_entropy(p: Tensor, alpha: float) -> Tensor:
    """H_α(p) = (1 − Σ_j p_j^α) / (α(α − 1)) over the last dim."""
    return (1.0 - p.pow(alpha).sum(-1)) / (alpha * (alpha - 1.0))


def entmax_fy_loss(scores: Tensor, target: Tensor, pairs: Tensor, alpha: float) -> Tensor:
    """Mean over rows with any allowed pair of L(z′; y) (module docstring); ``scores`` (b, h, n, m) carry the
    gradient, ``target`` rows are distributions over ``pairs`` (b, 1 | h, n, m)."""
    pairs = pairs.expand_as(scores)
    with torch.no_grad():  # Danskin: the gradient of max_p ⟨p, z⟩ + H(p) is its argmax p′
        probs = entmax_normalize(scores.masked_fill(~pairs, float("-inf")), alpha)
    z = scores.masked_fill(~pairs, 0.0)
    rows = ((probs - target) * z).sum(-1) + tsallis_entropy(probs, alpha) - tsallis_entropy(target, alpha)
    return rows[pairs.any(-1)].mean()


def teacher_probabilities(inputs: HeadInputs, alpha: float) -> Tensor:
    """(b, h, n, m) the teacher's attention α-entmax(s · q·kᵀ) over the allowed pairs."""
    scores = (inputs.q.float() @ inputs.k.float().transpose(-1, -2)) * inputs.score_scale()
    return entmax_normalize(scores.masked_fill(~inputs.pairs(), float("-inf")), alpha)


def indexer_loss(batches: Sequence[HeadInputs], q_map: Tensor, k_map: Tensor, alpha: float) -> float:
    """Mean Fenchel–Young loss of the maps over ``batches`` (rows weighted equally within a batch)."""
    with torch.no_grad():
        losses = [
            entmax_fy_loss(
                low_rank_scores(b.q, b.k, q_map, k_map, b.score_scale()),
                teacher_probabilities(b, alpha),
                b.pairs(),
                alpha,
            )
            for b in batches
        ]
    return float(torch.stack(losses).mean())


def distill_maps(
    batches: Sequence[HeadInputs],
    q_map: Tensor,
    k_map: Tensor,
    *,
    alpha: float,
    epochs: int,
    lr: float,
    seed: int,
) -> tuple[Tensor, Tensor, list[float]]:
    """Train copies of the maps (h, r, d) with Adam on the Fenchel–Young loss, batches in a seeded order.

    Returns the trained maps and the mean training loss of each epoch.
    """
    q_map = q_map.detach().clone().float().requires_grad_(True)
    k_map = k_map.detach().clone().float().requires_grad_(True)
    targets = [teacher_probabilities(b, alpha) for b in batches]
    optimizer = torch.optim.Adam([q_map, k_map], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for epoch in range(epochs):
        total = 0.0
        for position, i in enumerate(torch.randperm(len(batches), generator=generator).tolist()):
            inputs = batches[i]
            scores = low_rank_scores(inputs.q, inputs.k, q_map, k_map, inputs.score_scale())
            loss = entmax_fy_loss(scores, targets[i], inputs.pairs(), alpha)
            optimizer.zero_grad()
            step = epoch * len(batches) + position
            total += require_finite(float(loss.detach()), "cluster: the indexer's distillation loss", step)
            loss.backward()
            optimizer.step()
        losses.append(total / len(batches))
    return q_map.detach(), k_map.detach(), losses
