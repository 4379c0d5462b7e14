"""Triton forward of certified indexed α-entmax attention, inference only (see
:mod:`attention_kernels.indexed.attention`).

Same math and result as ``indexed_attention(..., mode="certified")``: for scores z_ij = scale · q_i·k_j over
the valid keys of query i (j ≤ i when causal), x_ij = (α − 1) z_ij,

    p_ij = [x_ij − τ_i]₊^{1/(α−1)},   Σ_j p_ij = 1,   o_i = Σ_j p_ij v_j      (zeros for a query with no key),

equal to dense α-entmax attention for every input; the low-rank indexer (q_index, k_index of rank r) only
decides how much work is skipped. Work is tiled flash-attention style: queries in blocks of ``BLOCK`` rows
("row groups", one program each per batch·head), keys in blocks of ``BLOCK`` keys. Four launches, no host
synchronisation between them:

1. ``_indexer_kernel`` (low rank, r padded to ≥ 16 for ``tl.dot``). Per query, sweeps over the allowed key
   blocks give the maximum x′_max of x′ = (α − 1) · scale · q_index·k_index and the number of allowed keys;
   ``INDEX_STEPS`` more sweeps take safeguarded Halley/Newton/bisection steps towards the low-rank threshold
   τ′ (the bucketed kernel's ``_tau_start``/``_tau_step``), and L_i is the bracket's lower end: a point where
   Σ_j [x′_ij − L_i]₊^{1/(α−1)} ≥ 1 was observed (or x′_max − 1, where the maximum alone has mass 1), so
   L_i ≤ τ′_i. A last sweep marks key block b *needed* for the row group when some live query has
   max_{j∈b} x′_ij ≥ L_i − margin: the block may hold a member of the predicted set
   Ŝ_i = {j : x′_ij ≥ τ′_i − margin} (the torch path's rule, with this L). Writes NEED (row groups, key
   blocks) and LIVE (queries that have at least one allowed key).
2. ``_solve_kernel`` over the needed blocks: exact scores, their threshold τ_S (max/count sweep, then τ steps
   in registers until converged, as the bucketed kernel's in-program solve), and o = Σ p v over those blocks.
   Writes τ_S per query and the output.
3. ``_keep_kernel``: per (row group, key block) an upper bound on q·k, as the torch path takes it: in the
   keys' principal axes (any orthonormal basis keeps q·k; in that one a block's ranges are narrow), Quest's
   Σ_c max(q_c·kmax_c, q_c·kmin_c) = q⁺·kmax + q⁻·kmin over the block's valid keys on the leading
   ``BOUND_AXES`` axes plus Cauchy–Schwarz on the rest (one more channel), as two fp32 ``tl.dot`` over a chunk
   of key blocks at once; the per-block ranges and the rotated queries are precomputed with torch
   (:func:`_bound_factors`, O((n + m)·d²) and a d × d eigensolve per batch·head). A block is *kept* when some
   query has (α − 1) · scale · (bound + rounding slack) > τ_S − slack. A row group is *checked* when it keeps
   a block that was not needed.
4. ``_solve_kernel`` again, gated on the checked row groups: first the exact scores of the kept-but-not-needed
   blocks against τ_S; when none is above τ_S the group is done (below). Otherwise it is *redone*: over its
   kept blocks, τ from the bracket [max(τ_S, x_max − 1), x_max − count^{1−α}], and the output, overwriting
   step 2's.

Exactness (whatever the indexer says). For α > 1, F_S(t) = Σ_{j∈S} [x_j − t]₊^{1/(α−1)} grows with the key
set S, so the root τ(S) of F_S = 1 is ≤ the row's τ: τ_S ≤ τ_i for the needed subset S, any subset. A key j
of a block that is not kept has x_ij ≤ (α − 1) · scale · bound ≤ τ_S ≤ τ_i (the bound holds in exact
arithmetic; the slack covers its and the scores' fp32 rounding), hence p_ij = 0: no key with weight lies
outside the kept blocks, and the root over the kept blocks is τ_i itself (the dropped keys add nothing to F at
any t ≥ τ_S). In a row group that is not redone every kept key outside the needed blocks has x_ij ≤ τ_S
(none kept, or all found so in step 4 with the very scores the solve uses), so all keys outside S add nothing
to F at τ_S: F(τ_S) = F_S(τ_S) = 1, τ_S = τ_i, and step 2's output is the answer. Redone groups solve on their
kept blocks from τ_S, a valid lower end of the bracket. A query whose needed blocks hold none of its keys gets
τ_S = −∞ (no information: its row group keeps every allowed block and is redone); a query with no allowed key
gets τ_S = +∞ (it keeps nothing) and outputs zeros. The indexer's thresholds (L, margin) only move work
between steps 2 and 4, never change the result.

Fusion. Here the passes are separate launches over global int8 flags (NEED, KEEP: one per (row group, key
block), n·m/BLOCK² bytes; CHECK, REDO per row group) and a host-side torch precompute of the bound factors.
On a GPU, steps 2–4 fit one program (τ_S is in registers when the bounds are taken; after a
``tl.debug_barrier`` the program would read back its KEEP row and go on with the check and the redo), so q
would be loaded once instead of three times and two launches would go; step 1 could join too, its needed flags
kept in the program's own slice of global memory. Not done: this module is checked only in Triton's
interpreter, where neither launch overhead nor memory traffic can be measured.

Backward: none (forward-only, for inference); ``indexed_attention`` runs its PyTorch path when gradients are
needed (``backend="auto"``). Internal arithmetic is fp32 (fp16/bf16 inputs use their tensor-core products with
fp32 accumulation); the output is cast to q's dtype.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from attention_kernels.bucketed.triton_kernel import (
    _KIND_ENTMAX15,
    _KIND_SPARSEMAX,
    _MAX_TAU_ITERS,
    _entmax_weights,
    _normalizer,
    _tau_start,
    _tau_step,
)
from attention_kernels.indexed.principal_axes import principal_axes

__all__ = ["INDEX_STEPS", "Passes", "certified_passes", "tile_size", "triton_indexed_attention"]

INDEX_STEPS = 2
"""Threshold steps of the indexer per query (each a sweep over the low-rank row); 0 keeps L = x′_max − 1."""
BOUND_AXES = 16
"""Leading principal axes of the keys on which the keep pass's bound is per channel (the rest: one norm)."""
KEY_BLOCKS_PER_BOUND = 32
"""Key blocks whose bounds one ``tl.dot`` of the keep pass takes at once."""
_TAU_F_TOL = 1e-6  # |Σ p − 1| accepting τ (any input dtype: the sums are fp32 and τ_S feeds the skip test)
_FP32_EPS = float(torch.finfo(torch.float32).eps)
_TAU_SLACK = 64 * _FP32_EPS  # relative rounding slack of the thresholds compared with bounds


