"""Dense masked bucketed attention: the reference every kernel is tested against, and the PyTorch path's
computation of short rows (:data:`attention_kernels.bucketed.torch_path.SHORT_KEYS`); O(n · m) memory.

The attended set A_i of query i is :func:`attention_kernels.attended.attended_mask` (window size w:
|i − j| ≤ w // 2; the first ``global_tokens`` positions global; j ≤ i when causal), and the output is

    o_i = Σ_{j∈A_i} p_ij v_j,   p_i = α-entmax(s_i) over A_i (softmax when α = 1),   s_ij = scale · q_i·k_j.

with the normaliser of dense attention (:func:`attention_kernels.entmax.dense.entmax_normalize`). A query with
A_i = ∅ outputs zeros. Masking is by −inf, never by a large finite constant, so a masked key can never enter
the support. Grouped-query attention (fewer key/value heads than query heads) broadcasts each key/value head
over its query heads, with no copies (the query heads' rows stacked against its keys).
"""

from __future__ import annotations

import torch

from attention_kernels.attended import attended_mask
from attention_kernels.entmax.dense import compute_dtype, entmax_normalize


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
    """Output (batch, heads, n, d_v) in ``q.dtype``, computed densely in float32 (float64 for float64
    inputs). q (batch, heads, n, d); k, v (batch, kv_heads, m, ·) with kv_heads dividing heads (query head h
    reads key/value head h // (heads / kv_heads)); bucket ids (batch, heads, n|m, T). Differentiable."""
    b, h, n, d = q.shape
    kv_heads, m = k.shape[1], k.shape[2]
    compute = compute_dtype(q.dtype)
    scale = d**-0.5 if scale is None else scale
    mask = attended_mask(q_buckets, k_buckets, causal=causal, window=window, global_tokens=global_tokens)
    # a key/value head's query heads are consecutive: their rows stacked face its keys in one product
    rows = q.to(compute).reshape(b, kv_heads, h // kv_heads * n, d)
    k, v = k.to(compute), v.to(compute)
    scores = (rows @ k.transpose(-1, -2)).view(b, h, n, m) * scale
    probs = entmax_normalize(scores.masked_fill(~mask, float("-inf")), alpha)
    return (probs.reshape(b, kv_heads, h // kv_heads * n, m) @ v).view(b, h, n, -1).to(q.dtype)
