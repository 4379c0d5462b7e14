"""α-entmax, exactly, for α = 1.5 and α = 2, over rows of scores that each belong to one query, in C++.

A query's keys may be spread over rows of several parts (tensors (…, W), one query per row, as
:mod:`kernels.torch_bucketed` lays out the attended pairs). Per query, with m its largest score,

    α-entmax(s)_j = ((α − 1)(s_j − m) − τ)₊^{1/(α−1)},   Σ_j α-entmax(s)_j = 1,

τ the sort-based value. ``kernels/exact_entmax.cpp`` finds τ one query at a time, its entries read from
memory once and searched in the first-level cache, and writes the probabilities over the scores while they
are still there; :func:`kernels.torch_bucketed._support_threshold` is the PyTorch reference it must match.
"""

from __future__ import annotations

import ctypes

import torch

from kernels.native import library

_FUNCTIONS = {torch.float32: "exact_entmax_float", torch.float64: "exact_entmax_double"}


def _addresses(tensors: list[torch.Tensor | None]) -> ctypes.Array:
    """A C array of the tensors' data pointers (null for None)."""
    return (ctypes.c_void_p * len(tensors))(*(None if t is None else t.data_ptr() for t in tensors))


def _int64s(values: list[int]) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)


def exact_entmax(
    parts: list[torch.Tensor],
    owners: list[torch.Tensor],
    num_queries: int,
    alpha: float,
    *,
    write: bool,
    limits: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per query (num_queries,) the shift m and the threshold τ over the rows of ``parts`` (each (…, W),
    contiguous, CPU, float32 or float64, one dtype) whose owners (…) are queries in [0, num_queries); entries
    off the mask −inf or below −max float / 2. ``limits`` may give a part of blocks (blocks, L, W) its keys'
    positions (blocks, W) and its rows' limits (blocks, L), float32: entry j of a row is then a key only when
    its position is at most the row's limit (a causal cut, padding), with no mask written into the scores.
    With ``write``, the probabilities replace the scores (0 off the keys). A query without rows gets m = 0 and
    τ = −1, one without keys m = 0. None where the C++ kernel cannot run (no compiler, see
    :mod:`kernels.native`; GPU tensors), and then nothing is written."""
    if alpha not in (1.5, 2.0):
        raise ValueError(f"exact α-entmax takes α = 1.5 or 2; got {alpha}")
    limits = [None] * len(parts) if limits is None else limits
    for scores, owner, limit in zip(parts, owners, limits, strict=True):
        if scores.shape[:-1] != owner.shape:
            shapes = f"{tuple(scores.shape)}, {tuple(owner.shape)}"
            raise ValueError(f"a part (…, W) needs owners (…) of the same leading shape; got {shapes}")
        if not scores.is_contiguous():
            raise ValueError("each part of scores must be contiguous (the kernel writes through its rows)")
        low, high = (int(x) for x in owner.aminmax()) if owner.numel() else (0, 0)
        if low < 0 or high >= num_queries:
            raise ValueError(f"owners must be queries in [0, {num_queries}); got [{low}, {high}]")
        if limit is not None:
            expected = ((scores.shape[0], scores.shape[-1]), tuple(scores.shape[:2]))
            got = tuple(tuple(x.shape) for x in limit)
            if scores.dim() != 3 or got != expected:
                raise ValueError(
                    f"limits of a part (blocks, L, W) {tuple(scores.shape)} must be key positions "
                    f"(blocks, W) and row limits (blocks, L); got {got[0]}, {got[1]}"
                )
            if {x.dtype for x in limit} != {torch.float32}:
                raise ValueError("key positions and row limits must be float32")
    dtype = parts[0].dtype if parts else torch.float32
    kernel = library("exact_entmax")
    if kernel is None or dtype not in _FUNCTIONS or any(p.device.type != "cpu" for p in parts):
        return None
    if any(p.dtype != dtype for p in parts):
        raise ValueError(f"all parts must share one dtype; got {sorted({str(p.dtype) for p in parts})}")
    rows = [o.reshape(-1).to(torch.int64).contiguous() for o in owners]  # kept alive for the call
    positions = [None if limit is None else limit[0].contiguous() for limit in limits]
    row_limits = [None if limit is None else limit[1].contiguous() for limit in limits]
    shift, tau = torch.zeros(num_queries, dtype=dtype), torch.zeros(num_queries, dtype=dtype)
    status = getattr(kernel, _FUNCTIONS[dtype])(
        ctypes.c_int(len(parts)),
        _addresses(parts),
        _int64s([r.numel() for r in rows]),
        _int64s([p.shape[-1] for p in parts]),
        _addresses(rows),
        _addresses(positions),
        _addresses(row_limits),
        _int64s([p.shape[1] if p.dim() == 3 else 1 for p in parts]),
        ctypes.c_int64(num_queries),
        ctypes.c_int(1 if alpha == 2.0 else 2),
        ctypes.c_int(int(write)),
        ctypes.c_void_p(shift.data_ptr()),
        ctypes.c_void_p(tau.data_ptr()),
        ctypes.c_int(torch.get_num_threads()),
    )
    if status != 0:
        raise MemoryError(f"exact α-entmax ran out of memory for {sum(r.numel() for r in rows)} rows")
    return shift, tau