def tile_size(block: int) -> int:
    """The Triton tile (row group and key block) for a requested ``block``: a power of two in [16, 128]
    (``tl.dot`` needs ≥ 16)."""
    return min(128, max(16, triton.next_power_of_2(int(block))))


# ----------------------------------------------------------------------------------------------- device
# fmt: off


@triton.jit
def _masked_tile(
    a, b_base, stride_bn, cols, feat, feat_ok, valid_row, rows, row_ok, M, qk_scale,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    """x = qk_scale · a·bᵀ (BM, BN) for rows ``a`` (BM, F) against the keys ``cols`` of b, and the mask of
    allowed pairs: valid key, live row, and j ≤ i when causal."""
    col_ok = cols < M
    b = tl.load(
        b_base + cols[:, None] * stride_bn + feat[None, :], mask=col_ok[:, None] & feat_ok[None, :], other=0.0
    )
    x = tl.dot(a, tl.trans(b), input_precision=PRECISION) * qk_scale
    valid = tl.load(valid_row + cols, mask=col_ok, other=0) != 0
    mask = row_ok[:, None] & valid[None, :]
    if CAUSAL:
        mask = mask & (cols[None, :] <= rows[:, None])
    return x, mask


@triton.jit
def _tau_sums(x, mask, tau, p_exp, KIND: tl.constexpr):
    """The τ step's sums over a tile at τ (per row), as ``_tau_step`` takes them: u = [x − τ]₊ and
    α = 1.5: (Σ u², Σ u, #u > 0); sparsemax: (Σ u, #u > 0, ·);
    other α: (Σ u^{1/(α−1)}, Σ u^{1/(α−1)−1}, ·)."""
    u = tl.maximum(tl.where(mask, x - tau[:, None], 0.0), 0.0)
    pos = u > 0.0
    if KIND == _KIND_ENTMAX15:
        s0 = tl.sum(u * u, 1)
        s1 = tl.sum(u, 1)
        s2 = tl.sum(pos.to(tl.float32), 1)
    elif KIND == _KIND_SPARSEMAX:
        s0 = tl.sum(u, 1)
        s1 = tl.sum(pos.to(tl.float32), 1)
        s2 = s1
    else:
        lu = tl.log2(tl.where(pos, u, 1.0))
        s0 = tl.sum(tl.where(pos, tl.exp2(p_exp * lu), 0.0), 1)
        s1 = tl.sum(tl.where(pos, tl.exp2((p_exp - 1.0) * lu), 0.0), 1)
        s2 = s1
    return s0, s1, s2


@triton.jit
def _exact_step(tau, ok, s0, s1, s2, KIND: tl.constexpr):
    """For α = 1.5 and 2, τ solved exactly on the support at τ from that support's sums (``_tau_sums`` at
    τ): with u = [x − τ]₊, Σ (u − δ) = 1 or Σ (u − δ)² = 1 (the smaller root, written without
    cancellation). Once τ is that close, δ is far below any gap between scores, so the support is kept.
    Other α (and rows not ``ok``) keep τ."""
    if KIND == _KIND_ENTMAX15:
        f = s0 - 1.0
        den = s1 + tl.sqrt(tl.maximum(s1 * s1 - s2 * f, 0.0))
        tau = tl.where(ok & (den > 0.0), tau + f / tl.where(den > 0.0, den, 1.0), tau)
    elif KIND == _KIND_SPARSEMAX:
        tau = tl.where(ok & (s1 > 0.0), tau + (s0 - 1.0) / tl.maximum(s1, 1.0), tau)
    return tau


@triton.jit
def _indexer_kernel(
    QI, KI, VALID, NEED, LIVE,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
    H, N, M, N_PAD, NQB, NKB, R, qk_scale, p_exp, alpha, margin, f_tol, tau_slack,
    KIND: tl.constexpr, TAU_METHOD: tl.constexpr, STEPS: tl.constexpr, CAUSAL: tl.constexpr,
    R_PAD: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr,
):
    """Pass 1 for one row group: NEED[group, b] = 1 for the key blocks b that may hold members of Ŝ (module
    docstring), LIVE = 1 for the queries that have an allowed key. Grid: (NQB, batch·heads)."""
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    rows = qb * BLOCK + offs
    row_ok = rows < N
    feat = tl.arange(0, R_PAD)
    feat_ok = feat < R
    qi = tl.load(
        QI + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + feat[None, :],
        mask=row_ok[:, None] & feat_ok[None, :],
        other=0.0,
    )
    ki_base = KI + b * stride_kb + h * stride_kh
    valid_row = VALID + b * M
    kb_end = tl.minimum(qb + 1, NKB) if CAUSAL else NKB

    x_max = tl.full((BLOCK,), float("-inf"), tl.float32)
    count = tl.zeros((BLOCK,), tl.float32)
    for kb in range(0, kb_end):
        x, mask = _masked_tile(qi, ki_base, stride_kn, kb * BLOCK + offs, feat, feat_ok, valid_row, rows,
                               row_ok, M, qk_scale, CAUSAL, PRECISION)
        x_max = tl.maximum(x_max, tl.max(tl.where(mask, x, float("-inf")), 1))
        count += tl.sum(mask.to(tl.float32), 1)
    live = count > 0.0
    tau, lo, hi, done = _tau_start(x_max, count, alpha)
    for _ in tl.static_range(STEPS):
        s0 = tl.zeros((BLOCK,), tl.float32)
        s1 = tl.zeros((BLOCK,), tl.float32)
        s2 = tl.zeros((BLOCK,), tl.float32)
        for kb in range(0, kb_end):
            x, mask = _masked_tile(qi, ki_base, stride_kn, kb * BLOCK + offs, feat, feat_ok, valid_row, rows,
                                   row_ok, M, qk_scale, CAUSAL, PRECISION)
            t0, t1, t2 = _tau_sums(x, mask, tau, p_exp, KIND)
            s0 += t0
            s1 += t1
            s2 += t2
        tau, lo, hi, done = _tau_step(tau, lo, hi, done, s0, s1, s2, p_exp, f_tol, TAU_METHOD)
    # lo ≤ τ′ (module docstring); rounding slack only ever adds blocks
    limit = lo - margin - tau_slack * (1.0 + tl.abs(lo))
    limit = tl.where(live, limit, float("inf"))
    need_row = NEED + (bh * NQB + qb).to(tl.int64) * NKB
    for kb in range(0, kb_end):
        x, mask = _masked_tile(qi, ki_base, stride_kn, kb * BLOCK + offs, feat, feat_ok, valid_row, rows,
                               row_ok, M, qk_scale, CAUSAL, PRECISION)
        top = tl.max(tl.where(mask, x, float("-inf")), 1)
        need = tl.max((top >= limit).to(tl.int32), 0)
        tl.store(need_row + kb, need.to(tl.int8))
    tl.store(LIVE + bh.to(tl.int64) * N_PAD + rows, live.to(tl.int8))


@triton.jit
def _solve_rows(
    q, rows, row_ok, bh, block_row, kb_end, k_base, v_base, valid_row, TAU_IN, TAU_OUT, LIVE, OUT,
    stride_kn, stride_vn, M, N_PAD, qk_scale, p_exp, alpha, f_tol, feat, feat_ok,
    FROM_TAU: tl.constexpr, KIND: tl.constexpr, TAU_METHOD: tl.constexpr, CAUSAL: tl.constexpr,
    VALUE_DIM: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr,
):
    """τ and the output of one row group over the key blocks with ``block_row[b]`` ≠ 0 (``_solve_kernel``)."""
    offs = tl.arange(0, BLOCK)
    x_max = tl.full((BLOCK,), float("-inf"), tl.float32)
    count = tl.zeros((BLOCK,), tl.float32)
    for kb in range(0, kb_end):
        if tl.load(block_row + kb) != 0:
            x, mask = _masked_tile(q, k_base, stride_kn, kb * BLOCK + offs, feat, feat_ok, valid_row, rows,
                                   row_ok, M, qk_scale, CAUSAL, PRECISION)
            x_max = tl.maximum(x_max, tl.max(tl.where(mask, x, float("-inf")), 1))
            count += tl.sum(mask.to(tl.float32), 1)
    # τ is sought relative to the row maximum (in [−1, 0]): the search's relative tolerances then hold
    # absolutely, whatever the scores' magnitude
    top = tl.where(count > 0.0, x_max, 0.0)
    tau, lo, hi, done = _tau_start(tl.zeros((BLOCK,), tl.float32), count, alpha)
    if FROM_TAU:  # a lower bound of the root (clamped into the bracket against round-off)
        start = tl.load(TAU_IN + bh.to(tl.int64) * N_PAD + rows, mask=row_ok, other=0.0) - top
        lo = tl.minimum(tl.maximum(lo, start), hi)
        tau = lo
    steps = 0
    s0 = tl.zeros((BLOCK,), tl.float32)
    s1 = tl.zeros((BLOCK,), tl.float32)
    s2 = tl.zeros((BLOCK,), tl.float32)
    while (tl.min(done.to(tl.int32), 0) == 0) & (steps < _MAX_TAU_ITERS):
        s0 = tl.zeros((BLOCK,), tl.float32)
        s1 = tl.zeros((BLOCK,), tl.float32)
        s2 = tl.zeros((BLOCK,), tl.float32)
        for kb in range(0, kb_end):
            if tl.load(block_row + kb) != 0:
                x, mask = _masked_tile(q, k_base, stride_kn, kb * BLOCK + offs, feat, feat_ok, valid_row,
                                       rows, row_ok, M, qk_scale, CAUSAL, PRECISION)
                t0, t1, t2 = _tau_sums(x - top[:, None], mask, tau, p_exp, KIND)
                s0 += t0
                s1 += t1
                s2 += t2
        tau, lo, hi, done = _tau_step(tau, lo, hi, done, s0, s1, s2, p_exp, f_tol, TAU_METHOD)
        steps += 1
    if steps > 0:
        tau = _exact_step(tau, done & (count > 0.0), s0, s1, s2, KIND)

    feat_v = tl.arange(0, BLOCK_DV)
    feat_v_ok = feat_v < VALUE_DIM
    acc = tl.zeros((BLOCK, BLOCK_DV), tl.float32)
    total = tl.zeros((BLOCK,), tl.float32)
    for kb in range(0, kb_end):
        if tl.load(block_row + kb) != 0:
            cols = kb * BLOCK + offs
            x, mask = _masked_tile(q, k_base, stride_kn, cols, feat, feat_ok, valid_row, rows, row_ok, M,
                                   qk_scale, CAUSAL, PRECISION)
            u = tl.maximum(tl.where(mask, x - top[:, None] - tau[:, None], 0.0), 0.0)
            p, _ = _entmax_weights(u, p_exp, 0.0, KIND)
            v = tl.load(
                v_base + cols[:, None] * stride_vn + feat_v[None, :],
                mask=(cols < M)[:, None] & feat_v_ok[None, :],
                other=0.0,
            )
            acc += tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            total += tl.sum(p, 1)
    acc = acc / tl.where(total > 0.0, total, 1.0)[:, None]  # absorbs τ's last rounding
    out_rows = bh.to(tl.int64) * N_PAD + rows
    tl.store(
        OUT + out_rows[:, None] * VALUE_DIM + feat_v[None, :],
        acc,
        mask=row_ok[:, None] & feat_v_ok[None, :],
    )
    live = tl.load(LIVE + out_rows, mask=row_ok, other=0) != 0
    tau = tl.where(count > 0.0, tau + top, float("-inf"))
    tl.store(TAU_OUT + out_rows, tl.where(live, tau, float("inf")), mask=row_ok)


@triton.jit
def _solve_kernel(
    Q, K, V, VALID, BLOCKS, NEEDED, GATE, REDONE, LIVE, TAU_IN, TAU_OUT, OUT,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    H, N, M, N_PAD, NQB, NKB, qk_scale, p_exp, alpha, f_tol,
    FROM_TAU: tl.constexpr, VERIFY: tl.constexpr, KIND: tl.constexpr, TAU_METHOD: tl.constexpr,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr,
):
    """Exact α-entmax attention of one row group over its key blocks with BLOCKS[group, b] ≠ 0: τ by a
    max/count sweep and τ steps in registers (from the lower bound TAU_IN when FROM_TAU), then
    o = Σ p v / Σ p. Stores the output rows and τ (−∞ for a live query with no key in these blocks, +∞ for a
    query with no allowed key). Grid: (NQB, batch·heads).

    VERIFY (the redo launch): only row groups with GATE[group] ≠ 0 run, and first score the blocks that are
    in BLOCKS but not in NEEDED against TAU_IN = τ_S: when no allowed key there has x > τ_S, those keys add
    nothing to F at τ_S, so τ_S is the row's τ and the output already stored (from NEEDED's blocks) stands.
    Otherwise the group is solved again over BLOCKS and REDONE[group] is set."""
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    group = (bh * NQB + qb).to(tl.int64)
    run = True
    if VERIFY:
        run = tl.load(GATE + group) != 0
    if run:
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        rows = qb * BLOCK + offs
        row_ok = rows < N
        feat = tl.arange(0, BLOCK_D)
        feat_ok = feat < HEAD_DIM
        q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + feat[None, :],
                    mask=row_ok[:, None] & feat_ok[None, :], other=0.0)
        k_base = K + b * stride_kb + h * stride_kh
        v_base = V + b * stride_vb + h * stride_vh
        valid_row = VALID + b * M
        block_row = BLOCKS + group * NKB
        kb_end = tl.minimum(qb + 1, NKB) if CAUSAL else NKB
        again = True
        if VERIFY:
            tau_s = tl.load(TAU_IN + bh.to(tl.int64) * N_PAD + rows, mask=row_ok, other=float("inf"))
            over = tl.zeros((BLOCK,), tl.int32)
            for kb in range(0, kb_end):
                if (tl.load(block_row + kb) != 0) & (tl.load(NEEDED + group * NKB + kb) == 0):
                    x, mask = _masked_tile(q, k_base, stride_kn, kb * BLOCK + offs, feat, feat_ok, valid_row,
                                           rows, row_ok, M, qk_scale, CAUSAL, PRECISION)
                    over = tl.maximum(over, tl.max((mask & (x > tau_s[:, None])).to(tl.int32), 1))
            again = tl.max(over, 0) > 0
            tl.store(REDONE + group, again.to(tl.int8))
        if again:
            _solve_rows(q, rows, row_ok, bh, block_row, kb_end, k_base, v_base, valid_row, TAU_IN, TAU_OUT,
                        LIVE, OUT, stride_kn, stride_vn, M, N_PAD, qk_scale, p_exp, alpha, f_tol, feat,
                        feat_ok, FROM_TAU, KIND, TAU_METHOD, CAUSAL, VALUE_DIM, BLOCK_DV, BLOCK, PRECISION)


