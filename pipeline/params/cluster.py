"""The ``cluster`` section: the fitted predictors (k-means, the τ-indexer, Routing, Reformer)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from pipeline.params.base import Centroids, Examples, PositiveInt, Rank, Section, Seed, Steps


def _even(value: int) -> int:
    if value % 2:
        raise ValueError("Reformer's bucket count must be even (argmax over [xR; −xR])")
    return value


EvenBuckets = Annotated[Centroids, AfterValidator(_even)]


class IndexerFits(Section):
    """The τ-indexer states fitted next to the centroids: every rank × fitting (empty lists: none)."""

    ranks: list[Rank] = [2, 4, 8, 16]
    fittings: list[Literal["pca", "distill"]] = ["pca", "distill"]
    # distillation (Adam on the entmax Fenchel–Young loss, starting from the PCA maps)
    epochs: Steps = 3
    lr: Annotated[float, Field(gt=0.0)] = 0.01


class Cluster(Section):
    graphs: str = "artifacts/graphs/train"
    projections: str = "artifacts/predictors/projections.safetensors"
    bucket_counts: Annotated[list[Centroids], Field(min_length=1)] = [
        2,
        4,
        6,
        8,
        10,
        12,
        16,
        20,
    ]
    top_k: PositiveInt = 1
    backend: Literal["auto", "faiss", "sklearn"] = "auto"
    iterations: Steps = 25
    max_points_per_centroid: Examples | None = None
    # the fitted baselines, in the same state file: Routing's spherical centroids, Reformer's rotations
    routing_clusters: list[Centroids] = [2, 4, 8]
    reformer_buckets: list[EvenBuckets] = [2, 4, 8]
    indexer: IndexerFits = IndexerFits()
    seed: Seed = 0
    out: str = "artifacts/predictors/state.safetensors"
    metrics: str = "artifacts/metrics/cluster.json"

    @model_validator(mode="after")
    def _top_k_fits(self) -> Cluster:
        if self.top_k > min(self.bucket_counts):
            raise ValueError(
                f"top_k {self.top_k} exceeds the smallest bucket count {min(self.bucket_counts)}"
            )
        return self
