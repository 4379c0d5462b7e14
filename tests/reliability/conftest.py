"""The graph tests' micro store (graphs of a tiny random entmax teacher), for corrupting copies of it."""

from tests.pipeline.graphs.conftest import dataset, micro_store, teacher

__all__ = ["dataset", "micro_store", "teacher"]
