"""k-means predictor: every token joins its k nearest of B centroids (fitted offline per layer and head).

With centroids c_1 … c_B of head h,

    f(x) = arg top-k_b ( −‖x − c_b‖² ),      Ĝ = {(i, j) : f(q′_i) ∩ f(k′_j) ≠ ∅}.

Unlike the Routing Transformer (each centroid picks its top tokens), the top-k runs over centroids, so every
query and key lands in exactly k clusters and no query is left without keys to compare with. Equal distances
go to the lower centroid index (stable sort). Queries and keys share one centroid set, so the bucket id is the
centroid index itself. With k ≥ 2 a pair counts when the two share *any* of their k centroids (the reference
code's torch path matches rank by rank instead, a subset of this); "share any" is what the kernel computes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attention_kernels import predictor_maps
from pipeline.clustering.kmeans import fit_centroids
from pipeline.errors import UserError
from pipeline.predictors.base import (
    HeadInputs,
    Prediction,
    Predictor,
    padding_to_none,
    positive_int,
    register,
)


def nearest_centroids(
    x: torch.Tensor, centroids: torch.Tensor, top_k: int, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """int32 (batch, heads, n, top_k) indices of the nearest centroids, nearest first; −1 on padding.

    ``x`` is (batch, heads, n, r), ``centroids`` (heads, B, r), ``valid`` (batch, n) or ``None``. A tie goes
    to the lowest centroid index; a NaN point takes centroids 0 … top_k − 1
    (:func:`attention_kernels.predictor_maps.nearest_centroids`: in C++ on the CPU without gradients, else by
    tensor operations).
    """
    ids = predictor_maps.nearest_centroids(x, centroids, top_k)
    return ids if valid is None else padding_to_none(ids, valid)


def head_points(batches: Iterable[HeadInputs]) -> list[torch.Tensor]:
    """Per head, (N, r) float32 projected queries and keys of every real token of ``batches``."""
    per_head: list[list[torch.Tensor]] = []
    for inputs in batches:
        q_proj, k_proj = inputs.projected()
        if not per_head:
            per_head = [[] for _ in range(q_proj.shape[1])]
        for h, points in enumerate(per_head):
            points += [q_proj[:, h][inputs.q_valid], k_proj[:, h][inputs.k_valid]]
    return [torch.cat(points).detach().float().cpu() for points in per_head]


def fit_head_centroids(
    batches: Iterable[HeadInputs], n_clusters: int, *, knob: str, layer: int, **options: Any
) -> torch.Tensor:
    """float32 (heads, n_clusters, r) centroids of each head's projected training tokens.

    ``options`` go to :func:`~pipeline.clustering.kmeans.fit_centroids`; ``knob`` names the params key in
    the error raised when a head has fewer tokens than clusters.
    """
    centroids = []
    for h, points in enumerate(head_points(batches)):
        if len(points) < n_clusters:
            raise UserError(
                f"{knob} = {n_clusters}: layer {layer} head {h} has only {len(points)} training tokens "
                "to cluster"
            )
        centroids.append(fit_centroids(points.numpy(), n_clusters, **options))
    return torch.from_numpy(np.stack(centroids))


@register
@dataclass(frozen=True)
class KMeansPredictor(Predictor):
    """Top-``top_k`` of ``buckets`` centroids fitted on the training split's projected queries and keys.

    Fitting runs Lloyd's algorithm (faiss, else scikit-learn; see :mod:`pipeline.clustering.kmeans`) for
    ``iterations`` steps on every point of a head unless ``max_points_per_centroid`` caps the sample.
    """

    name = "kmeans"
    fitted = True
    fit_knobs = ("buckets", "iterations", "max_points_per_centroid", "backend")
    buckets: int = 8
    top_k: int = 1
    iterations: int = 25
    max_points_per_centroid: int | None = None
    backend: str = "auto"

    def check(self) -> None:
        positive_int(self.name, "buckets", self.buckets)
        positive_int(self.name, "top_k", self.top_k)
        positive_int(self.name, "iterations", self.iterations)
        if self.max_points_per_centroid is not None:
            positive_int(self.name, "max_points_per_centroid", self.max_points_per_centroid)
        if self.top_k > self.buckets:
            raise UserError(f"kmeans.top_k = {self.top_k} exceeds kmeans.buckets = {self.buckets}")

    def fit_layer(self, layer: int, batches: Iterable[HeadInputs], seed: int) -> dict[str, torch.Tensor]:
        centroids = fit_head_centroids(
            batches,
            self.buckets,
            knob=f"{self.name}.buckets",
            layer=layer,
            seed=seed,
            backend=self.backend,
            n_iter=self.iterations,
            max_points_per_centroid=self.max_points_per_centroid,
        )
        return {"centroids": centroids}

    def layer_state_shapes(
        self, heads: int | None, rank: int | None, head_dim: int | None
    ) -> dict[str, tuple[int | None, ...]]:
        return {"centroids": (heads, self.buckets, rank)}

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        centroids = self.layer_state(layer)["centroids"]
        q_proj, k_proj = inputs.projected()
        return Prediction(
            q_buckets=nearest_centroids(q_proj, centroids, self.top_k, inputs.q_valid),
            k_buckets=nearest_centroids(k_proj, centroids, self.top_k, inputs.k_valid),
        )
