"""Clustering of projected queries and keys: seeded k-means with faiss or scikit-learn."""

from pipeline.clustering.kmeans import fit_centroids, resolve_backend

__all__ = ["fit_centroids", "resolve_backend"]
