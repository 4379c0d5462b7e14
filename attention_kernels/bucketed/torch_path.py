"""Sub-quadratic PyTorch bucketed attention (the CPU path, and the reference the Triton kernel must match).

Math. For each (batch, head) the attended set of query i is

    A_i = {j : q_buckets[i] ∩ k_buckets[j] ∖ {−1} ≠ ∅} ∪ {j : |i − j| ≤ radius} ∪ {j : i < g or j < g},

intersected with {j ≤ i} when causal (g = global_tokens; radius = w // 2 of the window size w, −1 for no
window: :mod:`attention_kernels.attended` is the definition), and the output is o_i = Σ_{j∈A_i} p_ij v_j with
p_i = α-entmax(s_i) restricted to A_i, s_ij = scale · q_i·k_j:

    α-entmax(s)_j = [(α − 1) s_j − τ]₊^{1/(α−1)},   τ such that Σ_j p_j = 1   (softmax when α = 1).

A query with A_i = ∅ outputs zeros. Each pair counts once however many buckets it shares.

Layout. :mod:`attention_kernels.bucketed.planning` places every attended pair in exactly one dense block, a
contiguous run of sorted queries against a contiguous run of sorted keys, so scores and outputs are products
of dense blocks with no per-pair gather (:mod:`attention_kernels.bucketed.block_products`: each block's keys
transposed once into a panel, its values read where they lie, multiplied on 512-bit vectors in C++ where it
can run, else batched matmuls of the gathered rows) and nothing of size n × m is built but for short rows (the
first case).

* Short rows (at most ``SHORT_KEYS`` keys): the dense masked computation of
  :mod:`attention_kernels.bucketed.reference`, scores (groups, n, m) masked to the attended set. There a class
  of blocks costs a few dozen small operations for a few hundred entries, and the n × m scores are fewer than
  the blocks' padded entries.
* Softmax over whole buckets (not causal, one id slot per query, no pattern: the common learned-bucket case)
  where the block products cannot run on 512-bit vectors and the fused kernel below does not take the call
  (gradients asked for, or no vectors at all), and on CUDA: each block is a small dense attention of its
  own, a whole bucket's queries against its keys, and each class of blocks is one call of
  ``scaled_dot_product_attention`` (its CPU kernel is flash attention: the scores never reach memory; where
  the wide products run, the path below takes 0.65–0.72× its forward time and 0.61× with the backward). On
  CUDA, half-precision inputs stay in their dtype there, for SDPA's flash kernel.
* Inference (no gradients), for softmax and α = 1.5 and 2, on AVX-512 or AVX2 with FMA: the fused C++ kernel
  (:mod:`attention_kernels.bucketed.block_attention`), a whole bucket per block and a few queries' scores,
  probabilities and output at a time in the first-level cache; when causal each tile stops at its rows' own
  position. Where queries hold several ids, each query's set of ids is its class and a key joins every class
  it shares an id with (:mod:`attention_kernels.bucketed.id_sets`), so each query still sits in one block row,
  when enough queries share each set. A window band up to ``MAX_RADIUS`` and up to ``MAX_GLOBAL`` global
  tokens add each query's pattern keys outside its row, scored beside it
  (:mod:`attention_kernels.bucketed.band_keys`); the global queries' rows (every key) are computed densely.
* Otherwise, where each query sits in one block row (one id per query, no pattern), a chunk of blocks holds
  whole queries: its scores, their probabilities (in place) and its output are computed one after another
  while the chunk is in cache.
* Where a query's keys are spread over several rows (up to T + 2 of them: its buckets, the window band, the
  global keys), the scores of every block are computed first, then turned into probabilities in place,
  each query over all of its rows, then the output product runs chunk by chunk; a slab of (batch, head)
  groups at a time (a query's rows all lie in its own group's blocks), so without gradients the scores
  take one slab's memory, not all of them.

For softmax and α = 1.5 and 2 a C++ kernel (:mod:`attention_kernels.bucketed.exact_entmax`) turns scores into
probabilities a few queries at a time, each query's entries read from memory once, the blocks' masks applied
as they are read; other α take the tolerance search below, by row reductions gathered per query.

Apart from the blocks sent to SDPA (whose own backward serves), the forward keeps the probabilities for the
backward, which walks the same chunks (dv = pᵀ·do, dp = do·vᵀ,
ds = entmax′(dp), dq = ds·k, dk = dsᵀ·q). entmax′ needs one per-query ratio Σ_j g_ij dp_ij / Σ_j g_ij
(g = p^{2−α}); with spread rows it is do_i·U_i / Σ_j g_ij, U_i = Σ_j g_ij v_j kept from the forward, so the
backward needs no reduction across blocks.

α-entmax threshold. Per query, with x_j = (α − 1)(s_j − max s), F(τ) = Σ_j [x_j − τ]₊^{1/(α−1)} decreases
and F(τ*) = 1 for some τ* in [−1, −(1/|A_i|)^{α−1}]. Newton steps on F^{α−1} − 1 (a norm of (x − τ)₊, so
convex for α ≤ 2 and steps from below never overshoot, yet nearly linear far from the root) find τ*. For
α = 1.5 and α = 2 every step also solves the quadratic or linear equation on the current support exactly and
accepts that value once its support is verified unchanged, which is the sort-based value; other α stop on a
tolerance, safeguarded by bisection on the bracket. The backward pass is the exact entmax Jacobian: with
g = p^{2−α}, ds = g·(dp − Σ g·dp / Σ g) per query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F

from attention_kernels.attended import has_pattern
from attention_kernels.bucketed.band_keys import MAX_GLOBAL, MAX_RADIUS, band_keys, slot_count, takes_slots
from attention_kernels.bucketed.block_attention import block_attention, fused_kernel
from attention_kernels.bucketed.block_products import block_outputs, block_scores, wide_kernel
from attention_kernels.bucketed.exact_entmax import exact_entmax
from attention_kernels.bucketed.huge_pages import empty_large
from attention_kernels.bucketed.id_sets import id_set_buckets
from attention_kernels.bucketed.planning import (
    BlockClass,
    BlockMask,
    BlockPlan,
    distinct_ids,
    plan_blocks,
    take,
)
from attention_kernels.bucketed.reference import dense_bucketed_attention
from attention_kernels.entmax.dense import compute_dtype
from attention_kernels.entmax.gradient import entmax_gradient_weight, support_power
from attention_kernels.entmax.support_sums import support_sums
from attention_kernels.entmax.threshold import MAX_NEWTON_STEPS, newton_threshold

SHORT_KEYS = 48
"""Up to this many keys the dense masked computation runs (see the module docstring). Measured on one
thread (32 sentences × 4 heads, d 64, 12 buckets, α 1 and 1.5, top-1 and top-2, causal or not): at 32
keys the dense forward with backward takes 0.2–0.7× the blocks' time, at 64 keys 0.6–1.1×, at 128 keys
1.2–3.5×."""

CHUNK_ENTRIES = 2**18
"""Score entries per chunk: scores, probabilities and gradients of a chunk stay in L2."""

SLAB_ENTRIES = 2**22
"""Score entries of a slab of groups where a query's keys are spread over several blocks (16 MiB of float32;
2^18 to 2^22 run alike)."""

_MASKED = -torch.finfo(torch.float32).max
"""Added to scores off the mask: far below any real score, yet finite (see _normalise)."""

_EXP_FLOOR = -80.0
"""exp(−80) ≈ 2e−35 is a normal float32; the entries below it are negligible next to the maximum's 1."""

