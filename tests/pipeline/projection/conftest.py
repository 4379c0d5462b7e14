"""The graph tests' micro store (graphs of a tiny random entmax teacher), for training on store batches."""

from tests.pipeline.graphs.conftest import dataset, micro_store, teacher

__all__ = ["dataset", "micro_store", "teacher"]
