"""Offline k-means centroids (Lloyd's algorithm) for the predictors that cluster projected queries and keys.

Lloyd's algorithm minimises Σ_x min_b ‖x − c_b‖² over the projected queries and keys of a head (padding
excluded). faiss is used when installed, scikit-learn otherwise; both are seeded, so the same points and
seed give the same centroids. faiss subsamples to ``max_points_per_centroid · B`` points by default (256 per
centroid); here that cap is raised to cover every point unless a cap is asked for explicitly.

Spherical k-means (``spherical=True``) clusters directions: the points are L2-normalised and the centroids
kept on the unit sphere, so a point joins the centroid of largest cosine similarity, max_b x̂·c_b. faiss
renormalises the centroids after every iteration; scikit-learn has no such mode, so there Lloyd's algorithm
runs on the normalised points and only the final centroids are normalised (close to, not the same as, faiss).
"""

from __future__ import annotations

import importlib.util
import math
from typing import Literal

import numpy as np

from pipeline.errors import UserError

Backend = Literal["auto", "faiss", "sklearn"]
# fewer points per centroid fit noise (faiss warns below 39), and far more centroids than that run for long
MIN_POINTS_PER_CENTROID = 39


def resolve_backend(backend: Backend) -> Literal["faiss", "sklearn"]:
    """``"auto"`` → faiss when importable, else scikit-learn."""
    if backend == "auto":
        return "faiss" if importlib.util.find_spec("faiss") is not None else "sklearn"
    if backend not in ("faiss", "sklearn"):
        raise ValueError(f"backend must be 'auto', 'faiss' or 'sklearn', got {backend!r}")
    if backend == "faiss" and importlib.util.find_spec("faiss") is None:
        raise UserError("cluster.backend = 'faiss': faiss is not installed; allowed here: 'auto', 'sklearn'")
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
    spherical: bool = False,
) -> np.ndarray:
    """(n_clusters, r) float32 centroids of ``points`` (N, r) after ``n_iter`` Lloyd iterations.

    ``n_init`` restarts keep the best objective. ``max_points_per_centroid`` (faiss only) caps the
    training sample at that many points per centroid; ``None`` uses every point. ``spherical`` fits unit
    centroids to the L2-normalised points (see the module docstring).
    """
    points = np.ascontiguousarray(points, dtype=np.float32)
    if spherical:
        points = unit_rows(points)
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
            spherical=spherical,
        )
        kmeans.train(points)
        centroids = np.asarray(kmeans.centroids, dtype=np.float32).reshape(n_clusters, dim)
    else:
        from sklearn.cluster import KMeans

        kmeans = KMeans(n_clusters, n_init=n_init, max_iter=n_iter, random_state=seed).fit(points)
        centroids = kmeans.cluster_centers_.astype(np.float32)
    return unit_rows(centroids) if spherical else centroids


def unit_rows(x: np.ndarray) -> np.ndarray:
    """``x`` (N, r) with every row scaled to unit L2 norm (zero rows stay zero)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), np.finfo(x.dtype).tiny)
