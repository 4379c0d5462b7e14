"""The two products of attention blocks whose rows and columns are read through index lists, in C++.

For blocks of L rows against M columns (:class:`~attention_kernels.bucketed.planning.BlockClass`:
``rows`` (blocks, L) and ``cols`` (blocks, M) index the flat tensors):

    scores   S[b, r, c] = x[rows[b, r]] · y[cols[b, c]]         (blocks, L, M)
    outputs  O[b, r]    = Σ_c P[b, r, c] · y[cols[b, c]]         (blocks, L, d_y)
             and Pᵀ's:    Σ_r P[b, r, c] · y[rows[b, r]]         (blocks, M, d_y)

(the forward's s = q·kᵀ and o = p·v, the backward's dp = do·vᵀ, dq = ds·k, dv = pᵀ·do and dk = dsᵀ·q).

The reference is a batched matmul of the gathered rows (``take`` then ``bmm``), which runs where the C++
kernel cannot (no compiler, see :mod:`attention_kernels.native`; no AVX-512; GPU tensors; other dtypes).
``attention_kernels/native/block_products.cpp`` transposes each block's keys once into a panel the cache
holds, reads its values where they lie, and multiplies on 512-bit vectors; where the BLAS behind ``bmm`` takes
a narrower path than the processor has (MKL on AMD processors: AVX2), it runs about 1.4× (scores) and 2×
(outputs) the batched matmul's rate. On an AVX2 processor the same code on 256-bit tiles is slower than MKL's
own AVX2 kernels, gather included (an attention forward of 4k tokens, top-1: 1.4–1.6× the time), so there the
batched matmul runs. The two differ by round-off only (the sums' order).
"""

from __future__ import annotations

import ctypes

import torch

from attention_kernels.bucketed.planning import take
from attention_kernels.native import call, library, wide

_SUFFIX = {torch.float32: "float", torch.float64: "double"}


def wide_kernel() -> ctypes.CDLL | None:
    """The C++ library, where it was built for 512-bit vectors (see the module); None otherwise."""
    return wide(library("block_products"), 64)


def _runs_native(*tensors: torch.Tensor) -> ctypes.CDLL | None:
    """The wide C++ library where it can take these tensors (on the CPU, contiguous, float32 or float64, one
    dtype); None where the batched matmul must run."""
    dtype = tensors[0].dtype
    if dtype not in _SUFFIX:
        return None
    if any(t.device.type != "cpu" or t.dtype != dtype or not t.is_contiguous() for t in tensors):
        return None
    return wide_kernel()


def checked_index(index: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    """``index`` (integers, on the CPU) as contiguous int64, every entry a row of a tensor of ``rows`` rows;
    a one-line ValueError otherwise (the kernel reads through it unchecked)."""
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer row numbers; got {index.dtype}")
    if index.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, as the tensors it indexes; got {index.device}")
    index = index.to(torch.int64).contiguous()
    low, high = (int(x) for x in index.aminmax()) if index.numel() else (0, 0)
    if low < 0 or high >= rows:
        raise ValueError(f"{name} must index rows in [0, {rows}); got [{low}, {high}]")
    return index


def block_scores(
    x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """out[b, r, c] = x[rows[b, r]] · y[cols[b, c]]; x (N, d), y (M_all, d), rows (blocks, L), cols
    (blocks, M), out (blocks, L, M) contiguous. Returns ``out``."""
    blocks, length = rows.shape
    width, depth = cols.shape[1], x.shape[-1]
    shapes_fit = x.dim() == y.dim() == 2 and y.shape[1] == depth and cols.shape[0] == blocks
    if not shapes_fit or out.shape != (blocks, length, width) or not out.is_contiguous():
        raise ValueError(
            f"block_scores takes x (N, d), y (M, d), rows (blocks, L), cols (blocks, M), out (blocks, L, M) "
            f"contiguous; got x {tuple(x.shape)}, y {tuple(y.shape)}, rows {tuple(rows.shape)}, cols "
            f"{tuple(cols.shape)}, out {tuple(out.shape)}"
        )
    kernel = _runs_native(x, y, out)
    if kernel is None:
        return torch.bmm(take(x, rows), take(y, cols).transpose(1, 2), out=out)
    rows, cols = checked_index(rows, len(x), "rows"), checked_index(cols, len(y), "cols")
    call(kernel, f"block_scores_{_SUFFIX[x.dtype]}", x, y, rows, cols, blocks, length, width, depth, out)
    return out


def block_outputs(
    probs: torch.Tensor, y: torch.Tensor, index: torch.Tensor, *, transpose: bool = False
) -> torch.Tensor:
    """Σ_c probs[b, r, c] · y[index[b, c]] (blocks, L, d_y); with ``transpose``, Σ_r probs[b, r, c] ·
    y[index[b, r]] (blocks, M, d_y). probs (blocks, L, M), y (rows, d_y), index (blocks, M), or (blocks, L)
    with ``transpose``."""
    blocks, length, width = probs.shape
    if index.shape != (blocks, length if transpose else width) or y.dim() != 2:
        side = "L" if transpose else "M"
        raise ValueError(
            f"block_outputs takes probs (blocks, L, M), y (rows, d), index (blocks, {side}); got probs "
            f"{tuple(probs.shape)}, y {tuple(y.shape)}, index {tuple(index.shape)}"
        )
    kernel = _runs_native(probs, y)
    if kernel is None:
        return torch.bmm(probs.transpose(1, 2) if transpose else probs, take(y, index))
    out = probs.new_empty(blocks, width if transpose else length, y.shape[1])
    index = checked_index(index, len(y), "index")
    args = (blocks, length, width, y.shape[1], int(transpose), out)
    call(kernel, f"block_outputs_{_SUFFIX[probs.dtype]}", probs, y, index, *args)
    return out
