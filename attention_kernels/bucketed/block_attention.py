"""Bucketed attention over whole-query blocks in one C++ pass: scores, α-entmax and outputs, a tile of queries
at a time.

Where each query sits in one row of one block (one bucket id per query, or its class of id sets from
:mod:`attention_kernels.bucketed.id_sets`: a :class:`~attention_kernels.bucketed.planning.BlockPlan` that
is not ``spread``), a tile of 12 queries has all of its keys in its block, so
``attention_kernels/native/block_attention.cpp`` computes

    S = q·kᵀ (the tile's rows against its block's keys),   P = α-entmax(S) per row,   o = P·v

with the scores in the first-level cache throughout and each output row written where its query lies: no
score tensor, no gather, no scatter. α = 1 (softmax), 1.5 and 2, exactly as
:mod:`attention_kernels.bucketed.exact_entmax` (the same per-query search, ``row_entmax.h``). When causal a
tile computes only its rows' prefix of the block's keys (up to the last key its rows may attend), so a whole
bucket is one block and the masked half of its diagonal is not computed but for the tile's own corner.

A window band or global tokens add each query's pattern keys outside its block row (the plan's
``band_keys``, :mod:`attention_kernels.bucketed.band_keys`): their scores join the row's before its
α-entmax, and their probabilities add to its output; a query with no block row is a block of one row and no
keys.

The reference is the unfused path of :mod:`attention_kernels.bucketed.torch_path` (the block products, the
C++ normaliser, the output product and its scatter); the two differ by round-off only (the sums' order).
Inference only: the backward needs the probabilities, which the unfused path keeps.
"""

from __future__ import annotations

import ctypes

import torch

from attention_kernels.bucketed.band_keys import lone_queries
from attention_kernels.bucketed.block_products import checked_index
from attention_kernels.bucketed.exact_entmax import check_mask
from attention_kernels.bucketed.planning import BlockMask, BlockPlan
from attention_kernels.native import call, library

_SUFFIX = {torch.float32: "float", torch.float64: "double"}
_BETA = {1.0: 0, 1.5: 2, 2.0: 1}
"""The kernel's β = 1/(α − 1) for each α it takes, 0 standing for softmax."""


def fused_kernel() -> ctypes.CDLL | None:
    """The C++ library where it was built with vectors (AVX2 with FMA, or AVX-512; see
    :mod:`attention_kernels.native`), else None."""
    kernel = library("block_attention")
    return kernel if kernel is not None and kernel.vector_bytes() > 0 else None


def fits(plan: BlockPlan, alpha: float, *tensors: torch.Tensor) -> bool:
    """Whether :func:`block_attention` takes this plan, α and these tensors: whole-query blocks whose masks
    cut by position alone (:func:`_by_limit_alone`), α ∈ {1, 1.5, 2}, contiguous CPU tensors of float32 or
    float64."""
    dtype = tensors[0].dtype
    return (
        float(alpha) in _BETA
        and not plan.spread
        and dtype in _SUFFIX
        and all(t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous() for t in tensors)
        and all(c.mask is None or _by_limit_alone(c.mask) for c in plan.classes)
    )


def _by_limit_alone(mask: BlockMask) -> bool:
    """Whether the keys of each row are the first columns of its block, those at or below its limit: no
    lower limit, no tags, key positions ascending along each block (as a bucket block's are)."""
    return mask.low is None and mask.q_tags is None and bool((mask.key_pos.diff(dim=1) >= 0).all())


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, alpha: float, scale: float = 1.0
) -> torch.Tensor | None:
    """o (N, d_v): o_i = Σ_j p_ij v_j over query i's block row and its band keys, p_i = α-entmax of its
    scores s_ij = (scale · q_i) · k_j (softmax at α = 1), zeros for a query with no key. q (N, d), k (M, d),
    v (M, d_v) flat over groups.
    None where the kernel cannot run (no compiler or no vectors; a plan or tensors :func:`fits` refuses)."""
    kernel = fused_kernel()
    if kernel is None or not fits(plan, alpha, q, k, v):
        return None
    if q.dim() != 2 or k.dim() != 2 or v.dim() != 2 or k.shape[1] != q.shape[1] or len(v) != len(k):
        raise ValueError(
            f"block_attention takes q (N, d), k (M, d), v (M, d_v); got q {tuple(q.shape)}, k "
            f"{tuple(k.shape)}, v {tuple(v.shape)}"
        )
    out = v.new_zeros(plan.num_queries, v.shape[1])
    suffix = _SUFFIX[q.dtype]
    band, band_x, width = None, None, 0  # the band keys (N, E), their scores then probabilities (N, E)
    if plan.band_keys is not None:
        band = plan.band_keys.to(torch.int64).contiguous()
        if band.dim() != 2 or len(band) != plan.num_queries or len(q) != plan.num_queries:
            raise ValueError(
                f"band_keys must be (queries {plan.num_queries}, E) for {len(q)} queries; "
                f"got {tuple(band.shape)}"
            )
        low, high = (int(x) for x in band.aminmax()) if band.numel() else (-1, -1)
        if low < -1 or high >= len(k):
            raise ValueError(f"band_keys must index rows in [0, {len(k)}) or be −1 for none")
        width = band.shape[1]
        if not 0 <= plan.band_window <= width:
            raise ValueError(f"band_window must lie in [0, {width}]; got {plan.band_window}")
        band_x = q.new_empty(plan.num_queries, width)
        sizes = (width, plan.band_window, plan.num_queries, q.shape[1], float(scale))
        call(kernel, f"band_scores_{suffix}", q, k, band, *sizes, band_x)
    scalars = (q.shape[1], v.shape[1], float(scale), _BETA[float(alpha)], out)

    def run(queries: torch.Tensor, keys: torch.Tensor, mask: BlockMask | None) -> None:
        """The kernel on blocks (blocks, L) of queries against (blocks, M) keys."""
        key_pos = None if mask is None else mask.key_pos.contiguous()
        limit = None if mask is None else mask.limit.contiguous()
        shape = (*queries.shape, keys.shape[1])
        name = f"block_attention_{suffix}"
        call(kernel, name, q, k, v, queries, keys, key_pos, limit, width, band_x, *shape, *scalars)

    for blocks in plan.classes:
        queries = checked_index(blocks.queries, len(q), "queries")
        keys = checked_index(blocks.keys, len(k), "keys")
        if blocks.mask is not None:
            check_mask((*queries.shape, keys.shape[1]), blocks.mask)
        run(queries, keys, blocks.mask)
    if band is not None:
        lone = lone_queries(plan)  # queries with no block row: blocks of one row and no keys
        if len(lone):
            run(lone[:, None], lone.new_empty(len(lone), 0), None)
        sizes = (width, plan.band_window, plan.num_queries)
        call(kernel, f"band_outputs_{suffix}", v, band, *sizes, band_x, v.shape[1], out)
    return out
