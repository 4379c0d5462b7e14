"""The exact α-entmax threshold of each query over scores held in pieces, for α = 1.5 and α = 2, in C++.

Pieces are rows of scores (P, W), each owned by one query, a query's keys spread over any number of them
(:mod:`kernels.torch_bucketed` lays every attended pair out so). Per query, with m its largest score,

    α-entmax(s)_j = ((α − 1)(s_j − m) − τ)₊^{1/(α−1)},   Σ_j α-entmax(s)_j = 1,

and τ is the sort-based value. ``kernels/entmax_threshold.cpp`` finds it one query at a time, each query's
entries read from memory once and searched in the first-level cache; the PyTorch reference it must match is
:func:`kernels.torch_bucketed._support_threshold`, which reads every score from memory at each step.
"""

from __future__ import annotations

import ctypes

import torch

from kernels.native import library

_FUNCTIONS = {torch.float32: "entmax_thresholds_float", torch.float64: "entmax_thresholds_double"}


def query_thresholds(
    pieces: torch.Tensor, owners: torch.Tensor, num_queries: int, alpha: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per query (num_queries,) the shift m and the threshold τ over the pieces (P, W) (CPU, float32 or
    float64) whose owners (P,) are queries in [0, num_queries); entries off the mask −inf or below
    −max float / 2. A query without pieces gets m = 0 and τ = −1, one without keys m = 0. None where the
    C++ kernel cannot run (no compiler: see :mod:`kernels.native`)."""
    if alpha not in (1.5, 2.0):
        raise ValueError(f"the C++ threshold search takes α = 1.5 or 2; got {alpha}")
    kernel = library("entmax_threshold")
    if kernel is None or pieces.device.type != "cpu" or pieces.dtype not in _FUNCTIONS:
        return None
    if pieces.dim() != 2 or owners.shape != pieces.shape[:1]:
        shapes = f"{tuple(pieces.shape)}, {tuple(owners.shape)}"
        raise ValueError(f"pieces must be (P, W) and owners (P,); got {shapes}")
    low, high = (int(x) for x in owners.aminmax()) if owners.numel() else (0, 0)
    if low < 0 or high >= num_queries:
        raise ValueError(f"owners must be queries in [0, {num_queries}); got [{low}, {high}]")
    pieces = pieces.detach().contiguous()
    owners = owners.detach().to(torch.int64).contiguous()
    shift, tau = pieces.new_empty(num_queries), pieces.new_empty(num_queries)
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    status = getattr(kernel, _FUNCTIONS[pieces.dtype])(
        pointer(pieces.data_ptr()),
        size(pieces.shape[0]),
        size(pieces.shape[1]),
        pointer(owners.data_ptr()),
        size(num_queries),
        ctypes.c_int(1 if alpha == 2.0 else 2),
        pointer(shift.data_ptr()),
        pointer(tau.data_ptr()),
        ctypes.c_int(torch.get_num_threads()),
    )
    if status != 0:
        raise MemoryError(f"the C++ threshold search ran out of memory for {pieces.shape[0]} pieces")
    return shift, tau
