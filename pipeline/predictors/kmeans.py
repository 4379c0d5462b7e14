"""k-means predictor: every token joins its k nearest of B centroids (fitted offline per layer and head).

With centroids c_1 … c_B of head h,

    f(x) = arg top-k_b ( −‖x − c_b‖² ),      Ĝ = {(i, j) : f(q′_i) ∩ f(k′_j) ≠ ∅}.

Unlike the Routing Transformer (each centroid picks its top tokens), the top-k runs over centroids, so every
query and key lands in exactly k clusters and no query is left without keys to compare with. Equal distances
go to the lower centroid index (stable sort). Queries and keys share one centroid set, so the bucket id is the
centroid index itself.
"""

from __future__ import annotations

import torch

from pipeline.predictors.buckets import buckets_to_mask


def nearest_centroids(
    x: torch.Tensor, centroids: torch.Tensor, top_k: int, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """int32 (batch, heads, n, top_k) indices of the nearest centroids, nearest first; −1 on padding.

    ``x`` is (batch, heads, n, r), ``centroids`` (heads, B, r), ``valid`` (batch, n) or ``None``.
    """
    n_centroids = centroids.shape[-2]
    if not 1 <= top_k <= n_centroids:
        raise ValueError(f"top_k must be in [1, {n_centroids}], got {top_k}")
    # (b, h, n, 1, r) − (1, h, 1, B, r) -> (b, h, n, B); explicit differences keep ties exact
    dist = (x[..., :, None, :] - centroids[None, :, None, :, :].to(x.dtype)).square().sum(-1)
    ids = dist.argsort(dim=-1, stable=True)[..., :top_k].to(torch.int32)
    if valid is not None:
        ids = ids.masked_fill(~valid[:, None, :, None], -1)
    return ids


def kmeans_buckets(
    q_proj: torch.Tensor,
    k_proj: torch.Tensor,
    centroids: torch.Tensor,
    top_k: int,
    q_valid: torch.Tensor | None = None,
    k_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel bucket ids: int32 (batch, heads, n, top_k) for queries and (batch, heads, m, top_k) for keys."""
    return (
        nearest_centroids(q_proj, centroids, top_k, q_valid),
        nearest_centroids(k_proj, centroids, top_k, k_valid),
    )


def kmeans_mask(
    q_proj: torch.Tensor,
    k_proj: torch.Tensor,
    centroids: torch.Tensor,
    top_k: int,
    q_valid: torch.Tensor | None = None,
    k_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """(batch, heads, n, m) mask of pairs sharing one of their top-k centroids (padding shares nothing)."""
    return buckets_to_mask(*kmeans_buckets(q_proj, k_proj, centroids, top_k, q_valid, k_valid))
