"""Triton bucketed sparse attention (forward and backward), softmax and α-entmax.

Query i attends key j iff they share a bucket id ≥ 0, or |i − j| ≤ radius (radius ≥ 0; −1 is no window), or
i < global_tokens, or j < global_tokens; and j ≤ i when causal. Each pair counts once however many
buckets it shares. With s_ij = scale · q_i·k_j over that set A_i:

    softmax (α = 1):  p_ij = exp(s_ij − lse_i)
    α-entmax (α > 1): p_ij = [(α − 1) s_ij − τ_i]₊^{1/(α−1)},  τ_i such that Σ_{j∈A_i} p_ij = 1
    o_i = Σ_{j∈A_i} p_ij v_j   (zeros when A_i = ∅)

The dense O(n²) reference is ``attention_kernels.bucketed.reference.dense_bucketed_attention``.

Work layout (per batch × head). Every token is duplicated into each of its ≤ T distinct bucket ids and the
copies ("entries") are sorted by (bucket, position), separately for queries and keys (the plan,
:mod:`attention_kernels.bucketed.triton_plan`). The attended set of a
query is split into disjoint parts, each computed by one program row and merged afterwards:

* bucket part: a query entry in bucket b meets the key entries of b; the pair is kept only if b is the
  smallest bucket the two tokens share (so a pair sharing several buckets counts once). A block of sorted
  query entries only visits the contiguous key-entry range of the buckets it spans (a binary search), so the
  work is Σ_b |queries in b|·|keys in b| up to block granularity, never n × m;
* pattern part (window band and global rows/columns), in original token order: pairs that share no bucket.

Causality always compares original positions, and a causal block's bucket range ends (queries) or starts
(keys) at its own positions in its edge bucket. Tiles whose mask is still empty are skipped before touching
K/V, unless the tiles say otherwise (``Tiles.skip_empty``).
Softmax runs flash-style online per part; parts merge by log-sum-exp. α-entmax needs τ over the whole row:
a safeguarded Halley (α = 1.5), Newton (other α ≤ 2) or bisection (α > 2) search on the bracket
τ ∈ [max x − 1, max x − |A_i|^{1−α}], x = (α − 1)s, each step evaluating Σ_j [x_ij − τ_i]₊^{1/(α−1)} (and
derivatives) in a pass over the row's keys, then one output pass. When one program meets all of a query's
keys (one bucket per query, no window or global tokens) the whole search runs inside that program, in one
launch with no host synchronisation; otherwise every step is a launch whose per-part sums are added per
token before the step (``_tau_kernel``), and the host stops once every row has converged.

Backward (ds_ij is the gradient with respect to s_ij):
    softmax:  ds_ij = p_ij (dp_ij − D_i),  D_i = dO_i·o_i
    entmax:   ds_ij = g_ij (dp_ij − D_i),  g_ij = p_ij^{2−α},  D_i = dO_i·(Σ_j g_ij v_j) / Σ_j g_ij
with dp_ij = dO_i·v_j; Σ_j g_ij v_j and Σ_j g_ij are accumulated by the forward output pass. For α > 2,
where g is unbounded, the products with g and ds run in fp32 whatever the input dtype (``_weighted_dot``).
dq is computed query-major, dk and dv key-major (no atomics, deterministic); per-entry partial sums are
gathered back to tokens with torch ops.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from attention_kernels.attended import has_pattern
from attention_kernels.bucketed.triton_plan import Side, bucket_ranges, build_side, pattern_ranges

# Query-major pass modes (compile-time constants of the kernels).
_SOFTMAX_FWD = tl.constexpr(0)  # online softmax: (o_part, lse_part)
_ENTMAX_MAX = tl.constexpr(1)  # max of x = (α−1)s and |A_i| per part
_ENTMAX_TAU = tl.constexpr(2)  # Σ u^{1/(α−1)}, Σ u^{1/(α−1)−1}, #(u > 0) with u = [x − τ]₊
_ENTMAX_OUT = tl.constexpr(3)  # Σ p v, Σ p (and Σ g v, Σ g for the backward)
_DQ = tl.constexpr(4)  # Σ ds k
_ENTMAX_SOLVE = tl.constexpr(5)  # MAX, then TAU passes and τ steps in registers, then OUT: rows owned whole

# Normalizer kinds: the common α get exact closed-form powers instead of exp2/log2.
_KIND_SOFTMAX = tl.constexpr(0)
_KIND_ENTMAX15 = tl.constexpr(1)
_KIND_SPARSEMAX = tl.constexpr(2)
_KIND_ENTMAX = tl.constexpr(3)  # 1 < α < 2, other than 1.5
_KIND_ENTMAX_STEEP = tl.constexpr(4)  # α > 2: g = p^{2−α} grows without bound at the support's edge

# τ update rules: Halley for α = 1.5, Newton for other α ≤ 2, bisection for α > 2.
_TAU_HALLEY = tl.constexpr(0)
_TAU_NEWTON = tl.constexpr(1)
_TAU_BISECT = tl.constexpr(2)

_LOG2E = 1.4426950408889634
_MAX_TAU_ITERS = tl.constexpr(64)
TAU_BLOCK = 1024  # rows per program of the elementwise τ step
# |Σ p − 1| at which τ is accepted; the output is renormalized by Σ p, so half-precision inputs, whose
# output rounding is ~1e-3, stop earlier. For α > 2 a small |f| does not bound the error of p ∝ u^{1/(α−1)}
# where u is small, so the bisection runs until its bracket holds no float (``_tau_step``).
_TAU_F_TOL = {torch.float32: 1e-6, torch.float16: 1e-4, torch.bfloat16: 1e-4}
# relative τ step at which Newton/Halley stop: steps that small are fp32 noise
_TAU_STEP_TOL = tl.constexpr(2.0**-22)
# bracket width at which the bisection stops even though floats remain inside (only for |τ| ≲ 2⁻²⁶, where
# it bounds the steps at about 50 instead of up to 150)
_TAU_BISECT_WIDTH = tl.constexpr(2.0**-50)
# factor on the τ bracket's upper offset count^{1−α} (_tau_start): 16 float32 ulps below 1
_TAU_HI_SHORT = tl.constexpr(1.0 - 2.0**-20)


# ----------------------------------------------------------------------------------------------- masks


@triton.jit
def _bucket_mask(
    row_tok, row_bkt, row_rank, row_ok, row_ids, col_tok, col_bkt, col_rank, col_ok, col_ids,
    CAUSAL: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr,
):
    """(BM, BN) pairs of a query entry and a key entry met in their common bucket, counted there only if
    that bucket is the smallest id the two tokens share. Ids per token are sorted ascending, so the ids
    smaller than an entry's bucket are exactly those of lower rank. ``row_ids``/``col_ids`` point at each
    token's ids."""
    mask = (row_bkt[:, None] == col_bkt[None, :]) & row_ok[:, None] & col_ok[None, :]
    if CAUSAL:
        mask = mask & (col_tok[None, :] <= row_tok[:, None])
    if T_Q > 1 and T_K > 1:
        for tq in tl.static_range(T_Q - 1):
            # −1 / −2 fill: ids of rank ≥ entry rank never match anything
            qid = tl.load(row_ids + tq, mask=row_ok & (tq < row_rank), other=-1)
            for tk in tl.static_range(T_K - 1):
                kid = tl.load(col_ids + tk, mask=col_ok & (tk < col_rank), other=-2)
                mask = mask & (qid[:, None] != kid[None, :])
    return mask


