"""Counting the query–key pairs an attention computes, for any head that restricts its attention.

A head that attends a subset of the pairs the model allows (a predictor's graph, a sampled graph, selected
keys) derives from :class:`PairCounter`; while :func:`measure_sparsity` is active it adds, per attention
head, how many valid pairs it attended and how many there were:

    sparsity = 1 − Σ attended / Σ valid      (pooled over every call: every decoding step, every beam)

Valid pairs are those the model's mask allows to real queries; pairs with a learned support vector (SAMSA)
are not pairs of the sequence and are not counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


class PairCounter(nn.Module):
    """Base of attention heads whose attended pairs can be counted (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.measuring = False
        self.attended = self.valid = torch.zeros(0, dtype=torch.float64)  # (h,) sums while measuring

    def reset_counts(self) -> None:
        self.attended = self.valid = torch.zeros(0, dtype=torch.float64)

    def record_counts(self, attended: Tensor, valid: Tensor) -> None:
        """Add one call's per-head counts (h,) of attended and of valid pairs."""
        attended, valid = attended.double().cpu(), valid.double().cpu()
        if self.attended.numel() == 0:
            self.attended, self.valid = attended, valid
        else:
            self.attended, self.valid = self.attended + attended, self.valid + valid

    def record_graph(self, graph: Tensor, allowed: Tensor, q_valid: Tensor) -> None:
        """Add the counts of a boolean graph (b, h | 1, n, m) within ``allowed`` (b, h | 1, n, m) pairs of
        real queries ``q_valid`` (b, n); a head-shared graph or mask counts for every head."""
        heads = max(graph.shape[1], allowed.shape[1])
        b, _, n, m = graph.shape
        graph = graph.expand(b, heads, n, m)
        valid = (allowed & q_valid[:, None, :, None]).expand(b, heads, n, m)
        self.record_counts((graph & valid).sum((0, 2, 3)), valid.sum((0, 2, 3)))


def pair_counters(model: nn.Module) -> list[PairCounter]:
    """Every :class:`PairCounter` of ``model``, in module order (encoder layers, then decoder layers)."""
    return [module for module in model.modules() if isinstance(module, PairCounter)]


@contextmanager
def measure_sparsity(model: nn.Module) -> Iterator[dict[str, Any]]:
    """Count the pairs every counting head attends while the block runs; fills the yielded dict on exit.

    The result holds ``"sparsity"``: 1 − attended / valid pairs, pooled over every call per head, then
    averaged over heads and layers, and ``"per_layer_head"``: the pooled sparsity per layer (every counting
    module, in module order) and head. Both are absent when no head counted anything.
    """
    heads = pair_counters(model)
    for head in heads:
        head.measuring = True
        head.reset_counts()
    result: dict[str, Any] = {}
    try:
        yield result
    finally:
        table = []
        for head in heads:
            if head.valid.numel():
                table.append((1 - head.attended / head.valid.clamp(min=1)).tolist())
            head.measuring = False
        if table:
            result["sparsity"] = float(torch.tensor([value for row in table for value in row]).mean())
            result["per_layer_head"] = table
