"""Padded training batches of one layer of a graph store, in the format the projection trainer reads.

A batch holds every head of one layer for a list of sentences, right-padded to its longest sentence:

    q        (B, H, n, d) float32   queries (unscaled), zero on padding
    k        (B, H, m, d) float32   keys
    gold     (B, H, n, m) bool      gold edges (p > 0)
    q_valid  (B, n) bool            True on real queries
    k_valid  (B, m) bool            True on real keys
    sentence (B,) int64             store index of every row

all torch tensors on the CPU. Splitting sentences into training and validation is choosing two index lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from pipeline.graphs.store import GraphStore

Batch = dict[str, torch.Tensor]


def iter_batches(
    store: GraphStore, *, kind: str, layer: int, indices: Sequence[int], batch_size: int
) -> Iterator[Batch]:
    """Yield padded batches of ``layer`` of ``kind`` for the sentences ``indices``, in the order given."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    q_side, k_side = store.sides_of(kind)
    q_lengths, k_lengths = store.lengths(q_side), store.lengths(k_side)
    indices = np.asarray(indices, np.int64)
    for begin in range(0, len(indices), batch_size):
        chunk = indices[begin : begin + batch_size]
        n, m = int(q_lengths[chunk].max()), int(k_lengths[chunk].max())
        B, H, d = len(chunk), store.heads, store.head_dim
        q = np.zeros((B, H, n, d), np.float32)
        k = np.zeros((B, H, m, d), np.float32)
        gold = np.zeros((B, H, n, m), bool)
        for b, sentence in enumerate(chunk):
            q_b, k_b, gold_b = store.layer_arrays(int(sentence), layer, kind)
            q[b, :, : q_b.shape[1]] = q_b
            k[b, :, : k_b.shape[1]] = k_b
            gold[b, :, : gold_b.shape[1], : gold_b.shape[2]] = gold_b
        yield {
            "q": torch.from_numpy(q),
            "k": torch.from_numpy(k),
            "gold": torch.from_numpy(gold),
            "q_valid": torch.from_numpy(np.arange(n)[None, :] < q_lengths[chunk][:, None]),
            "k_valid": torch.from_numpy(np.arange(m)[None, :] < k_lengths[chunk][:, None]),
            "sentence": torch.from_numpy(chunk),
        }


def epoch_batches(
    store: GraphStore, *, kind: str, layer: int, indices: Sequence[int]
) -> Callable[[int, torch.Generator], Iterator[Batch]]:
    """A function ``(batch_size, generator) → batches`` over ``indices``, shuffled anew on every call.

    The order comes from ``torch.randperm(generator=generator)``, so a seeded generator makes training
    reproducible; the batches are read from the store lazily, one at a time.
    """
    indices = np.asarray(indices, np.int64)

    def batches(batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        order = torch.randperm(len(indices), generator=generator).numpy()
        return iter_batches(store, kind=kind, layer=layer, indices=indices[order], batch_size=batch_size)

    return batches