_EXCLUDED_SCORE = -1e30
"""The score of a padding key in SDPA's blocks: its weight exp(−1e30 − max) is exactly 0 (in half precision
the score is as low as the dtype allows: see _whole_rows_sdpa)."""

_SENTINEL_FACTOR = 256.0
"""The queries' extra component in SDPA's blocks: exact in every float dtype, it puts the padding score half
precision can hold (256 · scale · its lowest) below −100 for any scale above 6e-6: exp of it is 0 in
float32."""


# ------------------------------------------------------------------------------------------- normaliser
# A normaliser works on the entries of every query, held in one or several tensors ("parts", each
# (…, W) with one row of entries per leading index); a reducer maps rows to queries. Each pass of a
# normaliser takes the parts one at a time and runs all of its operations on a part before the next, so a
# cache-sized part is read from memory once per pass; per-row statistics are then summed per query.


@dataclass(frozen=True)
class _SpreadRows:
    """Parts whose rows belong to queries ``rows[c]`` (the part's leading shape: (blocks, L) for a class,
    (rows,) for rows gathered by :func:`_rows_of`), in [0, num_queries); a query's keys may be spread over
    rows of several parts. Per-query values are (num_queries,)."""

    rows: list[torch.Tensor]
    num_queries: int

    def reduce(self, stats: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        out = stats[0][0].new_zeros(len(stats[0]), self.num_queries)
        for part, rows in zip(stats, self.rows, strict=True):
            out.index_add_(1, rows.reshape(-1), torch.stack(part).flatten(1))
        return list(out)

    def max(self, values: list[torch.Tensor]) -> torch.Tensor:
        out = values[0].new_full((self.num_queries,), _MASKED)
        for part, rows in zip(values, self.rows, strict=True):
            out.scatter_reduce_(0, rows.reshape(-1), part.reshape(-1), "amax")
        return out

    def at(self, per_query: torch.Tensor, part: int) -> torch.Tensor:
        return per_query[self.rows[part]][..., None]


def _query_sums(values: list[torch.Tensor], red: _SpreadRows) -> torch.Tensor:
    """Σ over each query's entries of the parts ``values``."""
    return red.reduce([[v.sum(-1)] for v in values])[0]


def _query_max(row_max: list[torch.Tensor], red: _SpreadRows) -> torch.Tensor:
    """Per query, the largest of its rows' maxima (one tensor per part); 0 for a query without keys (any
    finite shift does)."""
    q_max = red.max(row_max)
    return q_max.masked_fill(q_max <= 0.5 * _MASKED, 0.0)


def _thresholds(
    red: _SpreadRows, per_query: torch.Tensor, offsets: list[torch.Tensor], part: int
) -> torch.Tensor:
    """A per-query threshold τ as each row of ``part`` sees it (…, 1): τ plus the row's offset."""
    return red.at(per_query, part) + offsets[part]


def _clamped(x: torch.Tensor, tau: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """(x − τ)₊ written into the front of ``buffer`` (reused: fresh large buffers cost page faults)."""
    return torch.sub(x, tau, out=buffer[: x.numel()].view(x.shape)).clamp_min_(0)


def _newton_threshold(
    xs: list[torch.Tensor], offsets: list, count: torch.Tensor, alpha: float, red: _SpreadRows
) -> torch.Tensor:
    """τ per query for rows x (far below −1 off the mask) whose query sees x − offset, x − offset =
    (α − 1)(s − max) over the query's entries, any α > 1; count = attended keys per query.

    F(τ) = Σ_j [x_j − τ]₊^β (β = 1/(α − 1)) decreases and F(τ*) = 1 for τ* in [−1, −(1/count)^{α−1}].
    Newton on h(τ) = F(τ)^{1/β} − 1, safeguarded by bisection on that bracket.
    """
    beta = 1.0 / (alpha - 1.0)
    lo = torch.full_like(count, -1.0)  # F(lo) ≥ 1: the maximum alone contributes 1
    hi = -((1.0 / count.clamp_min(1)) ** (alpha - 1.0))  # F(hi) ≤ 1: each key contributes ≤ 1/count
    tol = 4 * torch.finfo(xs[0].dtype).eps
    buffer = xs[0].new_empty(max(x.numel() for x in xs))

    def mass_and_slope(tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stats = []
        for part, x in enumerate(xs):
            d = _clamped(x, _thresholds(red, tau, offsets, part), buffer)
            slope_terms = support_power(d, beta - 1.0)  # d^{β−1}
            stats.append([torch.linalg.vecdot(slope_terms, d), slope_terms.sum(-1)])
        mass, slope = red.reduce(stats)
        return mass, beta * slope

    return newton_threshold(mass_and_slope, lo.clone(), lo, hi, beta, tol)


def _support_sums(
    scores: torch.Tensor,
    shift: torch.Tensor,
    tau: torch.Tensor,
    alpha: float,
    candidate: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Per row of scores (…, W), with x = (α − 1)(s − shift): Σ (x − τ)₊, Σ (x − τ)₊² (α = 1.5 only) and
    |{x > τ}|, then |{x > candidate}| when one is given; shift, τ and candidate (…, 1), all of them in one
    read of the scores (:mod:`attention_kernels.entmax.support_sums`)."""
    check = torch.full_like(tau, torch.inf) if candidate is None else candidate
    s1, s2, k, k_check = support_sums(scores, shift, tau, check, alpha - 1.0)
    sums = [s1, s2, k] if alpha == 1.5 else [s1, k]
    return sums if candidate is None else [*sums, k_check]


def _support_steps(sums: list[torch.Tensor], tau: torch.Tensor, beta: float) -> tuple[torch.Tensor, ...]:
    """From the sums at τ ≤ τ* (:func:`_support_sums`, per query): the τ′ solving the equation on the
    support S = {x > τ}, the Newton step from below, and |S|."""
    s1, k = sums[0], sums[-1]
    if beta == 1.0:
        exact = tau + (s1 - 1.0) / k.clamp_min(1)
        return exact, exact, k
    s2 = sums[1]
    root = (s1 * s1 - k * (s2 - 1.0)).clamp_min(0).sqrt()
    exact = tau + (s2 - 1.0) / (s1 + root).masked_fill(s1 + root == 0, 1.0)
    newton = tau + (s2 - s2.sqrt()) / s1.masked_fill(s1 == 0, 1.0)
    return exact, newton, k


def _support_threshold(
    xs: list[torch.Tensor],
    shift: torch.Tensor,
    alpha: float,
    red: _SpreadRows,
    start: torch.Tensor,
    *,
    check_first: bool,
) -> torch.Tensor:
    """Exact τ per query for α = 2 (β = 1) or α = 1.5 (β = 2), over the scores s of the parts ``xs`` (rows
    (…, W) that ``red`` maps to queries): with x = (α − 1)(s − shift), shift the query's maximum score,
    Σ_j (x_j − τ)₊^β = 1. start ≤ τ* per query; x ≤ 0, so F(−1) ≥ 1.

    At τ ≤ τ* the support S = {x > τ} contains the true one. With y = x − τ on S, the τ′ = τ + δ solving
    Σ_S (y − δ) = 1 or Σ_S (y − δ)² = 1 (smaller root, written without cancellation) is τ* exactly when
    {x > τ′} still has |S| elements (nested sets, so then it is S itself): the sort-based value. Queries not
    yet there take a Newton step on F^{1/β} − 1 from below, which never overshoots. Each read of the parts
    gives the sums at the Newton point and the count that checks the previous step's τ′ together; the first
    τ′ is checked only with ``check_first`` (from τ = −1 it is almost never final). Once most queries are
    settled, the rows of the rest continue on their own (:func:`_rows_of`): a gather of few rows beats more
    reads of all.
    """
    beta = 1.0 / (alpha - 1.0)
    shifts = [red.at(shift, part) for part in range(len(xs))]
    tau, candidate, size = start, None, None
    settled = torch.ones_like(tau, dtype=torch.bool)  # queries without rows here: nothing to find
    for rows in red.rows:
        settled[rows.reshape(-1)] = False
    searching = int(settled.numel() - settled.sum())
    for step in range(MAX_NEWTON_STEPS):
        sums = red.reduce(
            [
                _support_sums(
                    x,
                    shifts[part],
                    red.at(tau, part),
                    alpha,
                    None if candidate is None else red.at(candidate, part),
                )
                for part, x in enumerate(xs)
            ]
        )
        if candidate is not None:
            exact = (sums.pop() == size) & ~settled
            tau = torch.where(exact, candidate, tau)
            settled |= exact
            left = int(settled.numel() - settled.sum())
            if left == 0:
                break
            if 2 * left <= searching:  # τ is below τ* for the rest: their rows restart from it
                parts, rows = _rows_of(~settled, xs, red)
                rest = _support_threshold(parts, shift, alpha, rows, tau, check_first=True)
                return torch.where(settled, tau, rest)
        candidate, newton, size = _support_steps(sums, tau, beta)
        tau = torch.where(settled, tau, newton)
        if step == 0 and not check_first:
            candidate = None
    return tau


def _rows_of(
    queries: torch.Tensor, xs: list[torch.Tensor], red: _SpreadRows
) -> tuple[list[torch.Tensor], _SpreadRows]:
    """The rows of the ``queries`` (a mask over queries), as parts of one row each (rows, W): a spread
    problem over those queries alone."""
    parts, rows = [], []
    for x, owner in zip(xs, red.rows, strict=True):
        at = queries[owner].flatten().nonzero().squeeze(1)  # (r,) rows of this part to keep
        if at.numel():
            parts.append(x.reshape(-1, x.shape[-1]).index_select(0, at))
            rows.append(owner.reshape(-1).index_select(0, at))
    return parts, _SpreadRows(rows, red.num_queries)


def _exact_thresholds(
    scores: list[torch.Tensor], alpha: float, red: _SpreadRows
) -> tuple[torch.Tensor, torch.Tensor]:
    """For α = 1.5 or 2, per query the shift (its largest score) and the τ over the parts ``scores``:
    α-entmax is then p = ((α − 1)(s − shift) − τ)₊^{1/(α−1)} (:func:`_exact_probabilities`). The reference
    of the C++ kernel (:mod:`attention_kernels.bucketed.exact_entmax`), and its stand-in where it fails."""
    q_max = _query_max([s.amax(-1) for s in scores], red)
    tau = _support_threshold(scores, q_max, alpha, red, torch.full_like(q_max, -1.0), check_first=False)
    return q_max, tau


def exact_row_thresholds(scores: torch.Tensor, alpha: float) -> torch.Tensor:
    """For α = 1.5 or 2, the threshold τ (N,) of each row of scores (N, L), entries off the mask −inf, in
    (α − 1)·score units: α-entmax(s) = ((α − 1) s − τ)₊^{1/(α−1)}; +inf on a row without keys. The exact
    search of this path (:func:`_exact_thresholds`), each row its own query: no sort."""
    empty = scores.amax(-1).isneginf()  # (N,)
    rows = torch.arange(len(empty), device=scores.device)
    found = exact_entmax([scores.contiguous()], [rows], len(rows), alpha, write=False)
    if found is None:
        found = _exact_thresholds([scores], alpha, _SpreadRows([rows], len(rows)))
    shift, tau = found
    return (tau + (alpha - 1.0) * shift).masked_fill_(empty, float("inf"))


def _exact_probabilities(
    scores: torch.Tensor, shift: torch.Tensor, tau: torch.Tensor, alpha: float
) -> torch.Tensor:
    """p = ((α − 1)(s − shift) − τ)₊^{1/(α−1)} for α = 1.5 or 2, in place of the scores (…, W); shift and τ
    (…, 1). τ is the sort-based threshold, so p sums to 1 as entmax's own does (no renormalisation)."""
    p = scores.sub_(shift).mul_(alpha - 1.0).sub_(tau).clamp_min_(0)
    return p.square_() if alpha == 1.5 else p


_NATIVE = (1.0, 1.5, 2.0)
"""The α of the C++ normaliser (:mod:`attention_kernels.bucketed.exact_entmax`): softmax, exact α-entmax."""


def _normalise(
    scores: list[torch.Tensor],
    alpha: float,
    red: _SpreadRows,
    on: list[torch.Tensor | None] | None = None,
    masks: list[BlockMask | None] | None = None,
) -> list[torch.Tensor]:
    """p = α-entmax(s) per query (softmax for α = 1) over the entries ``red`` gathers, computed in place of
    the scores (contiguous). A query without keys gets zeros.

    α-entmax(s)_j = [(α − 1)(s_j − max s) − τ]₊^{1/(α−1)} with τ such that Σ_j p_j = 1.

    Entries off the mask hold −inf or ``_MASKED`` or less; ``masks`` (one per part, for parts of blocks)
    leaves out more entries by their blocks' rule, where their scores are not masked. For α = 1, 1.5 and 2
    the C++ kernel (:mod:`attention_kernels.bucketed.exact_entmax`) runs where it can, each query's entries
    read from memory once; elsewhere, and for other α, the PyTorch normaliser below, which reads the masks as
    masked scores.

    Each row is shifted by its own maximum r; a query whose maximum m lies in another row sees the row's
    entries lowered by (α − 1)(m − r) (softmax: scaled by exp(r − m)). With ``on`` (1 on the mask, 0 off
    it, for the parts where it is not None), exp runs on arguments clamped to ``_EXP_FLOOR`` (below it exp
    underflows, and on CPU takes a slow path) and ``on`` zeroes the entries off the mask exactly. α = 1.5
    and 2 take the exact threshold search (:func:`_exact_thresholds`).
    """
    native = alpha in _NATIVE
    if native and exact_entmax(scores, red.rows, red.num_queries, alpha, write=True, masks=masks) is not None:
        return scores
    for s, mask in zip(scores, masks or [None] * len(scores), strict=True):
        if mask is not None:
            s.add_(mask.excluded(), alpha=_MASKED)
    if alpha in (1.5, 2.0):
        shift, tau = _exact_thresholds(scores, alpha, red)
        for c, s in enumerate(scores):
            _exact_probabilities(s, red.at(shift, c), red.at(tau, c), alpha)
        return scores
    on = [None] * len(scores) if on is None else on
    row_max = [s.amax(-1) for s in scores]
    q_max = _query_max(row_max, red)
    # a row without keys takes its query's shift; below: how far each row's maximum lies under it
    row_max = [torch.where(r <= 0.5 * _MASKED, red.at(q_max, i)[..., 0], r) for i, r in enumerate(row_max)]
    below = [red.at(q_max, i) - r[..., None] for i, r in enumerate(row_max)]
    for s, r in zip(scores, row_max, strict=True):
        s.sub_(r[..., None])  # ≤ 0 off empty rows
    if alpha == 1.0:
        probs = [
            x.exp_() if kept is None else x.clamp_min_(_EXP_FLOOR).exp_().mul_(kept)
            for x, kept in zip(scores, on, strict=True)
        ]
        factors = [b.neg_().exp_() for b in below]
    else:
        xs = [x.mul_(alpha - 1.0) for x in scores]
        offsets = [b.mul_(alpha - 1.0) for b in below]
        on_mask = [
            (x > 0.5 * _MASKED if kept is None else kept).to(x.dtype) for x, kept in zip(xs, on, strict=True)
        ]
        tau = _newton_threshold(xs, offsets, _query_sums(on_mask, red), alpha, red)
        probs = [
            x.sub_(_thresholds(red, tau, offsets, part)).clamp_min_(0).pow_(1.0 / (alpha - 1.0))
            for part, x in enumerate(xs)
        ]
        factors = [torch.ones_like(b) for b in below]
    total = red.reduce([[p.sum(-1) * f[..., 0]] for p, f in zip(probs, factors, strict=True)])[0]
    total = total.masked_fill(total == 0, 1.0)
    for part, (p, f) in enumerate(zip(probs, factors, strict=True)):
        p.div_(red.at(total, part) / f)
    return probs


def _normalise_backward(
    probs: torch.Tensor, grad: torch.Tensor, alpha: float, ratio: torch.Tensor | None = None
) -> torch.Tensor:
    """ds from dp for p = α-entmax(s): with g = :func:`entmax_gradient_weight`, ds = g·(dp − r) per query,
    r = Σ g·dp / Σ g over the query's row, or the given ``ratio`` (…, 1) when its keys are spread over
    several rows. Overwrites ``grad``."""
    weight = entmax_gradient_weight(probs, alpha)
    wg = grad.mul_(weight)
    if ratio is None:
        den = weight.sum(-1, keepdim=True)
        ratio = wg.sum(-1, keepdim=True) / den.masked_fill(den == 0, 1.0)
    if weight is probs:
        return wg.addcmul_(weight, ratio, value=-1.0)
    return wg.sub_(weight.mul_(ratio))


# ------------------------------------------------------------------------------------------- blocks


def _chunks(blocks: BlockClass) -> list[tuple[slice, BlockClass]]:
    """Consecutive ranges of blocks of about ``CHUNK_ENTRIES`` score entries (cache-sized), as (blocks'
    slice, the blocks)."""
    count, rows = blocks.queries.shape
    step = max(1, CHUNK_ENTRIES // (rows * blocks.keys.shape[1]))
    return [(slice(a, min(a + step, count)), blocks.chunk(a, a + step)) for a in range(0, count, step)]


def _block_scores(
    q: torch.Tensor, k: torch.Tensor, blocks: BlockClass, out: torch.Tensor, *, apply_mask: bool
) -> torch.Tensor | None:
    """Scores s = q_i·k_j of the blocks into ``out`` (blocks, L, M); with ``apply_mask``, ``_MASKED`` added
    off the attended set, and the attended set returned as floats (1 on it, 0 off it; None when the class
    has no entry off it). Without, every entry keeps its score: the C++ normaliser applies the class's mask
    itself. q (N, d), k (M, d) flat over groups."""
    block_scores(q, k, blocks.queries, blocks.keys, out)
    if blocks.mask is None or not apply_mask:
        return None
    off = blocks.mask.excluded()  # (blocks, L, M)
    out.add_(off, alpha=_MASKED)
    return off.neg_().add_(1.0)


def _add_output(out: torch.Tensor, probs: torch.Tensor, v: torch.Tensor, blocks: BlockClass) -> None:
    """o_i += Σ_j p_ij v_j over the blocks' rows; probs (blocks, L, M), v (M_all, d_v), out (N, d_v)."""
    out.index_add_(0, blocks.queries.reshape(-1), block_outputs(probs, v, blocks.keys).flatten(0, 1))


@dataclass
class _Forward:
    """What the forward leaves for the backward: p per class, and for spread rows U = Σ_j g_ij v_j and
    Σ_j g_ij per query (g = p^{2−α})."""

    probs: list[torch.Tensor]
    weighted_values: torch.Tensor | None = None
    weight_sums: torch.Tensor | None = None


def _whole_rows_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, scale: float
) -> torch.Tensor:
    """Softmax with each query in one block row whose every entry is attended but padding (not causal, one
    id per query, no pattern): each class's blocks through ``scaled_dot_product_attention`` with scores
    ``scale`` · q·k, differentiable by autograd. q (N, d), k (M, d), v (M, d) flat over groups; returns
    o (N, d).

    SDPA is told of padding keys only by a mask, which costs as much again as the blocks. Instead each vector
    gets one more component, 256 for queries and 0 for keys, and padding columns read a sentinel key whose
    extra component makes their scores −1e30, or in half precision 256 · scale times the dtype's lowest:
    far below the others, so their weights are exactly 0 (exp underflows). The values get the component
    too (SDPA's fast kernel wants one head size) and drop it after. Padding rows read query 0 and are zeroed
    before the scatter."""
    dv = v.shape[1]
    padded = any(blocks.mask is not None for blocks in plan.classes)
    if padded:
        q = F.pad(q, (0, 1), value=_SENTINEL_FACTOR)  # (N, d + 1)
        k = F.pad(k, (0, 1, 0, 1))  # (M + 1, d + 1), the last row the sentinel
        # scores of −1e30 once scaled, or as low as the dtype allows
        k[-1, -1] = max(_EXCLUDED_SCORE / (_SENTINEL_FACTOR * scale), torch.finfo(k.dtype).min)
        v = F.pad(v, (0, 1, 0, 1))  # (M + 1, d + 1)
    out, sentinel = v.new_zeros(plan.num_queries, dv), k.shape[0] - 1
    for blocks in plan.classes:
        keys = blocks.keys.masked_fill(blocks.padding_keys(), sentinel) if padded else blocks.keys
        rows = F.scaled_dot_product_attention(
            take(q, blocks.queries)[:, None], take(k, keys)[:, None], take(v, keys)[:, None], scale=scale
        )[:, 0, :, :dv]  # (blocks, L, d)
        if blocks.mask is not None:
            rows = rows * blocks.real_queries()[..., None]
        out = out.index_add(0, blocks.queries.reshape(-1), rows.flatten(0, 1))
    return out


def _score_shape(blocks: BlockClass) -> tuple[int, int, int]:
    """(blocks, L, M): the scores of a class."""
    return (*blocks.queries.shape, blocks.keys.shape[1])


def _carved(buffer: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """Consecutive views of ``buffer`` of the given shapes, from its start."""
    views, used = [], 0
    for shape in shapes:
        views.append(buffer[used : used + math.prod(shape)].view(shape))
        used += views[-1].numel()
    return views


def _whole_query_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, alpha: float, *, keep: bool
) -> tuple[torch.Tensor, _Forward]:
    """α-entmax (softmax at α = 1) where each query sits in one block row (``plan.spread`` False): a chunk's
    rows are whole queries, so its scores, their probabilities (:func:`_normalise`, in place) and its
    output are computed one after another while the chunk is in cache. With ``keep`` the probabilities
    stay, one tensor per class; without, every chunk reuses one buffer."""
    native = alpha in _NATIVE  # the C++ kernel applies the blocks' masks itself
    chunks = [_chunks(blocks) for blocks in plan.classes]
    kept = [empty_large(*_score_shape(blocks), like=q) for blocks in plan.classes] if keep else []
    # a class's first chunk is its largest (only the last may be short)
    largest = max(math.prod(_score_shape(class_chunks[0][1])) for class_chunks in chunks)
    buffer = None if keep else q.new_empty(largest)
    out = v.new_zeros(plan.num_queries, v.shape[1])
    for c, class_chunks in enumerate(chunks):
        for at, blocks in class_chunks:
            count, L = blocks.queries.shape
            s = kept[c][at] if keep else _carved(buffer, [_score_shape(blocks)])[0]
            on = _block_scores(q, k, blocks, s, apply_mask=not native)
            rows = torch.arange(count * L, device=q.device).view(count, L)  # the chunk's queries, numbered
            _normalise([s], alpha, _SpreadRows([rows], count * L), [on], [blocks.mask] if native else None)
            _add_output(out, s, v, blocks)
    return out, _Forward(kept)


class _Slab(NamedTuple):
    """Consecutive groups, the slice of each class's blocks that hold them, and those blocks' entries."""

    groups: range
    blocks: list[slice]
    entries: int


def _slabs(plan: BlockPlan) -> list[_Slab]:
    """Consecutive groups in slabs of about ``SLAB_ENTRIES`` score entries, at least one group each."""
    n = plan.num_queries // plan.groups
    groups = torch.arange(plan.groups + 1, device=plan.classes[0].queries.device)
    bounds, entries = [], 0
    for blocks in plan.classes:
        # row 0 of a block always holds a query; a group's blocks are consecutive (BlockPlan)
        bound = torch.searchsorted(blocks.queries[:, 0] // n, groups)  # (groups + 1,) first block of each
        bounds.append(bound.tolist())
        entries = entries + bound.diff() * math.prod(_score_shape(blocks)[1:])
    sizes, slabs, first = entries.tolist(), [], 0
    while first < plan.groups:
        last, total = first + 1, sizes[first]
        while last < plan.groups and total + sizes[last] <= SLAB_ENTRIES:
            last, total = last + 1, total + sizes[last]
        slabs.append(_Slab(range(first, last), [slice(b[first], b[last]) for b in bounds], total))
        first = last
    return slabs


def _spread_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    classes: list[BlockClass],
    scores: list[torch.Tensor],
    alpha: float,
    queries: range,
) -> None:
    """The scores of the blocks of ``classes`` into ``scores`` (one (blocks, L, M) per class), then in their
    place each query's probabilities over all of its rows (:func:`_normalise`); the blocks' rows hold
    ``queries`` (flat indices) and padding."""
    native = alpha in _NATIVE  # the others' tolerance search counts keys by a mask
    ons = []
    for blocks, s in zip(classes, scores, strict=True):
        on = q.new_empty(s.shape) if not native and blocks.mask is not None else None
        for at, chunk in _chunks(blocks):
            chunk_on = _block_scores(q, k, chunk, s[at], apply_mask=not native)
            if on is not None:
                on[at] = chunk_on
        ons.append(on)
    # numbered from 0; padding rows hold query 0, which before a later slab's queries is one more of its own
    first, count = queries.start, len(queries)
    owners = [(blocks.queries - first).masked_fill_(blocks.queries < first, count) for blocks in classes]
    masks = [blocks.mask for blocks in classes] if native else None
    _normalise(scores, alpha, _SpreadRows(owners, count + 1), ons, masks)


def _spread_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, alpha: float, *, keep: bool
) -> tuple[torch.Tensor, _Forward]:
    """α-entmax (softmax at α = 1) where a query's keys may be spread over rows of several blocks, a slab of
    groups at a time (:func:`_slabs`; a query's rows all lie in blocks of its own group): the probabilities
    of the slab's blocks (:func:`_spread_probabilities`), then a chunk at a time the output. Without
    ``keep`` one buffer of a slab's size serves every slab, and either way the normaliser's passes over a
    query's rows stay within one slab's scores (with all the scores at once, gigabytes at 16k tokens, the
    forward ran up to 1.6× slower). The forward also keeps U = Σ_j g_ij v_j and Σ_j g_ij per query for the
    backward (for softmax g = p, so U is the output and Σ_j g_ij = 1)."""
    n = plan.num_queries // plan.groups
    slabs = _slabs(plan)
    if keep:
        kept = [empty_large(*_score_shape(blocks), like=q) for blocks in plan.classes]
    else:
        buffer = empty_large(max(slab.entries for slab in slabs), like=q)
    out = v.new_zeros(plan.num_queries, v.shape[1])
    weighted = torch.zeros_like(out) if keep and alpha != 1.0 else None
    weights = [q.new_empty(c.queries.shape) for c in plan.classes] if weighted is not None else []  # Σ_j g_ij
    for groups, parts, _ in slabs:
        classes = [blocks.chunk(at.start, at.stop) for blocks, at in zip(plan.classes, parts, strict=True)]
        if keep:
            scores = [p_all[at] for p_all, at in zip(kept, parts, strict=True)]
        else:
            scores = _carved(buffer, [_score_shape(blocks) for blocks in classes])
        _spread_probabilities(q, k, classes, scores, alpha, range(groups.start * n, groups.stop * n))
        for c, (blocks, p_all) in enumerate(zip(classes, scores, strict=True)):
            for at, chunk in _chunks(blocks):
                _add_output(out, p_all[at], v, chunk)
                if weighted is not None:
                    weight = entmax_gradient_weight(p_all[at], alpha)
                    _add_output(weighted, weight, v, chunk)
                    torch.sum(weight, -1, out=weights[c][parts[c]][at])
    if not keep:
        return out, _Forward([])
    if weighted is None:  # softmax
        return out, _Forward(kept, out, torch.ones_like(out[:, 0]))
    red = _SpreadRows([blocks.queries for blocks in plan.classes], plan.num_queries)
    return out, _Forward(kept, weighted, red.reduce([[w] for w in weights])[0])


class BucketBlockAttention(torch.autograd.Function):
    """Attention over a :class:`~attention_kernels.bucketed.planning.BlockPlan`.

    q (N, d) already scaled, k (M, d), v (M, d_v) flat over groups; returns o (N, d_v). Saves p (the
    attended pairs plus padding) and, where a query's keys are spread over several rows, U = Σ_j g_ij v_j
    and Σ_j g_ij per query (:class:`_Forward`); the backward recomputes no score:
    dv = pᵀ·do, dp = do·vᵀ, ds = entmax′(dp), dq = ds·k, dk = dsᵀ·q.
    """

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, alpha: float
    ) -> torch.Tensor:
        out, kept = _blocks_forward(q, k, v, plan, alpha, keep=True)
        extra = [] if kept.weighted_values is None else [kept.weighted_values, kept.weight_sums]
        ctx.save_for_backward(q, k, v, *extra, *kept.probs)
        ctx.plan, ctx.alpha, ctx.extra = plan, alpha, len(extra)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, *saved = ctx.saved_tensors
        extra, probs = saved[: ctx.extra], saved[ctx.extra :]
        grad = grad.contiguous()
        ratio = None
        if extra:
            weighted, weight_sums = extra
            ratio = (grad * weighted).sum(-1) / weight_sums.masked_fill(weight_sums == 0, 1.0)  # (N,)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for blocks, p_all in zip(ctx.plan.classes, probs, strict=True):
            for at, chunk in _chunks(blocks):
                p, rows, cols = p_all[at], chunk.queries, chunk.keys
                dv.index_add_(0, cols.reshape(-1), block_outputs(p, grad, rows, transpose=True).flatten(0, 1))
                row_ratio = None if ratio is None else take(ratio, rows)[..., None]
                dp = block_scores(grad, v, rows, cols, torch.empty_like(p))
                ds = _normalise_backward(p, dp, ctx.alpha, row_ratio)
                dq.index_add_(0, rows.reshape(-1), block_outputs(ds, k, cols).flatten(0, 1))
                dk.index_add_(0, cols.reshape(-1), block_outputs(ds, q, rows, transpose=True).flatten(0, 1))
        return dq, dk, dv, None, None


def _blocks_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, alpha: float, *, keep: bool
) -> tuple[torch.Tensor, _Forward]:
    """o_i = Σ_j p_ij v_j over the plan's blocks; q (N, d), k (M, d), v (M, d_v) flat over groups. Returns
    o (N, d_v) and, when ``keep``, what the backward needs."""
    if plan.band_keys is not None:  # these paths would leave the band out
        raise ValueError("a plan with band_keys runs on the fused kernel alone; plan the band as blocks")
    if not plan.classes:
        return v.new_zeros(plan.num_queries, v.shape[1]), _Forward([])
    forward = _spread_forward if plan.spread else _whole_query_forward
    return forward(q, k, v, plan, alpha, keep=keep)


def plan_attention(
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    causal: bool = False,
    radius: int = -1,
    global_tokens: int = 0,
    whole_buckets: bool = False,
) -> BlockPlan:
    """The blocks that hold the attended pairs of bucket ids (batch, heads, n|m, T), −1 for none; groups
    (batch·head) flat, radius of the window band (−1 for none); ``whole_buckets``: a bucket's queries are one
    block, not cut into cache-sized chunks (for SDPA, which tiles them itself)."""
    q_ids, k_ids = _distinct(q_buckets), _distinct(k_buckets)
    return _plan_ids(
        q_ids, k_ids, causal=causal, radius=radius, global_tokens=global_tokens, whole=whole_buckets
    )


def _distinct(buckets: torch.Tensor) -> torch.Tensor:
    """The ids (batch, heads, tokens, T) as :func:`distinct_ids` gives them, groups flat: (G, tokens, T′)."""
    b, h, tokens, slots = buckets.shape
    return distinct_ids(buckets.reshape(b * h, tokens, slots))


def _plan_ids(
    q_ids: torch.Tensor, k_ids: torch.Tensor, *, causal: bool, radius: int, global_tokens: int, whole: bool
) -> BlockPlan:
    """:func:`plan_attention` of distinct ids (G, n|m, T)."""
    pattern = dict(causal=causal, radius=radius, global_tokens=global_tokens)
    if whole:  # SDPA tiles the keys itself: padding them to whole key steps would only add work
        return plan_blocks(q_ids, k_ids, **pattern, rows=max(q_ids.shape[1], 1), key_step=1)
    return plan_blocks(q_ids, k_ids, **pattern)


def takes_fused_kernel(
    alpha: float, device: torch.device, *, radius: int = -1, global_tokens: int = 0
) -> bool:
    """Whether a call without gradients may run the fused kernel (see the module docstring): softmax or
    α = 1.5 or 2, a window band's radius at most ``MAX_RADIUS`` (or none), at most ``MAX_GLOBAL`` global
    tokens, CPU tensors, a processor with the kernel's vectors (AVX-512, or AVX2 with FMA).
    :func:`fused_plan` also needs each query in one block row."""
    return (
        float(alpha) in _NATIVE
        and global_tokens <= MAX_GLOBAL
        and radius <= MAX_RADIUS
        and device.type == "cpu"
        and fused_kernel() is not None
    )


def fused_plan(
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    alpha: float,
    causal: bool = False,
    radius: int = -1,
    global_tokens: int = 0,
) -> BlockPlan | None:
    """The whole-block plan the fused kernel runs for a call without gradients on these bucket ids
    (batch, heads, n|m, T), or None where it does not take the call (:func:`takes_fused_kernel`). A query
    with one id sits in its bucket's block; where queries hold several, each query's set of ids is its
    class (:mod:`attention_kernels.bucketed.id_sets`), unless too few queries share a set or the classes'
    flags would pass their bound. The window band's and global keys outside a query's row are the plan's
    ``band_keys``, where they are few beside the rows (:func:`.band_keys.takes_slots`); a global query's row
    is every key, which the caller computes (:func:`_global_rows`)."""
    if not takes_fused_kernel(alpha, q_buckets.device, radius=radius, global_tokens=global_tokens):
        return None
    q_ids, k_ids = _distinct(q_buckets), _distinct(k_buckets)
    if q_ids.shape[-1] > 1:  # some query holds two ids: classes of id sets, where they pay
        classes = id_set_buckets(q_ids, k_ids)  # (the classes are distinct ids themselves)
        if classes is None:
            return None
        q_ids, k_ids = classes
    plan = _plan_ids(q_ids, k_ids, causal=causal, radius=-1, global_tokens=0, whole=True)
    if has_pattern(radius, global_tokens):
        pattern = dict(radius=radius, causal=causal, global_tokens=global_tokens)
        if not takes_slots(plan, slot_count(q_ids.shape[1], k_ids.shape[1], **pattern)[0]):
            return None  # the spread rows' pattern blocks are the cheaper
        keys, window = band_keys(q_ids, k_ids, **pattern)
        plan = replace(plan, band_keys=keys, band_window=window)
    return plan


def takes_sdpa_blocks(
    alpha: float,
    q_buckets: torch.Tensor,
    head_dims: tuple[int, int],
    *,
    causal: bool = False,
    radius: int = -1,
    global_tokens: int = 0,
) -> bool:
    """Whether whole rows of softmax run as blocks of SDPA (see the module docstring): softmax, not causal,
    one id slot per query, no window band or global tokens, equal query and value head sizes ``head_dims``
    (d, d_v), off the CPU or where the 512-bit block products are missing."""
    return (
        float(alpha) == 1.0
        and not causal
        and not has_pattern(radius, global_tokens)
        and q_buckets.shape[-1] == 1
        and head_dims[0] == head_dims[1]
        and (q_buckets.device.type != "cpu" or wide_kernel() is None)
    )


def forward_plan(
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    alpha: float,
    causal: bool = False,
    radius: int = -1,
    global_tokens: int = 0,
    sdpa_blocks: bool = False,
    fused: bool = True,
) -> tuple[BlockPlan, bool]:
    """(the plan a forward runs, whether it is the fused kernel's): :func:`fused_plan` where ``fused`` (a
    call without gradients) and it takes the call, else :func:`plan_attention`, with whole buckets for
    ``sdpa_blocks`` (:func:`takes_sdpa_blocks`)."""
    pattern = dict(causal=causal, radius=radius, global_tokens=global_tokens)
    plan = fused_plan(q_buckets, k_buckets, alpha=alpha, **pattern) if fused else None
    if plan is not None:
        return plan, True
    return plan_attention(q_buckets, k_buckets, **pattern, whole_buckets=sdpa_blocks), False


def _global_rows(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    alpha: float,
    causal: bool,
    count: int,
    scale: float,
) -> None:
    """out[:, :, i] for the first ``count`` (global) queries, which attend every key (j ≤ i when causal):
    dense α-entmax rows, few of them. out (batch, heads, n, d_v); q, k, v as the call's."""
    g = min(count, q.shape[2])
    keys = g if causal else k.shape[2]  # causal: a global query i < g attends the keys j ≤ i < g
    every = torch.zeros(1, 1, 1, 1, dtype=torch.int32).expand(*q.shape[:2], max(g, keys), 1)
    rows = dense_bucketed_attention(
        q[:, :, :g],
        k[:, :, :keys],
        v[:, :, :keys],
        every[:, :, :g],
        every[:, :, :keys],
        alpha=alpha,
        causal=causal,
        scale=scale,
    )  # (batch, heads, g, d_v): every pair shares bucket 0
    out[:, :, :g] = rows.to(out.dtype)


def _flat(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, q_scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (batch·heads·n, d), times ``q_scale`` if given, and k, v (batch·kv_heads·m, d | d_v) in ``dtype``."""
    q_flat = q.to(dtype) if q_scale is None else q.to(dtype) * q_scale
    return (
        q_flat.reshape(-1, q.shape[-1]),
        k.to(dtype).reshape(-1, k.shape[-1]),
        v.to(dtype).reshape(-1, v.shape[-1]),
    )


def _grouped_keys(plan: BlockPlan, m: int, group: int) -> BlockPlan:
    """The plan reading key j of query group g (flat index g·m + j) from key/value group g // ``group``:
    grouped-query attention, each key and value read where it is, never copied per query head; its
    gradient sums over the query heads that share it (index_add in the backward)."""

    def shared(keys: torch.Tensor) -> torch.Tensor:  # query group g's key j → key/value group g // group
        return keys // (m * group) * m + keys % m

    classes = [replace(c, keys=shared(c.keys)) for c in plan.classes]
    band = plan.band_keys
    if band is not None:
        band = torch.where(band >= 0, shared(band), -1)
    return replace(plan, classes=classes, num_keys=plan.num_keys // group, band_keys=band)


def torch_bucketed_attention(
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
    fused: bool = True,
) -> torch.Tensor:
    """Bucketed α-entmax attention, with no n × m tensor beyond ``SHORT_KEYS`` keys; returns (batch, heads,
    n, d_v) in q's dtype.

    q (batch, heads, n, d), k (batch, kv_heads, m, d), v (batch, kv_heads, m, d_v) with kv_heads dividing
    heads; buckets int (batch, heads, n|m, T) with −1 for none. Inputs are not validated here
    (``attention_kernels.bucketed.bucketed_attention`` does that). ``fused=False`` keeps a call without
    gradients off the fused kernel (the unfused path it replaces, for comparisons).
    """
    b, h, n, d = q.shape
    m, dv = k.shape[2], v.shape[3]
    G, kv_groups = b * h, b * k.shape[1]
    if G * n == 0 or m == 0:
        # Nothing to attend; sums over no entries (exactly 0) keep the result on the autograd graph.
        return q.new_zeros(b, h, n, dv) + (q[..., :0].sum() + k[..., :0].sum() + v[..., :0].sum())
    scale = d**-0.5 if scale is None else scale
    if m <= SHORT_KEYS:
        window = 2 * radius + 1 if radius >= 0 else 0
        pattern = dict(causal=causal, window=window, global_tokens=global_tokens, scale=scale)
        return dense_bucketed_attention(q, k, v, q_buckets, k_buckets, alpha=alpha, **pattern)
    compute = compute_dtype(q.dtype)  # the normaliser never runs in half precision
    pattern = dict(causal=causal, radius=radius, global_tokens=global_tokens)
    by_sdpa = takes_sdpa_blocks(alpha, q_buckets, (d, dv), **pattern)
    differentiable = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))

    def planned(by_kernel: bool) -> tuple[BlockPlan, bool]:
        """:func:`forward_plan`, its keys read from their own key/value heads."""
        plan, by_kernel = forward_plan(
            q_buckets, k_buckets, alpha=alpha, **pattern, sdpa_blocks=by_sdpa, fused=by_kernel
        )
        return (_grouped_keys(plan, m, G // kv_groups) if kv_groups < G else plan), by_kernel

    plan, by_kernel = planned(fused and not differentiable)
    out = None
    if by_kernel:  # it scales the queries as it reads them: no scaled copy of q; None where it declines
        out = block_attention(*(x.contiguous() for x in _flat(q, k, v, compute)), plan, alpha, scale)
        if out is None:  # the paths below, on their own plan (a band needs its blocks there)
            plan, _ = planned(False)
        elif global_tokens > 0:
            _global_rows(
                out.view(b, h, n, dv), q, k, v, alpha=alpha, causal=causal, count=global_tokens, scale=scale
            )
    if out is None and by_sdpa and plan.classes:
        if q.device.type == "cuda":
            # SDPA's kernels accumulate in float32 themselves, so half-precision inputs stay as they are (its
            # flash kernel takes no float32) and the scale is SDPA's (not a rounding of the scaled queries)
            out = _whole_rows_sdpa(*_flat(q, k, v, q.dtype), plan, scale)
        else:
            out = _whole_rows_sdpa(*_flat(q, k, v, compute, scale), plan, 1.0)
    if out is None:
        # the scale on the n × d queries, not on the scores
        scaled = _flat(q, k, v, compute, scale)
        if differentiable:
            out = BucketBlockAttention.apply(*scaled, plan, float(alpha))
        else:
            out = _blocks_forward(*scaled, plan, float(alpha), keep=False)[0]
    return out.view(b, h, n, dv).to(q.dtype)