@triton.jit
def _pattern_mask(
    row_tok, row_ok, row_ids, col_tok, col_ok, col_ids, radius, global_tokens,
    CAUSAL: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr,
):
    """(BM, BN) window/global pairs (original positions) that share no bucket: shared pairs belong to the
    bucket part. ``radius`` < 0 disables the band."""
    diff = row_tok[:, None] - col_tok[None, :]
    mask = (diff <= radius) & (diff >= -radius)
    mask = mask | (row_tok[:, None] < global_tokens) | (col_tok[None, :] < global_tokens)
    mask = mask & row_ok[:, None] & col_ok[None, :]
    if CAUSAL:
        mask = mask & (diff >= 0)
    for tq in tl.static_range(T_Q):
        # q ids use −1 and k ids −2 for "none", so missing ids never look shared
        qid = tl.load(row_ids + tq, mask=row_ok, other=-1)
        for tk in tl.static_range(T_K):
            kid = tl.load(col_ids + tk, mask=col_ok, other=-2)
            mask = mask & (qid[:, None] != kid[None, :])
    return mask


@triton.jit
def _entmax_weights(u, p_exp, g_exp, KIND: tl.constexpr):
    """p = u^{1/(α−1)} and g = ∂p/∂s = u^{(2−α)/(α−1)} for u = [x − τ]₊ ≥ 0 (fp32)."""
    pos = u > 0.0
    if KIND == _KIND_ENTMAX15:
        p = u * u
        g = u
    elif KIND == _KIND_SPARSEMAX:
        p = u
        g = pos.to(tl.float32)
    else:
        lu = tl.log2(tl.where(pos, u, 1.0))
        p = tl.where(pos, tl.exp2(p_exp * lu), 0.0)
        g = tl.where(pos, tl.exp2(g_exp * lu), 0.0)
    return p, g


@triton.jit
def _weighted_dot(w, x, KIND: tl.constexpr, PRECISION: tl.constexpr):
    """w x for fp32 weights w (BM, BN) and x (BN, D): w rounded to x's dtype (tensor cores for fp16/bf16),
    except for α > 2, where the product runs in fp32. There g = p^{2−α} ≥ 1 is unbounded, and both
    D_i = dO_i·Σ g v / Σ g and ds = g (dp − D) need g's full precision: rounding g to fp16 moves D by
    2⁻¹¹ |dO||v|, which ds multiplies by g again (dq and dk then err tens of times more than the dense
    reference's fp16 evaluation does), and past 65504 an fp16 g is infinite."""
    if KIND == _KIND_ENTMAX_STEEP:
        return tl.dot(w, x.to(tl.float32), input_precision="ieee")
    return tl.dot(w.to(x.dtype), x, input_precision=PRECISION)


@triton.jit
def _probs_and_grad_weights(s, mask, stat, p_exp, g_exp, KIND: tl.constexpr):
    """(p, w) for a score tile given the row statistic: softmax w = p; entmax w = g = p^{2−α}."""
    if KIND == _KIND_SOFTMAX:
        p = tl.exp2(tl.where(mask, s - stat[:, None], float("-inf")))
        w = p
    else:
        u = tl.maximum(tl.where(mask, s - stat[:, None], 0.0), 0.0)
        p, w = _entmax_weights(u, p_exp, g_exp, KIND)
    return p, w


@triton.jit
def _tau_start(x_max, count, alpha):
    """Bracket [lo, hi] of τ for rows with max x = ``x_max`` over ``count`` keys, where
    f(τ) = Σ [x − τ]₊^{1/(α−1)} − 1 has f(max x − 1) ≥ 0 ≥ f(max x − count^{1−α}).
    Returns (τ = lo, lo, hi, done = row is empty)."""
    done = count == 0.0
    x_max = tl.where(done, 0.0, x_max)
    lo = x_max - 1.0
    # count^{1−α} a little short: compiled exp2 and log2 are approximate (a few ulps), and a flat row's root
    # is this end exactly, which the bracket must keep inside (f decreases, so a higher end stays valid)
    hi = x_max - tl.exp2((1.0 - alpha) * tl.log2(tl.maximum(count, 1.0))) * _TAU_HI_SHORT
    return lo, lo, hi, done


@triton.jit
def _tau_step(tau, lo, hi, done, s0, s1, s2, p_exp, f_tol, METHOD: tl.constexpr):
    """One safeguarded step of the root search for τ, given the TAU-pass sums at τ: s0 = Σ u^{1/(α−1)},
    s1 = Σ u^{1/(α−1)−1}, s2 = #(u > 0), u = [x − τ]₊ (for α = 1.5: s0 = Σ u², s1 = Σ u).

    f = s0 − 1 is decreasing; for α ≤ 2 it is convex, so Newton (f′ = −s1/(α−1)) or Halley (α = 1.5:
    f′ = −2 s1, f″ = 2 s2) steps from the lower end climb monotonically to the root. A step leaving the
    shrinking bracket, or NaN, bisects instead. For α > 2 |f′| explodes as some u → 0⁺ and Newton stalls, so
    the bracket is bisected until no float lies strictly inside it (or it is 2⁻⁵⁰ wide, which matters only
    for |τ| ≲ 2⁻²⁶), and τ settles on its lower end, where f > 0 was seen, as entmax's bisection does: p ∝
    u^{1/(α−1)} is so steep at the support's edge that a τ a few ulps from the root moves the output
    several times more than the reference's rounding. Rows that converge (|f| ≤ f_tol, a negligible Newton
    step, a collapsed bracket, which sets τ to its lower end) keep their τ from then on; the residual is
    absorbed by the output pass renormalizing by Σ p."""
    f = s0 - 1.0
    done = done | (tl.abs(f) <= f_tol)
    lo = tl.where(f > 0.0, tau, lo)
    hi = tl.where(f > 0.0, hi, tau)
    new = 0.5 * (lo + hi)
    if METHOD == _TAU_BISECT:
        # no float strictly inside (a NaN row too), or as narrow as entmax's 50 halvings of a width ≤ 1
        collapsed = ~((new > lo) & (new < hi)) | (hi - lo <= _TAU_BISECT_WIDTH)
        tau = tl.where(done, tau, tl.where(collapsed, lo, new))
        done = done | collapsed
    else:
        if METHOD == _TAU_HALLEY:  # step = 2 f f′ / (2 f′² − f f″)
            df = -2.0 * s1
            num = 2.0 * f * df
            den = 2.0 * df * df - 2.0 * f * s2
        else:  # step = f / f′
            num = f
            den = -p_exp * s1
        usable = den != 0.0
        newton = tau - num / tl.where(usable, den, 1.0)
        new = tl.where(usable & (newton > lo) & (newton < hi), newton, new)
        done = done | (tl.abs(new - tau) <= _TAU_STEP_TOL * (1.0 + tl.abs(tau)))
        tau = tl.where(done, tau, new)
    return tau, lo, hi, done


