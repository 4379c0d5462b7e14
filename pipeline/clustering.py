"""Offline k-means centroids for the k-means predictor, one set per layer, head and bucket count.

Lloyd's algorithm minimises Σ_x min_b ‖x − c_b‖² over the projected queries and keys of a head (padding
excluded). faiss is used when installed, scikit-learn otherwise; both are seeded, so the same points and
seed give the same centroids. faiss subsamples to ``max_points_per_centroid · B`` points by default (256 per
centroid); here that cap is raised to cover every point unless a cap is asked for explicitly.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

Backend = Literal["auto", "faiss", "sklearn"]


def resolve_backend(backend: Backend) -> Literal["faiss", "sklearn"]:
    """``"auto"`` → faiss when importable, else scikit-learn."""
    if backend == "auto":
        return "faiss" if importlib.util.find_spec("faiss") is not None else "sklearn"
    if backend not in ("faiss", "sklearn"):
        raise ValueError(f"backend must be 'auto', 'faiss' or 'sklearn', got {backend!r}")
    return backend


def fit_centroids(
    points: np.ndarray,
    n_clusters: int,
    *,
    seed: int = 0,
    backend: Backend = "auto",
    n_iter: int = 25,
    n_init: int = 1,
    max_points_per_centroid: int | None = None,
) -> np.ndarray:
    """(n_clusters, r) float32 centroids of ``points`` (N, r) after ``n_iter`` Lloyd iterations.

    ``n_init`` restarts keep the best objective. ``max_points_per_centroid`` (faiss only) caps the
    training sample at that many points per centroid; ``None`` uses every point.
    """
    points = np.ascontiguousarray(points, dtype=np.float32)
    n_points, dim = points.shape
    if n_points < n_clusters:
        raise ValueError(f"cannot fit {n_clusters} centroids to {n_points} points")
    if resolve_backend(backend) == "faiss":
        import faiss

        cap = max_points_per_centroid or math.ceil(n_points / n_clusters)
        kmeans = faiss.Kmeans(
            dim,
            n_clusters,
            niter=n_iter,
            nredo=n_init,
            seed=seed,
            verbose=False,
            max_points_per_centroid=cap,
            # few points per centroid is deliberate for small heads; don't warn about it
            min_points_per_centroid=1,
        )
        kmeans.train(points)
        return np.asarray(kmeans.centroids, dtype=np.float32).reshape(n_clusters, dim)
    from sklearn.cluster import KMeans

    kmeans = KMeans(n_clusters, n_init=n_init, max_iter=n_iter, random_state=seed).fit(points)
    return kmeans.cluster_centers_.astype(np.float32)


def fit_layer_centroids(
    q_proj: torch.Tensor,
    k_proj: torch.Tensor,
    q_valid: torch.Tensor,
    k_valid: torch.Tensor,
    bucket_counts: Sequence[int],
    *,
    seed: int = 0,
    backend: Backend = "auto",
    n_iter: int = 25,
    n_init: int = 1,
    max_points_per_centroid: int | None = None,
) -> dict[int, torch.Tensor]:
    """Centroids of one layer for every bucket count B: ``{B: float32 (heads, B, r)}``.

    Each head is fitted on its projected queries (batch, heads, n, r) and keys (batch, heads, m, r)
    together, keeping only real tokens (``q_valid`` (batch, n), ``k_valid`` (batch, m)).
    """
    per_head = [
        torch.cat([q_proj[:, h][q_valid], k_proj[:, h][k_valid]]).detach().float().cpu().numpy()
        for h in range(q_proj.shape[1])
    ]
    centroids = {}
    for n_clusters in bucket_counts:
        fitted = [
            fit_centroids(
                points,
                n_clusters,
                seed=seed,
                backend=backend,
                n_iter=n_iter,
                n_init=n_init,
                max_points_per_centroid=max_points_per_centroid,
            )
            for points in per_head
        ]
        centroids[n_clusters] = torch.from_numpy(np.stack(fitted))
    return centroids
