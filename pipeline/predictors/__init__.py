"""Predictors: from a head's (projected) queries and keys to a predicted attention graph Ĝ ≈ G.

- :mod:`~pipeline.predictors.base`: the interface, the registry and :func:`predicted_graph`, which adds the
  window and global pattern and the valid pairs exactly as the kernel does
  (:mod:`attention_kernels.attended`).
- Sparsefinder: :mod:`~pipeline.predictors.distance` (‖q′ − k′‖ ≤ t, a mask),
  :mod:`~pipeline.predictors.quantization` (equal-size bins per projected dimension, buckets),
  :mod:`~pipeline.predictors.kmeans` (top-k of B offline centroids, buckets).
- :mod:`~pipeline.predictors.indexer`: the τ-indexer (entmax's per-query threshold on low-rank scores,
  a mask), fitted by :mod:`~pipeline.predictors.indexer_fit`.
- :mod:`~pipeline.predictors.state`: fitted state as safetensors. :mod:`~pipeline.predictors.fitting` and
  :mod:`~pipeline.predictors.scoring`: fitting on a graph store's training split, scoring held out.
- :mod:`~pipeline.predictors.metrics`: sparsity, recall, precision and exact-query fraction.

Importing this package registers every predictor with :func:`make_predictor`.
"""

from pipeline.predictors.base import (
    PREDICTORS,
    HeadInputs,
    Prediction,
    Predictor,
    make_predictor,
    predicted_graph,
    register,
)
from pipeline.predictors.bigbird import BigBirdPredictor
from pipeline.predictors.distance import DistancePredictor
from pipeline.predictors.indexer import IndexerPredictor
from pipeline.predictors.kmeans import KMeansPredictor
from pipeline.predictors.longformer import LongformerPredictor
from pipeline.predictors.metrics import GraphScoreSums, graph_scores, summarize
from pipeline.predictors.quantization import QuantizationPredictor
from pipeline.predictors.reformer import ReformerPredictor
from pipeline.predictors.routing import RoutingPredictor
from pipeline.predictors.window import WindowPredictor

__all__ = [
    "PREDICTORS",
    "BigBirdPredictor",
    "DistancePredictor",
    "GraphScoreSums",
    "HeadInputs",
    "IndexerPredictor",
    "KMeansPredictor",
    "LongformerPredictor",
    "Prediction",
    "Predictor",
    "QuantizationPredictor",
    "ReformerPredictor",
    "RoutingPredictor",
    "WindowPredictor",
    "graph_scores",
    "make_predictor",
    "predicted_graph",
    "register",
    "summarize",
]
