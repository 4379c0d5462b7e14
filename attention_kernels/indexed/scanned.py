"""Exact α-entmax attention on CPU that scores every allowed pair and spends the entmax on the keys that can
carry weight (C++: ``attention_kernels/native/scanned_entmax.cpp``).

For a query with scores s_j = scale · q·k_j and maximum m, write x_j = (s_j − m)/β with β = 1/(α − 1). Its
threshold solves Σ_j [x_j − τ]₊^β = 1 and lies in [−1, 0) (the maximum alone gives (0 − τ)^β ≤ 1), so

    p_j = 0 exactly for every key with s_j ≤ m − β,

whatever the other scores. The kernel computes all scores with a register-tiled product (no score matrix is
stored: a tile of 48 queries meets 128 keys at a time), keeps per row the entries above its running
maximum − β, and solves τ, the probabilities and o = Σ_j p_j v_j over those alone. Where an upper bound on a
key chunk's scores (its centroid and radius) lies below every row's running maximum − β the chunk is not
scored; on a trained model's scattered supports that rarely happens, and the saving is elsewhere: softmax
SDPA exponentiates every pair and multiplies all of them into the values, this kernel compares them and
touches a few percent.

Backward: the scores are computed again (the chunks that cannot reach m + β·τ skipped) and the gradient
runs over the support only (``attention_kernels/native/scanned_entmax.cpp``), from the m and τ the forward
kept per query. Exact for every input, up to the round-off of the sums' order; α = 1.5 and α = 2 only
(β = 2, 1). The reference is :func:`attention_kernels.indexed.attention.dense_indexed_reference`.
"""

from __future__ import annotations

import ctypes

import torch

from attention_kernels.index_grid import on_grid
from attention_kernels.native import call, library, wide

__all__ = ["CHUNK", "scanned_attention", "scanned_kernel"]

CHUNK = 128
"""Keys per chunk of the C++ kernel (its kChunk): the unit of ``chunks_skipped``."""
_BETA = {1.5: 2, 2.0: 1}
_SUFFIX = {torch.float32: "float", torch.float64: "double"}


def scanned_kernel(alpha: float, q: torch.Tensor) -> ctypes.CDLL | None:
    """The C++ library where it runs attention on q's device and dtype for this α: a CPU tensor (half
    precision computed in float32), α 1.5 or 2, a library built for vectors of 32 bytes or more (AVX2 with
    FMA, AVX-512); None elsewhere."""
    if alpha not in _BETA or q.device.type != "cpu" or not q.dtype.is_floating_point:
        return None
    return wide(library("scanned_entmax"), 32)


class _Scanned(torch.autograd.Function):
    """o (G, n, dv) of q (G, n, d), k (G, m, d), v (G, m, dv), and in approximate mode the indexer's
    q_index (G, n, r), k_index (G, m, r) (constants); ``settings`` (scale, α, causal, margin, candidates,
    coded: the low-rank scores from the index's 7-bit codes, float32 only); the kernel's counts added into
    ``counts`` (5,)."""

    @staticmethod
    def forward(ctx, q, k, v, key_valid, q_index, k_index, settings: tuple, counts: torch.Tensor):
        scale, alpha, causal, margin, candidates, coded = settings
        kernel = scanned_kernel(alpha, q)
        assert kernel is not None
        G, n, d = q.shape
        m, dv = k.shape[1], v.shape[2]
        rank = 0 if q_index is None else q_index.shape[2]
        out = q.new_empty(G, n, dv)
        saved = [q.new_empty(G, n) for _ in range(2 if q_index is None else 4)]  # shift, τ (, m′, τ′)
        low = saved[2:] or [None, None]
        # fmt: off
        call(kernel, f"scanned_forward_{_SUFFIX[q.dtype]}", q, k, v, key_valid, q_index, k_index, G, n, m, d,
             dv, rank, scale, _BETA[alpha], int(causal), margin, candidates, int(coded), out, *saved[:2],
             *low, counts)
        # fmt: on
        ctx.save_for_backward(q, k, v, key_valid, q_index, k_index, *saved)
        ctx.settings = settings
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        q, k, v, key_valid, q_index, k_index, *saved = ctx.saved_tensors
        scale, alpha, causal, margin, candidates, coded = ctx.settings
        kernel = scanned_kernel(alpha, q)
        assert kernel is not None
        G, n, d = q.shape
        m, dv = k.shape[1], v.shape[2]
        rank = 0 if q_index is None else q_index.shape[2]
        dq, dk, dvalues = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        grad = grad.to(q.dtype).contiguous()
        low = saved[2:] or [None, None]
        # fmt: off
        call(kernel, f"scanned_backward_{_SUFFIX[q.dtype]}", q, k, v, key_valid, q_index, k_index, G, n, m, d,
             dv, rank, scale, _BETA[alpha], int(causal), margin, candidates, int(coded), grad, *saved[:2],
             *low, dq, dk, dvalues)
        # fmt: on
        return dq, dk, dvalues, None, None, None, None, None


