"""Sparsefinder predictors: from projected queries and keys to a predicted attention graph Ĝ ≈ G.

- :mod:`~pipeline.predictors.distance`: Ĝ = {‖q′_i − k′_j‖₂ ≤ t} (boolean mask, quadratic).
- :mod:`~pipeline.predictors.quantization`: equal-size bins per projected dimension (bucket ids).
- :mod:`~pipeline.predictors.kmeans`: top-k nearest of B offline centroids (bucket ids).
- :mod:`~pipeline.predictors.patterns`: window, global and valid-pair masks OR-ed / AND-ed in.
- :mod:`~pipeline.predictors.buckets`: bucket ids → mask, and the combined graph.
- :mod:`~pipeline.predictors.metrics`: sparsity, recall, precision and exact-query fraction.
"""

from pipeline.predictors.buckets import buckets_to_mask, predicted_graph
from pipeline.predictors.distance import distance_mask, pairwise_distances
from pipeline.predictors.kmeans import kmeans_buckets, kmeans_mask, nearest_centroids
from pipeline.predictors.metrics import GraphScoreSums, graph_scores, summarize
from pipeline.predictors.patterns import global_mask, valid_pairs, window_mask
from pipeline.predictors.quantization import quantile_bins, quantization_buckets, quantization_mask

__all__ = [
    "GraphScoreSums",
    "buckets_to_mask",
    "distance_mask",
    "global_mask",
    "graph_scores",
    "kmeans_buckets",
    "kmeans_mask",
    "nearest_centroids",
    "pairwise_distances",
    "predicted_graph",
    "quantile_bins",
    "quantization_buckets",
    "quantization_mask",
    "summarize",
    "valid_pairs",
    "window_mask",
]