@triton.jit
def _tau_kernel(SUMS, TAU, LO, HI, DONE, numel, alpha, p_exp, f_tol, START: tl.constexpr,
                METHOD: tl.constexpr, BLOCK: tl.constexpr):
    """Elementwise τ search state of rows split across programs. START: SUMS holds (max x, |A|, ·) per
    row and the bracket is set up; otherwise SUMS holds the TAU-pass sums and one step is taken."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    s0 = tl.load(SUMS + offs * 3, mask=ok, other=0.0)
    s1 = tl.load(SUMS + offs * 3 + 1, mask=ok, other=0.0)
    if START:
        tau, lo, hi, done = _tau_start(s0, s1, alpha)
    else:
        s2 = tl.load(SUMS + offs * 3 + 2, mask=ok, other=0.0)
        tau = tl.load(TAU + offs, mask=ok, other=0.0)
        lo = tl.load(LO + offs, mask=ok, other=0.0)
        hi = tl.load(HI + offs, mask=ok, other=0.0)
        done = tl.load(DONE + offs, mask=ok, other=1) != 0
        tau, lo, hi, done = _tau_step(tau, lo, hi, done, s0, s1, s2, p_exp, f_tol, METHOD)
    tl.store(TAU + offs, tau, mask=ok)
    tl.store(LO + offs, lo, mask=ok)
    tl.store(HI + offs, hi, mask=ok)
    tl.store(DONE + offs, done.to(tl.int8), mask=ok)


@triton.jit
def _entry_block(TOK, BKT, RANK, B_RANGES, bh, blk, NE, NB_BUCKET, offs, none, BLOCK: tl.constexpr):
    """Block ``blk`` of one side's sorted entries: (entry rows, token, bucket, rank, in range) and the
    [lo, hi) range of the other side's entries it meets. Padding entries get the side's ``none`` bucket."""
    rows = blk * BLOCK + offs
    in_range = rows < NE
    tab = bh * NE + rows
    tok = tl.load(TOK + tab, mask=in_range, other=0)
    bkt = tl.load(BKT + tab, mask=in_range, other=none)
    rank = tl.load(RANK + tab, mask=in_range, other=0)
    lo = tl.load(B_RANGES + (bh * NB_BUCKET + blk) * 2)
    hi = tl.load(B_RANGES + (bh * NB_BUCKET + blk) * 2 + 1)
    return rows, tok, bkt, rank, in_range, lo, hi


# ------------------------------------------------------------------------------------ query-major pass


@triton.jit
def _rows_range(
    acc, acc2, r0, r1, r2, lo, hi,
    q, do, stat, delta, row_tok, row_bkt, row_rank, row_ok, row_ids,
    k_base, v_base, stride_kn, stride_vn, k_tok_tab, k_bkt_tab, k_rank_tab, k_ids,
    qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
    IS_BUCKET: tl.constexpr, MODE: tl.constexpr, KIND: tl.constexpr, NEED_U: tl.constexpr,
    CAUSAL: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, SKIP_EMPTY: tl.constexpr,
):
    """Accumulate one block of query rows over key columns [lo, hi): key entries (bucket part) or key
    positions (pattern part)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < hi
        if IS_BUCKET:
            col_tok = tl.load(k_tok_tab + cols, mask=col_ok, other=0)
            col_bkt = tl.load(k_bkt_tab + cols, mask=col_ok, other=-2)
            col_rank = tl.load(k_rank_tab + cols, mask=col_ok, other=0)
            mask = _bucket_mask(row_tok, row_bkt, row_rank, row_ok, row_ids, col_tok, col_bkt, col_rank,
                                col_ok, k_ids + col_tok * T_K, CAUSAL, T_Q, T_K)
        else:
            col_tok = cols
            mask = _pattern_mask(row_tok, row_ok, row_ids, col_tok, col_ok, k_ids + col_tok * T_K, radius,
                                 global_tokens, CAUSAL, T_Q, T_K)
        # Tiles with no attended pair (other buckets in range, causal cut) cost no K/V traffic when skipped,
        # but a load under a branch is not software-pipelined: SKIP_EMPTY = False trades one for the other.
        if (not SKIP_EMPTY) or tl.max(mask.to(tl.int32)) > 0:
            kv_mask = col_ok[:, None] & d_ok[None, :]
            k = tl.load(k_base + col_tok[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BM, BN) fp32
            if MODE == _SOFTMAX_FWD:
                s = tl.where(mask, s, float("-inf"))
                m_new = tl.maximum(r0, tl.max(s, 1))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows still empty stay at zero
                p = tl.exp2(s - m_use[:, None])
                corr = tl.exp2(r0 - m_use)
                v = tl.load(v_base + col_tok[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
                r1 = r1 * corr + tl.sum(p, 1)
                acc = acc * corr[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                r0 = m_new
            elif MODE == _ENTMAX_MAX:
                r0 = tl.maximum(r0, tl.max(tl.where(mask, s, float("-inf")), 1))
                r1 += tl.sum(mask.to(tl.float32), 1)
            elif MODE == _ENTMAX_TAU:
                u = tl.maximum(tl.where(mask, s - stat[:, None], 0.0), 0.0)
                if KIND == _KIND_ENTMAX15:
                    r0 += tl.sum(u * u, 1)
                    r1 += tl.sum(u, 1)
                    r2 += tl.sum((u > 0.0).to(tl.float32), 1)
                elif KIND == _KIND_SPARSEMAX:
                    r0 += tl.sum(u, 1)
                    r1 += tl.sum((u > 0.0).to(tl.float32), 1)
                else:
                    pos = u > 0.0
                    lu = tl.log2(tl.where(pos, u, 1.0))
                    r0 += tl.sum(tl.where(pos, tl.exp2(p_exp * lu), 0.0), 1)
                    r1 += tl.sum(tl.where(pos, tl.exp2((p_exp - 1.0) * lu), 0.0), 1)
            elif MODE == _ENTMAX_OUT:
                u = tl.maximum(tl.where(mask, s - stat[:, None], 0.0), 0.0)
                p, g = _entmax_weights(u, p_exp, g_exp, KIND)
                v = tl.load(v_base + col_tok[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
                acc += tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                r0 += tl.sum(p, 1)
                if NEED_U:
                    acc2 += _weighted_dot(g, v, KIND, PRECISION)
                    r1 += tl.sum(g, 1)
            else:
                p, w = _probs_and_grad_weights(s, mask, stat, p_exp, g_exp, KIND)
                v = tl.load(v_base + col_tok[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
                dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BM, BN)
                ds = w * (dp - delta[:, None])
                acc += _weighted_dot(ds, k, KIND, PRECISION)
    return acc, acc2, r0, r1, r2


@triton.jit
def _rows_block(
    Q, K, V, DO, ROW_STAT, ROW_DELTA, Q_IDS, K_IDS, K_TOK, K_BKT, K_RANK,
    ACC, ACC2, STATS,
    b, h, bh, row_tok, row_bkt, row_rank, row_ok, out_rows,
    lo_a, hi_a, lo_b, hi_b,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
    N, M, NE_K, N_OUT, qk_scale, radius, global_tokens, p_exp, g_exp, alpha, tau_tol,
    IS_BUCKET: tl.constexpr, MODE: tl.constexpr, KIND: tl.constexpr, NEED_U: tl.constexpr,
    TAU_METHOD: tl.constexpr, CAUSAL: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, SKIP_EMPTY: tl.constexpr,
):
    """Load a block of query rows, run it over its one or two column ranges, store per-entry results."""
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_d_mask = row_ok[:, None] & d_ok[None, :]
    q_base = Q + b * stride_qb + h * stride_qh
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    q = tl.load(q_base + row_tok[:, None] * stride_qn + offs_d[None, :], mask=row_d_mask, other=0.0)
    stat = tl.load(ROW_STAT + bh * N + row_tok, mask=row_ok, other=0.0)
    if MODE == _DQ:
        do = tl.load(DO + b * stride_ob + h * stride_oh + row_tok[:, None] * stride_on + offs_d[None, :],
                     mask=row_d_mask, other=0.0)
        delta = tl.load(ROW_DELTA + bh * N + row_tok, mask=row_ok, other=0.0)
    else:
        do = q  # unused outside the dq pass
        delta = stat
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    zero = tl.zeros((BLOCK_M,), dtype=tl.float32)
    r0 = zero + float("-inf") if MODE <= _ENTMAX_MAX else zero  # the first two modes keep a running max
    r1 = zero
    r2 = zero

    row_ids = Q_IDS + bh * N * T_Q + row_tok * T_Q
    k_ids = K_IDS + bh * M * T_K
    k_tab = bh * NE_K
    if MODE == _ENTMAX_SOLVE:
        # the block holds every key of its rows: τ is found here, with no round trip to the host
        acc, acc2, x_max, count, r2 = _rows_range(
            acc, acc2, zero + float("-inf"), zero, zero, lo_a, hi_a, q, do, stat, delta, row_tok, row_bkt,
            row_rank, row_ok, row_ids, k_base, v_base, stride_kn, stride_vn, K_TOK + k_tab, K_BKT + k_tab,
            K_RANK + k_tab, k_ids, qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
            IS_BUCKET, _ENTMAX_MAX, KIND, NEED_U, CAUSAL, T_Q, T_K, BLOCK_N, PRECISION, SKIP_EMPTY)
        tau, lo, hi, done = _tau_start(x_max, count, alpha)
        done = done | ~row_ok
        steps = 0
        while (tl.min(done.to(tl.int32), 0) == 0) & (steps < _MAX_TAU_ITERS):
            acc, acc2, s0, s1, s2 = _rows_range(
                acc, acc2, zero, zero, zero, lo_a, hi_a, q, do, tau, delta, row_tok, row_bkt, row_rank,
                row_ok, row_ids, k_base, v_base, stride_kn, stride_vn, K_TOK + k_tab, K_BKT + k_tab,
                K_RANK + k_tab, k_ids, qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
                IS_BUCKET, _ENTMAX_TAU, KIND, NEED_U, CAUSAL, T_Q, T_K, BLOCK_N, PRECISION, SKIP_EMPTY)
            tau, lo, hi, done = _tau_step(tau, lo, hi, done, s0, s1, s2, p_exp, tau_tol, TAU_METHOD)
            steps += 1
        acc, acc2, r0, r1, _ = _rows_range(
            acc, acc2, r0, r1, r2, lo_a, hi_a, q, do, tau, delta, row_tok, row_bkt, row_rank, row_ok,
            row_ids, k_base, v_base, stride_kn, stride_vn, K_TOK + k_tab, K_BKT + k_tab, K_RANK + k_tab,
            k_ids, qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
            IS_BUCKET, _ENTMAX_OUT, KIND, NEED_U, CAUSAL, T_Q, T_K, BLOCK_N, PRECISION, SKIP_EMPTY)
        r2 = tau
    else:
        acc, acc2, r0, r1, r2 = _rows_range(
            acc, acc2, r0, r1, r2, lo_a, hi_a, q, do, stat, delta, row_tok, row_bkt, row_rank, row_ok,
            row_ids, k_base, v_base, stride_kn, stride_vn, K_TOK + k_tab, K_BKT + k_tab, K_RANK + k_tab,
            k_ids, qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
            IS_BUCKET, MODE, KIND, NEED_U, CAUSAL, T_Q, T_K, BLOCK_N, PRECISION, SKIP_EMPTY)
    if not IS_BUCKET:
        acc, acc2, r0, r1, r2 = _rows_range(
            acc, acc2, r0, r1, r2, lo_b, hi_b, q, do, stat, delta, row_tok, row_bkt, row_rank, row_ok,
            row_ids, k_base, v_base, stride_kn, stride_vn, K_TOK + k_tab, K_BKT + k_tab, K_RANK + k_tab,
            k_ids, qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
            IS_BUCKET, MODE, KIND, NEED_U, CAUSAL, T_Q, T_K, BLOCK_N, PRECISION, SKIP_EMPTY)

    out = bh.to(tl.int64) * N_OUT + out_rows  # (BM,) rows of the per-entry outputs
    out_d = out[:, None] * HEAD_DIM + offs_d[None, :]
    if MODE == _SOFTMAX_FWD:
        nonempty = r1 > 0.0
        acc = acc / tl.where(nonempty, r1, 1.0)[:, None]
        r0 = tl.where(nonempty, r0 + tl.log2(tl.where(nonempty, r1, 1.0)), float("-inf"))
    if MODE != _ENTMAX_MAX and MODE != _ENTMAX_TAU:
        tl.store(ACC + out_d, acc, mask=row_d_mask)
    if NEED_U:  # set for the entmax output passes only
        tl.store(ACC2 + out_d, acc2, mask=row_d_mask)
    if MODE != _DQ:
        tl.store(STATS + out * 3, r0, mask=row_ok)
        tl.store(STATS + out * 3 + 1, r1, mask=row_ok)
        tl.store(STATS + out * 3 + 2, r2, mask=row_ok)


@triton.jit
def _rows_kernel(
    Q, K, V, DO, ROW_STAT, ROW_DELTA,
    Q_IDS, K_IDS, Q_TOK, Q_BKT, Q_RANK, K_TOK, K_BKT, K_RANK, P_RANGES, B_RANGES,
    ACC, ACC2, STATS,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
    H, N, M, NE_Q, NE_K, NB_PATTERN, NB_BUCKET, N_OUT,
    qk_scale, radius, global_tokens, p_exp, g_exp, alpha, tau_tol,
    MODE: tl.constexpr, KIND: tl.constexpr, NEED_U: tl.constexpr, TAU_METHOD: tl.constexpr,
    CAUSAL: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    SKIP_EMPTY: tl.constexpr,
):
    """One program = one block of query rows: pattern blocks (original order) first, then blocks of
    sorted query entries. Grid: (NB_PATTERN + NB_BUCKET, batch·heads)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # int64: batch offsets can pass 2³¹ elements
    h = (bh % H).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    if pid < NB_PATTERN:
        if MODE != _ENTMAX_SOLVE:  # solved rows are owned whole by bucket blocks
            rows = pid * BLOCK_M + offs_m
            rng = P_RANGES + pid * 4
            _rows_block(
                Q, K, V, DO, ROW_STAT, ROW_DELTA, Q_IDS, K_IDS, K_TOK, K_BKT, K_RANK, ACC, ACC2, STATS,
                b, h, bh, rows, rows, rows, rows < N, NE_Q + rows,
                tl.load(rng), tl.load(rng + 1), tl.load(rng + 2), tl.load(rng + 3),
                stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                N, M, NE_K, N_OUT, qk_scale, radius, global_tokens, p_exp, g_exp, alpha, tau_tol,
                False, MODE, KIND, NEED_U, TAU_METHOD, CAUSAL, T_Q, T_K, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                PRECISION, SKIP_EMPTY)
    else:
        rows, row_tok, row_bkt, row_rank, in_range, lo, hi = _entry_block(
            Q_TOK, Q_BKT, Q_RANK, B_RANGES, bh, pid - NB_PATTERN, NE_Q, NB_BUCKET, offs_m, -1, BLOCK_M)
        _rows_block(
            Q, K, V, DO, ROW_STAT, ROW_DELTA, Q_IDS, K_IDS, K_TOK, K_BKT, K_RANK, ACC, ACC2, STATS,
            b, h, bh, row_tok, row_bkt, row_rank, in_range & (row_bkt >= 0), rows, lo, hi, 0, 0,
            stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
            N, M, NE_K, N_OUT, qk_scale, radius, global_tokens, p_exp, g_exp, alpha, tau_tol,
            True, MODE, KIND, NEED_U, TAU_METHOD, CAUSAL, T_Q, T_K, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
            PRECISION, SKIP_EMPTY)


# -------------------------------------------------------------------------------------- key-major pass


@triton.jit
def _cols_range(
    dk, dv, lo, hi, k, v, col_tok, col_bkt, col_rank, col_ok, col_ids,
    q_base, do_base, stride_qn, stride_on, row_stat, row_delta, q_tok_tab, q_bkt_tab, q_rank_tab,
    q_ids, qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
    IS_BUCKET: tl.constexpr, KIND: tl.constexpr, CAUSAL: tl.constexpr, T_Q: tl.constexpr,
    T_K: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr, SKIP_EMPTY: tl.constexpr,
):
    """Accumulate dk, dv of one key block over query rows [lo, hi): query entries or query positions."""
    offs_m = tl.arange(0, BLOCK_M)
    for start in range(lo, hi, BLOCK_M):
        rows = start + offs_m
        row_ok = rows < hi
        if IS_BUCKET:
            row_tok = tl.load(q_tok_tab + rows, mask=row_ok, other=0)
            row_bkt = tl.load(q_bkt_tab + rows, mask=row_ok, other=-1)
            row_rank = tl.load(q_rank_tab + rows, mask=row_ok, other=0)
            mask = _bucket_mask(row_tok, row_bkt, row_rank, row_ok, q_ids + row_tok * T_Q, col_tok, col_bkt,
                                col_rank, col_ok, col_ids, CAUSAL, T_Q, T_K)
        else:
            row_tok = rows
            mask = _pattern_mask(row_tok, row_ok, q_ids + row_tok * T_Q, col_tok, col_ok, col_ids, radius,
                                 global_tokens, CAUSAL, T_Q, T_K)
        if (not SKIP_EMPTY) or tl.max(mask.to(tl.int32)) > 0:  # (see _rows_range)
            row_d_mask = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_base + row_tok[:, None] * stride_qn + offs_d[None, :], mask=row_d_mask, other=0.0)
            do = tl.load(do_base + row_tok[:, None] * stride_on + offs_d[None, :], mask=row_d_mask, other=0.0)
            stat = tl.load(row_stat + row_tok, mask=row_ok, other=0.0)
            delta = tl.load(row_delta + row_tok, mask=row_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BM, BN) fp32
            p, w = _probs_and_grad_weights(s, mask, stat, p_exp, g_exp, KIND)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # (BM, BN)
            ds = w * (dp - delta[:, None])
            dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
            dk += _weighted_dot(tl.trans(ds), q, KIND, PRECISION)
    return dk, dv


@triton.jit
def _cols_block(
    Q, K, V, DO, ROW_STAT, ROW_DELTA, Q_IDS, K_IDS, Q_TOK, Q_BKT, Q_RANK, DK, DV,
    b, h, bh, col_tok, col_bkt, col_rank, col_ok, out_cols, lo_a, hi_a, lo_b, hi_b,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
    N, M, NE_Q, N_OUT, qk_scale, radius, global_tokens, p_exp, g_exp,
    IS_BUCKET: tl.constexpr, KIND: tl.constexpr, CAUSAL: tl.constexpr, T_Q: tl.constexpr,
    T_K: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, SKIP_EMPTY: tl.constexpr,
):
    """Load a block of key columns, run it over its one or two query ranges, store per-entry dk, dv."""
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    col_d_mask = col_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * stride_kb + h * stride_kh + col_tok[:, None] * stride_kn + offs_d[None, :],
                mask=col_d_mask, other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + col_tok[:, None] * stride_vn + offs_d[None, :],
                mask=col_d_mask, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_ob + h * stride_oh
    q_ids = Q_IDS + bh * N * T_Q
    col_ids = K_IDS + bh * M * T_K + col_tok * T_K
    q_tab = bh * NE_Q
    dk, dv = _cols_range(
        dk, dv, lo_a, hi_a, k, v, col_tok, col_bkt, col_rank, col_ok, col_ids, q_base, do_base, stride_qn,
        stride_on, ROW_STAT + bh * N, ROW_DELTA + bh * N, Q_TOK + q_tab, Q_BKT + q_tab, Q_RANK + q_tab, q_ids,
        qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
        IS_BUCKET, KIND, CAUSAL, T_Q, T_K, BLOCK_M, PRECISION, SKIP_EMPTY)
    if not IS_BUCKET:
        dk, dv = _cols_range(
            dk, dv, lo_b, hi_b, k, v, col_tok, col_bkt, col_rank, col_ok, col_ids, q_base, do_base,
            stride_qn, stride_on, ROW_STAT + bh * N, ROW_DELTA + bh * N, Q_TOK + q_tab, Q_BKT + q_tab,
            Q_RANK + q_tab, q_ids, qk_scale, radius, global_tokens, p_exp, g_exp, offs_d, d_ok,
            IS_BUCKET, KIND, CAUSAL, T_Q, T_K, BLOCK_M, PRECISION, SKIP_EMPTY)
    out = (bh.to(tl.int64) * N_OUT + out_cols)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk, mask=col_d_mask)
    tl.store(DV + out, dv, mask=col_d_mask)


@triton.jit
def _cols_kernel(
    Q, K, V, DO, ROW_STAT, ROW_DELTA,
    Q_IDS, K_IDS, Q_TOK, Q_BKT, Q_RANK, K_TOK, K_BKT, K_RANK, P_RANGES, B_RANGES,
    DK, DV,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
    H, N, M, NE_Q, NE_K, NB_PATTERN, NB_BUCKET, N_OUT,
    qk_scale, radius, global_tokens, p_exp, g_exp,
    KIND: tl.constexpr, CAUSAL: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, SKIP_EMPTY: tl.constexpr,
):
    """One program = one block of key columns (pattern blocks, then sorted key entries), the transpose of
    ``_rows_kernel``. Grid: (NB_PATTERN + NB_BUCKET, batch·heads)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # int64: batch offsets can pass 2³¹ elements
    h = (bh % H).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    if pid < NB_PATTERN:
        cols = pid * BLOCK_N + offs_n
        rng = P_RANGES + pid * 4
        _cols_block(
            Q, K, V, DO, ROW_STAT, ROW_DELTA, Q_IDS, K_IDS, Q_TOK, Q_BKT, Q_RANK, DK, DV,
            b, h, bh, cols, cols, cols, cols < M, NE_K + cols,
            tl.load(rng), tl.load(rng + 1), tl.load(rng + 2), tl.load(rng + 3),
            stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
            N, M, NE_Q, N_OUT, qk_scale, radius, global_tokens, p_exp, g_exp,
            False, KIND, CAUSAL, T_Q, T_K, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, SKIP_EMPTY)
    else:
        cols, col_tok, col_bkt, col_rank, in_range, lo, hi = _entry_block(
            K_TOK, K_BKT, K_RANK, B_RANGES, bh, pid - NB_PATTERN, NE_K, NB_BUCKET, offs_n, -2, BLOCK_N)
        _cols_block(
            Q, K, V, DO, ROW_STAT, ROW_DELTA, Q_IDS, K_IDS, Q_TOK, Q_BKT, Q_RANK, DK, DV,
            b, h, bh, col_tok, col_bkt, col_rank, in_range & (col_bkt >= 0), cols, lo, hi, 0, 0,
            stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
            N, M, NE_Q, N_OUT, qk_scale, radius, global_tokens, p_exp, g_exp,
            True, KIND, CAUSAL, T_Q, T_K, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, SKIP_EMPTY)


# ----------------------------------------------------------------------------------------- host side


@dataclass(frozen=True)
class Tiles:
    """How the query- and key-major kernels are launched: tiles of ``block_m`` query entries by ``block_n``
    key entries (powers of two ≥ 16, as ``tl.dot`` needs), ``num_warps`` warps per program and
    ``num_stages`` software-pipelining stages (both ignored by the interpreter). With ``skip_empty`` a tile
    whose mask is empty loads no keys and values; without it every tile loads them, which lets the compiler
    pipeline the loads (it does not pipeline loads under a branch). An empty tile adds exactly zero for
    finite inputs (an inf or NaN in a key or value that no query of the tile attends reaches its rows, as
    it does in a tile that is partly attended)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    skip_empty: bool = True

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two; got {value!r}")
        if min(self.block_m, self.block_n) < 16:
            raise ValueError(f"block_m and block_n must be at least 16; got {self.block_m}×{self.block_n}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"num_stages must be a positive integer; got {self.num_stages!r}")

    def __str__(self) -> str:
        every = "" if self.skip_empty else "/all"
        return f"{self.block_m}x{self.block_n}/w{self.num_warps}/s{self.num_stages}{every}"

    @classmethod
    def parse(cls, text: str) -> Tiles:
        """The inverse of ``str``: ``"64x64/w8/s2"``, ``"64x64/w8/s3/all"`` (every tile loads); raises
        ValueError naming the expected form."""
        match = re.fullmatch(r"(\d+)x(\d+)/w(\d+)/s(\d+)(/all)?", text.strip())
        if match is None:
            raise ValueError(
                f"expected tiles as BMxBN/wWARPS/sSTAGES[/all] (e.g. 64x64/w8/s2), got {text!r}"
            )
        *numbers, every = match.groups()
        return cls(*(int(number) for number in numbers), skip_empty=every is None)


@dataclass(frozen=True)
class _Config:
    kind: int  # a _KIND_* value
    alpha: float
    scale: float
    qk_scale: float  # multiplies q·k: scale·log2(e) (softmax, base-2 exponent) or scale·(α − 1)
    p_exp: float  # 1/(α − 1)
    g_exp: float  # (2 − α)/(α − 1)
    causal: bool
    radius: int
    global_tokens: int
    head_dim: int
    tiles: Tiles
    block_d: int
    precision: str
    tau_method: int  # a _TAU_* value
    tau_tol: float  # |Σ p − 1| accepted; 0 for α > 2

    def tile_constants(self, t_q: int, t_k: int) -> dict[str, object]:
        """Compile-time constants and launch options shared by the query- and key-major kernels."""
        tiles = self.tiles
        return dict(
            KIND=self.kind, CAUSAL=self.causal, T_Q=t_q, T_K=t_k, HEAD_DIM=self.head_dim,
            BLOCK_D=self.block_d, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, PRECISION=self.precision,
            SKIP_EMPTY=tiles.skip_empty, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )


def default_tiles(
    head_dim: int,
    buckets_per_token: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    alpha: float,
    causal: bool = False,
    radius: int = -1,
    global_tokens: int = 0,
) -> Tiles:
    """The tiles a call gets unless it names its own (``python -m benchmarks.tune`` measures alternatives).
    ``causal``, ``radius`` (the window's, −1 for none) and ``global_tokens`` say whether some tiles may be
    empty: those above the diagonal, or those of the pattern part off the band and the global rows."""
    if device.type != "cuda":
        # the interpreter pays per tile operation, not per element: fewer, larger tiles run faster
        return Tiles(32, 32, num_warps=1, num_stages=1)
    # From sm_90 builds (``python -m benchmarks.build_report``): every tile holds a (BM, BN) mask per pair of
    # bucket slots, so register pressure grows with T as well as d. 8 warps on 64×64 tiles for d ≤ 64 and
    # T ≤ 2, 32×64 for T > 2, 32×32 past d = 64 keep fp16/bf16 passes within 255 registers, spilling at
    # most 72 bytes (the entmax output pass with Σ g v at T = 2); 4 warps or 128-row blocks spill hundreds.
    # Exact fp32 products (fp32 inputs; for α > 2 the products with g and ds, ``_weighted_dot``) run on CUDA
    # cores and need 32×32 tiles: at 64×64 the α > 2 output and key-major passes spill 600–900 bytes.
    if dtype == torch.float32 or alpha > 2.0 or head_dim > 64:
        return Tiles(32, 32, num_warps=8, num_stages=2)
    if buckets_per_token <= 2:
        # Without a causal mask or a pattern every tile of a bucket's block holds pairs, so nothing is gained
        # by testing tiles for emptiness, and tiles that all load get three pipeline stages: on an H200
        # (``benchmarks.tune``, n = 16384, 8 heads, bf16) 1.14-1.63x faster forward and 1.22-1.60x
        # forward+backward than 64x64/w8/s2 at T = 1, 2 and α = 1, 1.5; with a causal mask, whose skipped
        # tiles are many, they lose 10-16 % at T = 1 and are mixed at T = 2.
        if not causal and not has_pattern(radius, global_tokens):
            return Tiles(64, 64, num_warps=8, num_stages=3, skip_empty=False)
        return Tiles(64, 64, num_warps=8, num_stages=2)
    return Tiles(32, 64, num_warps=8, num_stages=2)


def _normalizer(alpha: float) -> tuple[int, int]:
    """(kind, τ update rule) of α: the ``_KIND_*`` and ``_TAU_*`` values the kernels are compiled for."""
    general = _KIND_ENTMAX if alpha < 2.0 else _KIND_ENTMAX_STEEP
    kind = {1.0: _KIND_SOFTMAX, 1.5: _KIND_ENTMAX15, 2.0: _KIND_SPARSEMAX}.get(alpha, general)
    method = _TAU_HALLEY if alpha == 1.5 else _TAU_NEWTON if alpha <= 2.0 else _TAU_BISECT
    return kind.value, method.value


def _make_config(
    alpha: float, scale: float, causal: bool, radius: int, global_tokens: int, head_dim: int, tiles: Tiles,
    dtype: torch.dtype,
) -> _Config:
    kind, tau_method = _normalizer(alpha)
    if alpha == 1.0:
        qk_scale, p_exp, g_exp = scale * _LOG2E, 1.0, 1.0
    else:
        qk_scale, p_exp, g_exp = scale * (alpha - 1.0), 1.0 / (alpha - 1.0), (2.0 - alpha) / (alpha - 1.0)
    return _Config(
        kind=kind, alpha=alpha, scale=scale, qk_scale=qk_scale, p_exp=p_exp, g_exp=g_exp, causal=causal,
        radius=radius, global_tokens=global_tokens, head_dim=head_dim, tiles=tiles,
        block_d=max(16, triton.next_power_of_2(head_dim)),
        # fp32 inputs get full-precision products; fp16/bf16 ignore this and use their tensor cores
        precision="ieee" if dtype == torch.float32 else "tf32",
        tau_method=tau_method,
        tau_tol=_TAU_F_TOL[dtype] if alpha <= 2.0 else 0.0,
    )


@dataclass(frozen=True)
class _Plan:
    qs: Side
    ks: Side
    pattern: bool
    row_pattern: torch.Tensor  # (NB_PATTERN, 4) int32 key ranges of query position blocks
    row_bucket: torch.Tensor  # (BH, NB_BUCKET, 2) int32 key-entry ranges of query entry blocks

    @property
    def whole_rows(self) -> bool:
        """Every query's keys are met by one program: one bucket per query and no window/global part."""
        return self.qs.ids.shape[2] == 1 and not self.pattern


def _make_plan(q_buckets: torch.Tensor, k_buckets: torch.Tensor, cfg: _Config) -> _Plan:
    pattern = has_pattern(cfg.radius, cfg.global_tokens)
    qs = build_side(q_buckets, -1, pattern)
    ks = build_side(k_buckets, -2, pattern)
    n, m = q_buckets.shape[1], k_buckets.shape[1]
    tiles = cfg.tiles
    device = q_buckets.device
    row_pattern = pattern_ranges(n, m, tiles.block_m, key_major=False, device=device, **_pattern(cfg))
    row_bucket = bucket_ranges(qs, ks, tiles.block_m, tiles.block_n, causal=cfg.causal, key_major=False)
    return _Plan(qs, ks, pattern, row_pattern, row_bucket)


def _pattern(cfg: _Config) -> dict[str, object]:
    """The window, global tokens and causality of ``cfg``, as :func:`pattern_ranges` takes them."""
    return dict(radius=cfg.radius, global_tokens=cfg.global_tokens, causal=cfg.causal)


def _per_token(x: torch.Tensor, side: Side) -> torch.Tensor:
    """Per-entry rows (BH, n_out, C) → (BH, L, S, C): the S parts of every token."""
    return x.flatten(0, 1)[side.gather]


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    """Batch, head and row strides of a (batch, heads, n, d) tensor whose last dim is contiguous."""
    return x.stride(0), x.stride(1), x.stride(2)


def _run_rows(
    mode: tl.constexpr, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan, cfg: _Config, *,
    row_stat: torch.Tensor | None = None, grad_out: torch.Tensor | None = None,
    row_delta: torch.Tensor | None = None, need_u: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Launch the query-major pass; returns per-entry (acc, acc2, stats) with a neutral last row."""
    batch, heads, n, d = q.shape
    bh = batch * heads
    qs, ks = plan.qs, plan.ks
    n_out = qs.n_out
    acc = torch.empty(bh, n_out, d, device=q.device, dtype=torch.float32)
    acc[:, -1] = 0.0
    acc2 = torch.zeros(bh, n_out, d, device=q.device, dtype=torch.float32) if need_u else acc
    stats = torch.zeros(bh, n_out, 3, device=q.device, dtype=torch.float32)
    if mode in (_SOFTMAX_FWD, _ENTMAX_MAX):
        stats[:, -1, 0] = float("-inf")
    row_stat = stats if row_stat is None else row_stat
    grad_out = q if grad_out is None else grad_out
    row_delta = row_stat if row_delta is None else row_delta
    nb_pattern = plan.row_pattern.shape[0]
    nb_bucket = plan.row_bucket.shape[1]
    grid = (nb_pattern + nb_bucket, bh)
    _rows_kernel[grid](
        q, k, v, grad_out, row_stat, row_delta,
        qs.ids, ks.ids, qs.tok, qs.bkt, qs.rank, ks.tok, ks.bkt, ks.rank, plan.row_pattern, plan.row_bucket,
        acc, acc2, stats,
        *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out),
        heads, n, k.shape[2], qs.tok.shape[1], ks.tok.shape[1], nb_pattern, nb_bucket, n_out,
        cfg.qk_scale, cfg.radius, cfg.global_tokens, cfg.p_exp, cfg.g_exp,
        cfg.alpha, cfg.tau_tol,
        MODE=mode.value, NEED_U=need_u, TAU_METHOD=cfg.tau_method,
        **cfg.tile_constants(qs.ids.shape[2], ks.ids.shape[2]),
    )
    return acc, (acc2 if need_u else None), stats


def _host_tau_search(
    start: torch.Tensor, sums_at: Callable[[torch.Tensor], torch.Tensor], cfg: _Config
) -> tuple[torch.Tensor, torch.Tensor]:
    """τ per row, stepped from the host: ``start`` (…, 3) holds each row's (max x, |A|, ·), ``sums_at(τ)``
    the TAU-pass sums (…, 3) at τ. After each, ``_tau_kernel`` takes one ``_tau_step`` per row; the host
    stops once every row has converged (one synchronisation a step) or at the step cap. Returns τ and the
    rows' converged flags (int8)."""
    tau, lo, hi = (torch.empty(start.shape[:-1], device=start.device, dtype=torch.float32) for _ in range(3))
    done = torch.empty(start.shape[:-1], device=start.device, dtype=torch.int8)
    numel = tau.numel()
    sums = start
    for step in range(_MAX_TAU_ITERS.value + 1):
        _tau_kernel[(triton.cdiv(numel, TAU_BLOCK),)](
            sums.contiguous(), tau, lo, hi, done, numel, cfg.alpha, cfg.p_exp, cfg.tau_tol,
            START=step == 0, METHOD=cfg.tau_method, BLOCK=TAU_BLOCK,
        )
        if step > 0 and bool(done.all()):
            break
        sums = sums_at(tau)
    return tau, done


def _solve_tau_split(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan, cfg: _Config
) -> torch.Tensor:
    """τ (BH, N) for rows whose keys are spread over several programs (T > 1, window or global tokens):
    each step's sums are a TAU pass whose per-part sums are added up per token."""
    parts = _per_token(_run_rows(_ENTMAX_MAX, q, k, v, plan, cfg)[2], plan.qs)  # (BH, N, S, 3)
    start = torch.stack([parts[..., 0].amax(-1), parts[..., 1].sum(-1), parts[..., 2].sum(-1)], -1)

    def sums_at(tau: torch.Tensor) -> torch.Tensor:
        return _per_token(_run_rows(_ENTMAX_TAU, q, k, v, plan, cfg, row_stat=tau)[2], plan.qs).sum(-2)

    return _host_tau_search(start, sums_at, cfg)[0]


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan, cfg: _Config, need_u: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(out fp32 (BH, N, D), row statistic (BH, N): log2-sum-exp or τ, Σ g v / Σ g (BH, N, D) or None)."""
    if cfg.kind == _KIND_SOFTMAX.value:
        acc, _, stats = _run_rows(_SOFTMAX_FWD, q, k, v, plan, cfg)
        if plan.whole_rows:  # one part per query: its normalised output and log-sum-exp are the query's
            rows = plan.qs.gather[..., 0]  # (BH, N) flat per-entry rows
            return acc.flatten(0, 1)[rows], stats.flatten(0, 1)[:, 0][rows], None
        lse_parts = _per_token(stats, plan.qs)[..., 0]  # (BH, N, S) base-2
        top = lse_parts.amax(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, 0.0)
        weight = torch.exp2(lse_parts - top)  # (BH, N, S)
        total = weight.sum(-1)
        out = (weight[..., None] * _per_token(acc, plan.qs)).sum(-2)
        out = out / torch.where(total > 0, total, 1.0)[..., None]
        lse = torch.where(total > 0, top[..., 0] + torch.log2(total), float("-inf"))
        return out, lse.contiguous(), None

    if plan.whole_rows:
        # one launch: max, τ iterations and output in each program (no host synchronisation)
        acc, acc2, stats = _run_rows(_ENTMAX_SOLVE, q, k, v, plan, cfg, need_u=need_u)
        tau = _per_token(stats, plan.qs)[..., 0, 2].contiguous()  # (BH, N)
    else:
        tau = _solve_tau_split(q, k, v, plan, cfg)
        acc, acc2, stats = _run_rows(_ENTMAX_OUT, q, k, v, plan, cfg, row_stat=tau, need_u=need_u)
    sums = _per_token(stats, plan.qs).sum(-2)  # (BH, N, 3): Σ p, Σ g
    # renormalizing by Σ p absorbs the residual of the τ iteration
    out = _per_token(acc, plan.qs).sum(-2) / torch.where(sums[..., :1] > 0, sums[..., :1], 1.0)
    u_bar = None
    if need_u:
        u_bar = _per_token(acc2, plan.qs).sum(-2) / torch.where(sums[..., 1:2] > 0, sums[..., 1:2], 1.0)
    return out, tau, u_bar


def _grad_q(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, row_stat: torch.Tensor,
    delta: torch.Tensor, plan: _Plan, cfg: _Config,
) -> torch.Tensor:
    """fp32 dq (BH, N, D): query-major, one program per block of query entries."""
    acc, _, _ = _run_rows(_DQ, q, k, v, plan, cfg, row_stat=row_stat, grad_out=grad_out, row_delta=delta)
    return _per_token(acc, plan.qs).sum(-2) * cfg.scale


def _grad_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, row_stat: torch.Tensor,
    delta: torch.Tensor, plan: _Plan, cfg: _Config,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (dk, dv), each (BH, M, D): key-major, one program per block of key entries, so the sums over
    queries stay in registers (no atomics)."""
    batch, heads, n, d = q.shape
    m = k.shape[2]
    bh = batch * heads
    qs, ks = plan.qs, plan.ks
    block = cfg.tiles.block_n
    col_pattern = pattern_ranges(m, n, block, key_major=True, device=q.device, **_pattern(cfg))
    col_bucket = bucket_ranges(ks, qs, block, cfg.tiles.block_m, causal=cfg.causal, key_major=True)
    dk = torch.empty(bh, ks.n_out, d, device=q.device, dtype=torch.float32)
    dv = torch.empty(bh, ks.n_out, d, device=q.device, dtype=torch.float32)
    dk[:, -1] = 0.0
    dv[:, -1] = 0.0
    nb_pattern, nb_bucket = col_pattern.shape[0], col_bucket.shape[1]
    _cols_kernel[(nb_pattern + nb_bucket, bh)](
        q, k, v, grad_out, row_stat, delta,
        qs.ids, ks.ids, qs.tok, qs.bkt, qs.rank, ks.tok, ks.bkt, ks.rank, col_pattern, col_bucket,
        dk, dv,
        *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out),
        heads, n, m, qs.tok.shape[1], ks.tok.shape[1], nb_pattern, nb_bucket, ks.n_out,
        cfg.qk_scale, cfg.radius, cfg.global_tokens, cfg.p_exp, cfg.g_exp,
        **cfg.tile_constants(qs.ids.shape[2], ks.ids.shape[2]),
    )
    return _per_token(dk, ks).sum(-2) * cfg.scale, _per_token(dv, ks).sum(-2)


class _BucketedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_buckets: torch.Tensor,
        k_buckets: torch.Tensor, cfg: _Config,
    ) -> torch.Tensor:
        batch, heads, n, d = q.shape
        plan = _make_plan(q_buckets.flatten(0, 1), k_buckets.flatten(0, 1), cfg)
        need_u = any(ctx.needs_input_grad[:3]) and cfg.kind != _KIND_SOFTMAX.value
        out, row_stat, u_bar = _forward(q, k, v, plan, cfg, need_u)
        out = out.view(batch, heads, n, d).to(q.dtype)
        ctx.plan, ctx.cfg = plan, cfg
        # softmax: D_i = dO_i·o_i from the output; entmax: D_i = dO_i·ū_i with ū_i = Σ g v / Σ g
        ctx.save_for_backward(q, k, v, row_stat, out if u_bar is None else u_bar)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, row_stat, o_or_u = ctx.saved_tensors
        batch, heads, n, d = q.shape
        grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
        delta = (grad_out.float().flatten(0, 1) * o_or_u.float().reshape(batch * heads, n, d)).sum(-1)
        args = (q, k, v, grad_out, row_stat, delta.contiguous(), ctx.plan, ctx.cfg)
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq = _grad_q(*args).view(q.shape).to(q.dtype) if need_q else None
        dk = dv = None
        if need_k or need_v:
            dk, dv = _grad_kv(*args)
            dk, dv = dk.view(k.shape).to(k.dtype), dv.view(v.shape).to(v.dtype)
        return dq, dk, dv, None, None, None


def triton_bucketed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    radius: int = -1,
    global_tokens: int = 0,
    scale: float | None = None,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """Bucketed sparse attention (softmax for ``alpha`` = 1, α-entmax for ``alpha`` > 1) in Triton.

    q: (batch, heads, n, d); k, v: (batch, kv_heads, m, d), kv_heads dividing heads (grouped-query
    attention, keys and values never copied per query head); q_buckets (batch, heads, n, T) and k_buckets
    (batch, heads, m, T') integer bucket ids, −1 for none. Returns (batch, heads, n, d) in q's dtype;
    differentiable in q, k and v. Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``.
    ``tiles`` overrides :func:`default_tiles` (the results differ by the order of fp32 sums only).
    Arguments are not validated here: ``attention_kernels.bucketed.bucketed_attention(..., backend="triton")``
    does that.
    """
    batch, heads, n, d = q.shape
    kv_heads, m = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else float(scale)
    t = max(q_buckets.shape[-1], k_buckets.shape[-1])
    if tiles is None:
        pattern = dict(causal=causal, radius=radius, global_tokens=global_tokens)
        tiles = default_tiles(d, t, q.dtype, q.device, alpha=alpha, **pattern)
    cfg = _make_config(float(alpha), scale, causal, radius, global_tokens, d, tiles, q.dtype)
    q_buckets, k_buckets = q_buckets.to(torch.int32), k_buckets.to(torch.int32)
    if kv_heads < heads:
        # Grouped-query attention as plain attention: the query heads sharing a key/value head become the
        # heads of one batch entry whose keys and values are that head broadcast (stride 0, no copy); the
        # broadcast's backward sums their dk, dv.
        group = heads // kv_heads
        q = q.reshape(batch * kv_heads, group, n, d)
        k, v = (x.reshape(batch * kv_heads, 1, m, x.shape[-1]).expand(-1, group, -1, -1) for x in (k, v))
        q_buckets = q_buckets.reshape(batch * kv_heads, group, n, -1)
        k_buckets = k_buckets.reshape(batch * kv_heads, group, m, -1)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = _BucketedAttention.apply(q, k, v, q_buckets, k_buckets, cfg)
    return out.reshape(batch, heads, n, -1)
