"""Bucketed α-entmax attention over the attended set of :mod:`attention_kernels.attended`.

``bucketed_attention(q, k, v, q_buckets, k_buckets, *, alpha=1.5, causal=False, window=0,
global_tokens=0, scale=None, backend="auto")``: q (b, h, n, d); k, v (b, h_kv, m, d); bucket ids int32
(b, h, n, T) and (b, h, m, T′), −1 for none. Query i attends key j iff they share a bucket id ≥ 0, or
|i − j| ≤ window // 2, or i or j is among the first ``global_tokens``; and j ≤ i when causal. Each pair
counts once however many buckets it shares; α = 1 is softmax; a query with no key gives zeros;
differentiable in q, k and v.

- :mod:`~attention_kernels.bucketed.attention`: the validated entry point and backend choice.
- :mod:`~attention_kernels.bucketed.planning`: bucket ids → blocks of queries and keys that share a bucket
  (C++).
- :mod:`~attention_kernels.bucketed.torch_path`: the sub-quadratic PyTorch path (CPU), with
  :mod:`~attention_kernels.bucketed.block_products`, :mod:`~attention_kernels.bucketed.exact_entmax` (C++) and
  :mod:`~attention_kernels.bucketed.huge_pages`; for inference, the fused
  :mod:`~attention_kernels.bucketed.block_attention` (C++), which takes several ids per query through
  :mod:`~attention_kernels.bucketed.id_sets` and a window band through
  :mod:`~attention_kernels.bucketed.band_keys`.
- :mod:`~attention_kernels.bucketed.triton_kernel`: the Triton kernel (CUDA; imported only when it runs).
- :mod:`~attention_kernels.bucketed.triton_plan`: its plan, the entries sorted by (bucket, position) and
  each block's range of the other side, in a few launches.
- :mod:`~attention_kernels.bucketed.reference`: the dense reference every path is tested against.
"""

from attention_kernels.bucketed.attention import bucketed_attention

__all__ = ["bucketed_attention"]
