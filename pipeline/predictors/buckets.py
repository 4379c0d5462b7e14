"""From bucket ids to a predicted attention graph.

Bucket ids follow the kernel contract: int (batch, heads, n, T), T ≥ 1 ids per token, −1 for none. The
predicted graph of a head is

    Ĝ = (L ∪ W ∪ G) ∩ V

with L the learned pairs (shared bucket id ≥ 0, or any boolean predictor mask), W the window pattern, G the
global pattern and V the valid pairs (see :mod:`pipeline.predictors.patterns`).
"""

from __future__ import annotations

import torch

from kernels.reference import attended_mask
from pipeline.predictors.patterns import global_mask, valid_pairs, window_mask


def buckets_to_mask(q_buckets: torch.Tensor, k_buckets: torch.Tensor) -> torch.Tensor:
    """(batch, heads, n, m) mask [q_buckets[i] ∩ k_buckets[j] ∖ {−1} ≠ ∅], the kernel's own definition."""
    return attended_mask(q_buckets, k_buckets)


def predicted_graph(
    learned: torch.Tensor | None,
    q_valid: torch.Tensor,
    k_valid: torch.Tensor,
    *,
    causal: bool,
    window: int = 0,
    global_first: bool = False,
    global_last: bool = False,
) -> torch.Tensor:
    """Ĝ = (learned ∪ window ∪ global) ∩ valid.

    ``learned`` is a (batch, heads, n, m) mask or ``None`` (window/global baseline, result (batch, 1, n, m));
    ``q_valid`` (batch, n) and ``k_valid`` (batch, m) mark real tokens; ``window`` is the full window size w
    (|i − j| ≤ w // 2, 0 for none). ``global_first`` adds the first valid token's row and column,
    ``global_last`` the last valid token's.
    """
    n, m = q_valid.shape[-1], k_valid.shape[-1]
    pattern = window_mask(n, m, window, device=q_valid.device)[None]  # (1, n, m)
    if global_first or global_last:
        pattern = pattern | global_mask(q_valid, k_valid, first=global_first, last=global_last)
    graph = pattern[:, None] if learned is None else learned | pattern[:, None]
    return graph & valid_pairs(q_valid, k_valid, causal=causal)[:, None]