def scanned_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    alpha: float,
    causal: bool,
    key_valid: torch.Tensor | None,
    scale: float,
    index: tuple[torch.Tensor, torch.Tensor] | None = None,
    margin: float = 0.0,
    candidates: int = 64,
    coded: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """α-entmax attention (b, h, n, d_v) in q's dtype, differentiable in q, k and v. Certified (``index``
    None): exact. Approximate (``index`` = (q_index (b, h, n, r), k_index (b, h, m, r)), constants): entmax
    with the exact scores over each query's predicted set Ŝ = {j : (α − 1) z′_j ≥ τ′ − margin} of its
    low-rank scores z′ (the ``candidates`` largest where more), as
    :func:`attention_kernels.indexed.attention.predicted_sets` defines it: the index on the 7-bit grid of
    :mod:`attention_kernels.index_grid`, its scores computed by the kernel from the codes in integers
    where ``coded`` and the compute dtype is float32, else from the grid's floats (the two differ by
    round-off). With its counts: ``chunks_skipped``
    (share of the (48-query tile, 128-key chunk) pairs a query could see whose scores were never computed),
    ``kept_mean`` (mean over queries with a key of the keys entmax ran over: certified, those its floor
    kept; approximate, |Ŝ|) and ``filled`` (share of those whose Ŝ was capped). q (b, h, n, d),
    k (b, h, m, d), v (b, h, m, d_v), key_valid (b, m) bool or None; arguments checked by the caller
    (:func:`attention_kernels.indexed.attention.indexed_attention`), :func:`scanned_kernel` not None."""
    b, h, n, _ = q.shape
    m, dtype = k.shape[2], q.dtype
    compute = torch.float64 if dtype == torch.float64 else torch.float32

    def flat(x: torch.Tensor) -> torch.Tensor:  # (b, h, L, ·) → (b·h, L, ·) contiguous in the compute dtype
        return x.to(compute).reshape(b * h, x.shape[2], x.shape[3]).contiguous()

    valid = None
    if key_valid is not None:  # (b, m) → (b·h, m) bytes
        valid = key_valid[:, None].expand(b, h, m).reshape(b * h, m).to(torch.uint8).contiguous()
    q_index, k_index = None, None
    if index is not None:  # the kernel codes float32 rows itself; the grid's floats otherwise
        coded = coded and compute == torch.float32
        q_index, k_index = (flat(x.detach() if coded else on_grid(x)) for x in index)
    counts = torch.zeros(5, dtype=torch.int64)
    settings = (float(scale), float(alpha), causal, float(margin), int(candidates), bool(coded))
    out = _Scanned.apply(flat(q), flat(k), flat(v), valid, q_index, k_index, settings, counts)
    scored, visible, kept, capped, live = (int(c) for c in counts)
    stats = {
        "chunks_skipped": 1.0 - scored / visible if visible else 0.0,
        "kept_mean": kept / live if live else 0.0,
        "filled": capped / live if live else 0.0,
    }
    return out.view(b, h, n, -1).to(dtype), stats