@triton.jit
def _keep_kernel(
    QF, QNORM, KLOW, KHIGH, KNORM, BLOCK_LIVE, TAU, NEED, KEEP, CHECK,
    H, N, N_PAD, NQB, NKB, qk_scale, rounding, tau_slack,
    CAUSAL: tl.constexpr, CHANNELS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK: tl.constexpr,
    BLOCK_KB: tl.constexpr,
):
    """Certified pruning of one row group: KEEP[group, b] = 1 when some query's bound on block b exceeds its
    τ_S (module docstring); CHECK[group] = 1 when a kept block was not needed. Grid: (NQB, batch·heads).

    The bound on q_i·k_j over block b is Σ_c min(f_ic, 0)·low_bc + max(f_ic, 0)·high_bc with the query
    factors QF (G, N, C) and the block ranges KLOW, KHIGH (G, NKB, C) of :func:`_bound_factors`, plus
    ``rounding``·|q_i|·max_{j∈b} |k_j| (QNORM, KNORM) for the fp32 rounding of the bound and of the scores."""
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    group = (bh * NQB + qb).to(tl.int64)
    b = (bh // H).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    rows = qb * BLOCK + offs
    row_ok = rows < N
    chan = tl.arange(0, BLOCK_C)
    chan_ok = chan < CHANNELS
    at_rows = bh.to(tl.int64) * N + rows
    f = tl.load(QF + at_rows[:, None] * CHANNELS + chan[None, :], mask=row_ok[:, None] & chan_ok[None, :],
                other=0.0)
    f_pos = tl.maximum(f, 0.0)
    f_neg = tl.minimum(f, 0.0)
    q_norm = tl.load(QNORM + at_rows, mask=row_ok, other=0.0)
    tau = tl.load(TAU + bh.to(tl.int64) * N_PAD + rows, mask=row_ok, other=float("inf"))
    finite = (tau > float("-inf")) & (tau < float("inf"))
    limit = tau - tau_slack * (1.0 + tl.abs(tl.where(finite, tau, 0.0)))
    kb_end = tl.minimum(qb + 1, NKB) if CAUSAL else NKB
    offs_kb = tl.arange(0, BLOCK_KB)
    check = tl.zeros((BLOCK_KB,), tl.int32)
    for start in range(0, kb_end, BLOCK_KB):
        kbs = start + offs_kb
        kb_ok = kbs < kb_end
        at = bh.to(tl.int64) * NKB + kbs  # (BLOCK_KB,) rows of the per-block tables
        tile_mask = chan_ok[:, None] & kb_ok[None, :]
        high = tl.load(KHIGH + at[None, :] * CHANNELS + chan[:, None], mask=tile_mask, other=0.0)
        low = tl.load(KLOW + at[None, :] * CHANNELS + chan[:, None], mask=tile_mask, other=0.0)
        bound = tl.dot(f_pos, high, input_precision="ieee") + tl.dot(f_neg, low, input_precision="ieee")
        k_norm = tl.load(KNORM + at, mask=kb_ok, other=0.0)
        bound += rounding * q_norm[:, None] * k_norm[None, :]
        above = (bound * qk_scale > limit[:, None]) & row_ok[:, None]
        block_live = tl.load(BLOCK_LIVE + b * NKB + kbs, mask=kb_ok, other=0) != 0
        keep = (tl.max(above.to(tl.int32), 0) > 0) & block_live & kb_ok
        need = tl.load(NEED + group * NKB + kbs, mask=kb_ok, other=0) != 0
        tl.store(KEEP + group * NKB + kbs, keep.to(tl.int8), mask=kb_ok)
        check = tl.maximum(check, (keep & ~need).to(tl.int32))
    tl.store(CHECK + group, tl.max(check, 0).to(tl.int8))
# fmt: on


# ----------------------------------------------------------------------------------------------- host side


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _bound_factors(
    q: torch.Tensor, k: torch.Tensor, valid: torch.Tensor, block: int, nkb: int
) -> tuple[torch.Tensor, ...]:
    """Factors of the keep pass's upper bound on q·k per (query, key block), as the PyTorch path takes it:
    in the keys' principal axes U (eigenvectors of Σ_j k_j k_jᵀ over valid keys, per batch·head, solved in
    float64; q·k = (Uᵀq)·(Uᵀk) for any orthonormal U, and in that basis the per-block ranges are narrow on
    all but a few axes), Quest's per-channel bound on the ``BOUND_AXES`` leading axes and Cauchy–Schwarz,
    |q_rest|·max_j |k_j,rest|, on the others as one more channel (the query factor ≥ 0, low = high).

    Returns query factors (G, n, C), block lows and highs (G, nkb, C) (0 on empty blocks), |q| (G, n),
    max_j |k_j| per block (G, nkb), which blocks hold a valid key (batch, nkb) int8, and the rounding
    coefficient: 8 (d + 2) eps plus twice U's measured loss of orthonormality ‖UᵀU − I‖ in fp32 (its
    terms, times |q|·max |k_j|, bound the fp32 errors of the bound and of an exact score). Costs
    O((n + m) d²) in matmuls and a batched d × d eigensolve.
    """
    b, h, n, d = q.shape
    m, G = k.shape[2], b * h
    c = min(BOUND_AXES, d)
    ok = valid[:, None, :, None]  # (b, 1, m, 1)
    keys = k.float() * ok
    basis = principal_axes((keys.mT @ keys).double()).float()  # (b, h, d, d), ascending
    eye = torch.eye(d, device=q.device)
    loss = float((basis.mT @ basis - eye).abs().sum(-1).amax())
    rounding = 8.0 * (d + 2) * _FP32_EPS + 2.0 * loss

    qr = q.float() @ basis  # (b, h, n, d)
    q_fac = torch.cat([qr[..., d - c :], qr[..., : d - c].norm(dim=-1, keepdim=True)], -1).reshape(G, n, -1)
    q_norm = q.float().norm(dim=-1).reshape(G, n)
    pad = nkb * block - m
    kr = torch.nn.functional.pad(k.float() @ basis, (0, 0, 0, pad)).view(b, h, nkb, block, d)
    live_key = torch.nn.functional.pad(valid, (0, pad)).view(b, 1, nkb, block, 1)
    lead = kr[..., d - c :]
    rest = kr[..., : d - c].norm(dim=-1, keepdim=True).masked_fill(~live_key, 0.0).amax(3)  # (b, h, nkb, 1)
    low = torch.cat([lead.masked_fill(~live_key, float("inf")).amin(3), rest], -1)
    high = torch.cat([lead.masked_fill(~live_key, float("-inf")).amax(3), rest], -1)
    block_live = live_key.view(b, nkb, block).any(-1)  # (b, nkb)
    empty = ~block_live[:, None, :, None]
    low, high = (x.masked_fill(empty, 0.0).reshape(G, nkb, -1).contiguous() for x in (low, high))
    raw = torch.nn.functional.pad(k.float().norm(dim=-1), (0, pad)).view(b, h, nkb, block)
    k_norm = raw.masked_fill(~live_key[..., 0], 0.0).amax(-1).reshape(G, nkb).contiguous()
    return (
        q_fac.contiguous(),
        low,
        high,
        q_norm.contiguous(),
        k_norm,
        block_live.to(torch.int8).contiguous(),
        rounding,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Passes:
    """What the four launches leave (for inspection and tests): fp32 output rows (G, n_pad, d_v), τ_S
    (G, n_pad), int8 flags NEED and KEEP (G·nqb, nkb), CHECK (row groups that kept a block they did not
    need) and REDO (those solved again) (G·nqb,), LIVE (G, n_pad), and which key blocks hold a valid key
    (batch, nkb); row group g·nqb + qb is query block qb of batch·head g."""

    out: torch.Tensor
    tau_s: torch.Tensor
    need: torch.Tensor
    keep: torch.Tensor
    check: torch.Tensor
    redo: torch.Tensor
    live: torch.Tensor
    block_live: torch.Tensor
    block: int
    times: dict[str, float] = field(default_factory=dict)


def certified_passes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_index: torch.Tensor,
    k_index: torch.Tensor,
    *,
    alpha: float,
    causal: bool,
    key_valid: torch.Tensor | None,
    scale: float | None,
    margin: float,
    block: int,
    timed: bool = False,
) -> Passes:
    """Run the four launches (module docstring) on unvalidated arguments; ``timed`` synchronises the device
    between phases to time them."""
    batch, heads, n, d = q.shape
    m, d_v, r = k.shape[2], v.shape[3], q_index.shape[3]
    alpha = float(alpha)
    scale = d**-0.5 if scale is None else float(scale)
    dev = q.device
    B = tile_size(block)
    G, nqb, nkb = batch * heads, triton.cdiv(n, B), triton.cdiv(m, B)
    n_pad = nqb * B
    q, k, v, q_index, k_index = (
        x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v, q_index, k_index)
    )
    q_index, k_index = q_index.detach(), k_index.detach()
    valid = torch.ones(batch, m, dtype=torch.bool, device=dev) if key_valid is None else key_valid
    kind, method = _normalizer(alpha)
    qk_scale, p_exp = scale * (alpha - 1.0), 1.0 / (alpha - 1.0)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp16/bf16 ignore it (tensor cores)
    interpreted = dev.type != "cuda"
    launch = dict(num_warps=1 if interpreted else 4, num_stages=1 if interpreted else 2)
    clock, times = time.perf_counter(), {"indexer_s": 0.0, "bounds_s": 0.0, "sparse_s": 0.0}

    def lap(name: str) -> None:
        nonlocal clock
        if timed:
            _sync(dev)
            now = time.perf_counter()
            times[name] += now - clock
            clock = now

    valid_i8 = valid.to(torch.int8).contiguous()
    need = torch.zeros(G * nqb, nkb, dtype=torch.int8, device=dev)
    live = torch.zeros(G, n_pad, dtype=torch.int8, device=dev)
    _indexer_kernel[(nqb, G)](
        q_index, k_index, valid_i8, need, live, *_strides(q_index), *_strides(k_index),
        heads, n, m, n_pad, nqb, nkb, r, qk_scale, p_exp, alpha, float(margin), _TAU_F_TOL, _TAU_SLACK,
        KIND=kind, TAU_METHOD=method, STEPS=INDEX_STEPS, CAUSAL=causal,
        R_PAD=max(16, triton.next_power_of_2(r)), BLOCK=B, PRECISION=precision, **launch,
    )  # fmt: skip
    lap("indexer_s")

    out = torch.zeros(G, n_pad, d_v, dtype=torch.float32, device=dev)
    tau_s = torch.empty(G, n_pad, dtype=torch.float32, device=dev)
    solve = dict(
        KIND=kind, TAU_METHOD=method, CAUSAL=causal, HEAD_DIM=d, VALUE_DIM=d_v,
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=max(16, triton.next_power_of_2(d_v)), BLOCK=B,
        PRECISION=precision, **launch,
    )  # fmt: skip
    common = (
        *_strides(q), *_strides(k), *_strides(v), heads, n, m, n_pad, nqb, nkb, qk_scale, p_exp, alpha,
        _TAU_F_TOL,
    )  # fmt: skip
    _solve_kernel[(nqb, G)](
        q, k, v, valid_i8, need, need, need, need, live, tau_s, tau_s, out, *common,
        FROM_TAU=False, VERIFY=False, **solve,
    )  # fmt: skip
    lap("sparse_s")

    q_fac, low, high, q_norm, k_norm, block_live, rounding = _bound_factors(q, k, valid, B, nkb)
    keep = torch.zeros_like(need)
    check = torch.empty(G * nqb, dtype=torch.int8, device=dev)
    channels = q_fac.shape[-1]
    _keep_kernel[(nqb, G)](
        q_fac, q_norm, low, high, k_norm, block_live, tau_s, need, keep, check,
        heads, n, n_pad, nqb, nkb, qk_scale, rounding, _TAU_SLACK,
        CAUSAL=causal, CHANNELS=channels, BLOCK_C=max(16, triton.next_power_of_2(channels)), BLOCK=B,
        BLOCK_KB=KEY_BLOCKS_PER_BOUND, **launch,
    )  # fmt: skip
    lap("bounds_s")

    scratch = torch.empty_like(tau_s)
    redo = torch.zeros_like(check)
    _solve_kernel[(nqb, G)](
        q, k, v, valid_i8, keep, need, check, redo, live, tau_s, scratch, out, *common,
        FROM_TAU=True, VERIFY=True, **solve,
    )  # fmt: skip
    lap("sparse_s")
    return Passes(out, tau_s, need, keep, check, redo, live, block_live, B, times)


