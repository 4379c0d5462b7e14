"""Attention-graph store: a teacher's queries, keys and gold (exactly sparse) attention graphs on disk."""

from pipeline.attention_kinds import KINDS, AttentionKind, attention_kind
from pipeline.graphs.batches import epoch_batches, iter_batches
from pipeline.graphs.store import AttentionGraph, GraphStore, GraphStoreWriter, Record

__all__ = [
    "KINDS",
    "AttentionGraph",
    "AttentionKind",
    "GraphStore",
    "GraphStoreWriter",
    "Record",
    "attention_kind",
    "epoch_batches",
    "iter_batches",
]
