"""Attention kernels: exact α-entmax over a chosen set of keys, fast where the set is sparse.

One room per concept; importing this package loads nothing, and importing a room loads only that room and
what it builds on, so code that needs the entmax normaliser never loads Triton or the bucketed planner.

- :mod:`attention_kernels.attended`: the attended set A (shared buckets ∪ window ∪ global tokens, ∩ causal ∩
  valid), the one definition every kernel, predictor and metric uses.
- :mod:`attention_kernels.entmax`: dense α-entmax (the reference normaliser), the one threshold solver, the
  Jacobian's weights and the fused support sums.
- :mod:`attention_kernels.bucketed`: ``bucketed_attention``, α-entmax over A from bucket ids: planning, the
  PyTorch path (CPU, C++ block products), the Triton kernel (CUDA) and the dense reference they are tested
  against.
- :mod:`attention_kernels.indexed`: ``indexed_attention``, α-entmax whose keys a low-rank indexer chooses,
  exact in its certified mode; PyTorch and Triton.
- :mod:`attention_kernels.index_grid`: the 7-bit grid the approximate indexer's low-rank rows lie on, shared
  by the indexed kernels and the τ-indexer predictor.
- :mod:`attention_kernels.native`: the C++ sources and the builder that compiles and verifies them.
- :mod:`attention_kernels.predictor_maps`: a learned predictor's per-token maps (head MLP, nearest centroid)
  in C++.
- :mod:`attention_kernels.checks`: the argument checks every entry point shares.

Kernels import nothing from the pipeline; benchmarks, tuning and the build report live in ``benchmarks/``.
"""
