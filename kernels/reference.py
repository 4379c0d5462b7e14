"""Dense masked reference for bucketed attention (tests only: O(n²) memory).

The attended set A_i of query i is :func:`kernels.attended.attended_mask` (window size w: |i − j| ≤ w // 2;
the first ``global_tokens`` positions global; j ≤ i when causal), and the output is

    o_i = Σ_{j∈A_i} p_ij v_j,   p_i = α-entmax(s_i) over A_i (softmax when α = 1),   s_ij = scale · q_i·k_j.

with the normaliser of dense attention (:func:`kernels.dense_entmax.entmax_normalize`). A query with A_i = ∅
outputs zeros. Masking is by −inf, never by a large finite constant, so a masked key can never enter the
support.
"""

from __future__ import annotations

import torch

from kernels.attended import attended_mask
from kernels.dense_entmax import entmax_normalize


def dense_bucketed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    window: int = 0,
    global_tokens: int = 0,
    scale: float | None = None,
) -> torch.Tensor:
    """Reference output (batch, heads, n, d_v), computed densely in fp32 and cast back to ``q.dtype``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask = attended_mask(q_buckets, k_buckets, causal=causal, window=window, global_tokens=global_tokens)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale  # (b, h, n, m)
    probs = entmax_normalize(scores.masked_fill(~mask, float("-inf")), alpha)
    return (probs @ v.float()).to(q.dtype)