def triton_indexed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_index: torch.Tensor,
    k_index: torch.Tensor,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    key_valid: torch.Tensor | None = None,
    scale: float | None = None,
    margin: float = 0.0,
    block: int = 32,
    return_stats: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]:
    """Certified indexed α-entmax attention (α > 1) in Triton, forward only; (b, h, n, d_v) in q's dtype.

    Arguments as :func:`attention_kernels.indexed.attention.indexed_attention` (which validates them: call it
    with ``backend="triton"``); tiles are ``tile_size(block)``. CUDA tensors in fp16/bf16/fp32, or CPU tensors
    under ``TRITON_INTERPRET=1``. With ``return_stats`` also the torch path's statistics (``blocks_skipped``:
    share of the allowed (row group, key block) pairs whose exact scores were never computed: neither
    needed nor checked in step 4; ``recomputed``: share of row groups redone;
    ``predicted_mean``: mean number of valid keys in a live query's needed blocks; ``filled`` = 0) and
    seconds per phase (the device is synchronised between phases only then).
    """
    batch, heads, n, _ = q.shape
    passes = certified_passes(
        q, k, v, q_index, k_index, alpha=alpha, causal=causal, key_valid=key_valid, scale=scale,
        margin=margin, block=block, timed=return_stats,
    )  # fmt: skip
    result = passes.out[:, :n].reshape(batch, heads, n, -1).to(q.dtype)
    if not return_stats:
        return result
    valid = (
        torch.ones(batch, k.shape[2], dtype=torch.bool, device=q.device) if key_valid is None else key_valid
    )
    return result, _stats(passes, valid, causal)


