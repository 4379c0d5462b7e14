"""Indexed α-entmax attention: a low-rank indexer chooses each query's keys; certified mode is exact.

``indexed_attention(q, k, v, q_index, k_index, *, alpha, causal, key_valid, scale, margin, mode, candidates,
backend)`` (:mod:`attention_kernels.indexed.attention`, where the math is) never builds the n × m graph: per
query block it bounds the low-rank scores of each key block and scores only the blocks that can hold the
predicted support. ``mode="certified"`` adds full-dimension bounds so that every key with weight is kept: the
result equals dense α-entmax attention for every input. CUDA runs the Triton forward of
:mod:`attention_kernels.indexed.triton_kernel`; certified mode on CPU the scanned C++ kernel of
:mod:`attention_kernels.indexed.scanned` (every pair scored, the entmax over the keys near each row's
maximum); everything else runs the PyTorch code.
"""

from attention_kernels.indexed.attention import indexed_attention

__all__ = ["indexed_attention"]