def _stats(passes: Passes, valid: torch.Tensor, causal: bool) -> dict[str, float]:
    """The statistics ``indexed_attention`` reports, from the pass flags (one host synchronisation)."""
    B, live = passes.block, passes.live
    G, nkb = live.shape[0], passes.need.shape[1]
    nqb = live.shape[1] // B
    batch = valid.shape[0]
    heads = G // batch
    need, keep = passes.need.bool(), passes.keep.bool()
    check, redo = passes.check.bool(), passes.redo.bool()
    group_live = live.view(G, nqb, B).bool().any(-1).view(-1)  # (G·nqb,)
    allowed = passes.block_live.bool().repeat_interleave(heads * nqb, 0) & group_live[:, None]  # (G·nqb, nkb)
    if causal:
        qb = torch.arange(G * nqb, device=need.device) % nqb
        allowed &= torch.arange(nkb, device=need.device) <= qb[:, None]
    scored = float((need | (keep & check[:, None])).sum())  # pairs scored exactly at least once
    total = float(allowed.sum())
    per_block = torch.nn.functional.pad(valid, (0, nkb * B - valid.shape[1])).view(batch, nkb, B).sum(-1)
    per_group = (need.view(batch, heads * nqb, nkb) * per_block[:, None]).sum(-1).view(G, nqb)
    queries = live.view(G, nqb, B).sum(-1)
    return {
        "blocks_skipped": 1.0 - scored / total if total else 0.0,
        "recomputed": float(redo.sum()) / (G * nqb),
        "predicted_mean": float((per_group * queries).sum()) / max(float(queries.sum()), 1.0),
        "filled": 0.0,
        **passes.times,
    }
