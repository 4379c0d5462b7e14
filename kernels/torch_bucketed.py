"""Sub-quadratic PyTorch bucketed attention (the CPU path, and the reference the Triton kernel must match).

Math. For each (batch, head) the attended set of query i is

    A_i = {j : q_buckets[i] ∩ k_buckets[j] ∖ {−1} ≠ ∅} ∪ {j : |i − j| ≤ radius} ∪ {j : i < g or j < g},

intersected with {j ≤ i} when causal (g = global_tokens; radius = w // 2 of the window size w, −1 for no
window: :mod:`kernels.attended` is the definition), and the output is o_i = Σ_{j∈A_i} p_ij v_j with
p_i = α-entmax(s_i) restricted to A_i, s_ij = scale · q_i·k_j:

    α-entmax(s)_j = [(α − 1) s_j − τ]₊^{1/(α−1)},   τ such that Σ_j p_j = 1   (softmax when α = 1).

A query with A_i = ∅ outputs zeros. Each pair counts once however many buckets it shares.

Nothing of size n × n is ever built; memory and work grow with the number of attended pairs. Two layouts:

Single-bucket blocks (every token holds at most one id slot, T = 1, and there is no window or global token:
the common learned-bucket case). :mod:`kernels.bucket_blocks` sorts the tokens by (bucket, position), so
each bucket is a contiguous run and attention is a batch of dense blocks (a query chunk against its bucket's
keys, causal by position), grouped into classes of one shape. Each query sits in one block row, so the
normaliser is a plain row operation. Blocks are processed a cache-sized chunk (``CHUNK_ENTRIES`` entries)
at a time, scores, normaliser and output product together; the forward keeps the probabilities for the
backward, which walks the same chunks (dv = pᵀ·do, dp = do·vᵀ, ds = entmax′(dp), dq = ds·k, dk = dsᵀ·q).

Tiles (any T, window, global tokens):

* Bucket pairs, as in hash-sparse flash attention. Every token is copied once per bucket id it holds; the
  copies are sorted by (batch·head, bucket id) and the sorted sequence is cut into tiles of ``TILE`` copies,
  separately for queries and keys. A (query tile, key tile) *task* exists when their id ranges overlap, which
  the sorted order turns into a contiguous run of key tiles found by binary search. A pair (i, j) met in
  bucket b is kept only if b is the smallest id the two tokens share, so no global de-duplication is needed.
* Pattern pairs (window band and global rows/columns) use tiles of consecutive positions; a bucket pair that
  the pattern also covers is dropped from the bucket side, so every attended pair sits in exactly one task.
* Every task is a dense TILE × TILE block: scores by one batched matmul, a boolean mask marks the attended
  pairs, the normaliser runs over the masked blocks with per-query sums scattered across tasks, and the
  output is a second batched matmul scattered back onto queries with ``index_add``.

The tiles hold the attended pairs plus tile padding: with b buckets of equal size at most one partial tile
per bucket boundary, O(n²/b + n·TILE) entries per head; at worst (a tile of queries from many small buckets
facing big key buckets) TILE entries per pair. Groups are processed in runs of about ``CHUNK_PAIRS`` pairs.

α-entmax threshold. Per query, with x_j = (α − 1)(s_j − max s), F(τ) = Σ_j [x_j − τ]₊^{1/(α−1)} decreases
and F(τ*) = 1 for some τ* in [−1, −(1/|A_i|)^{α−1}]. Newton steps on F^{α−1} − 1 (a norm of (x − τ)₊, so
convex for α ≤ 2 and steps from below never overshoot, yet nearly linear far from the root) find τ*. For
α = 1.5 and α = 2 every step also solves the quadratic or linear equation on the current support exactly and
accepts that value once its support is verified unchanged, which is the sort-based value; other α stop on a
tolerance, safeguarded by bisection on the bracket. The backward pass is the exact entmax Jacobian: with
g = p^{2−α}, ds = g·(dp − Σ g·dp / Σ g) per query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.bucket_blocks import BlockClass, BlockPlan, plan_blocks

TILE = 64
"""Rows and columns of one task block."""

CHUNK_PAIRS = 2**24
"""Attended pairs handled per pass: bounds the transient memory of one pass (scores, masks, buffers)."""

CHUNK_ENTRIES = 2**17
"""Score entries per chunk of the single-bucket path: its scores, probabilities and gradients stay in L2."""

_MASKED = -torch.finfo(torch.float32).max
"""Added to scores off the mask in the block path: far below any real score, yet finite (see _normalise)."""

_EXP_FLOOR = -80.0
"""exp(−80) ≈ 2e−35 is a normal float32; the entries below it are negligible next to the maximum's 1."""

_MAX_NEWTON_STEPS = 100
"""Bisection alone halves the unit bracket each step; 100 steps exhaust float64 resolution."""


@dataclass(frozen=True)
class TilePlan:
    """Where the attended pairs live: dense TILE × TILE blocks over gathered query and key rows.

    Query indices are flat over (batch·head, position), ``g·n + i``, with ``num_queries`` marking padding;
    key indices likewise ``g·m + j`` with ``num_keys`` marking padding.
    """

    task_rows: torch.Tensor  # (tasks, TILE) int64 flat query index of each block row
    task_cols: torch.Tensor  # (tasks, TILE) int64 flat key index of each block column
    mask: torch.Tensor  # (tasks, TILE, TILE) bool, True on attended pairs
    num_queries: int  # batch·heads·n
    num_keys: int  # batch·heads·m

    @property
    def num_pairs(self) -> int:
        """Number of attended pairs (each counted once)."""
        return int(self.mask.sum())

    @property
    def num_entries(self) -> int:
        """Block entries the kernel computes scores for (attended pairs plus tile padding)."""
        return self.mask.numel()

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat (query, key) indices of every attended pair, each pair once."""
        task, row, col = self.mask.nonzero(as_tuple=True)  # (pairs,) each
        return self.task_rows[task, row], self.task_cols[task, col]


def _drop_repeated_ids(ids: torch.Tensor) -> torch.Tensor:
    """Replace an id already listed earlier for the same token by −1; ids (..., T)."""
    T = ids.shape[-1]
    if T == 1:
        return ids
    same = ids[..., :, None] == ids[..., None, :]  # (..., T, T)
    earlier = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril(-1)
    return ids.masked_fill((same & earlier).any(-1), -1)


def _sorted_tiles(ids: torch.Tensor, nid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of every token per bucket id, sorted by (group, id) and cut into tiles.

    ids: (G, L, T) int64 with −1 for none. Returns keys (tiles, TILE) holding ``group·nid + id`` (−1 on
    padding) and tokens (tiles, TILE) holding the flat token index ``group·L + position`` (G·L on padding).
    The stable sort keeps positions ascending inside a bucket.
    """
    G, L, _ = ids.shape
    valid = ids >= 0
    group = torch.arange(G, device=ids.device)[:, None, None]
    token = group * L + torch.arange(L, device=ids.device)[None, :, None]  # (G, L, 1)
    keys = (group * nid + ids)[valid]  # (copies,) in (group, position, slot) order
    tokens = token.expand_as(ids)[valid]
    keys, order = torch.sort(keys, stable=True)
    tokens = tokens[order]
    pad = -keys.numel() % TILE
    keys = torch.cat([keys, keys.new_full((pad,), -1)]).view(-1, TILE)
    tokens = torch.cat([tokens, tokens.new_full((pad,), G * L)]).view(-1, TILE)
    return keys, tokens


def _tile_ranges(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest and largest valid key of each tile; keys (tiles, TILE) with −1 on padding."""
    valid = keys >= 0
    big = torch.iinfo(keys.dtype).max
    return keys.masked_fill(~valid, big).amin(1), keys.amax(1)


def _runs(start: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand runs: item r gets ids start[r], ..., start[r] + count[r] − 1. Returns (owner, id)."""
    owner = torch.repeat_interleave(torch.arange(count.numel(), device=count.device), count)
    first = torch.cumsum(count, 0) - count  # (runs,) offset of each run
    within = torch.arange(owner.numel(), device=count.device) - first[owner]
    return owner, start[owner] + within


def _pattern(i: torch.Tensor, j: torch.Tensor, radius: int, global_tokens: int) -> torch.Tensor:
    """Window band ∪ global rows and columns on positions i (…, TILE, 1), j (…, 1, TILE)."""
    hit = torch.zeros(torch.broadcast_shapes(i.shape, j.shape), dtype=torch.bool, device=i.device)
    if radius >= 0:
        hit |= (i - j).abs() <= radius
    if global_tokens > 0:
        hit |= (i < global_tokens) | (j < global_tokens)
    return hit


def _bucket_tasks(
    q_ids: torch.Tensor, k_ids: torch.Tensor, *, causal: bool, radius: int, global_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blocks of pairs that share a bucket; q_ids (G, n, T), k_ids (G, m, T′) int64 without repeats."""
    n, Tq = q_ids.shape[1:]
    m, Tk = k_ids.shape[1:]
    # Sort key of a copy: group · nid + id, so groups never mix.
    nid = int(torch.cat([q_ids.flatten(), k_ids.flatten(), q_ids.new_zeros(1)]).max()) + 1
    q_keys, q_tok = _sorted_tiles(q_ids, nid)  # (qtiles, TILE) each
    k_keys, k_tok = _sorted_tiles(k_ids, nid)  # (ktiles, TILE) each
    q_lo, q_hi = _tile_ranges(q_keys)
    k_lo, k_hi = _tile_ranges(k_keys)
    # Key tiles are sorted, so those overlapping [q_lo, q_hi] form one run found by binary search.
    start = torch.searchsorted(k_hi.contiguous(), q_lo.contiguous(), side="left")
    stop = torch.searchsorted(k_lo.contiguous(), q_hi.contiguous(), side="right")
    task_q, task_k = _runs(start, (stop - start).clamp_min(0))

    qk = q_keys[task_q][:, :, None]  # (tasks, TILE, 1)
    kk = k_keys[task_k][:, None, :]  # (tasks, 1, TILE)
    mask = (qk == kk) & (qk >= 0)
    rows, cols = q_tok[task_q], k_tok[task_k]  # (tasks, TILE) flat token indices
    i, j = (rows % n)[:, :, None], (cols % m)[:, None, :]
    if Tq > 1 and Tk > 1:
        # Two tokens can share several buckets: keep the pair only in the smallest one.
        bucket = qk % nid
        q_all = torch.cat([q_ids.reshape(-1, Tq), q_ids.new_full((1, Tq), -2)])[rows]  # (tasks, TILE, Tq)
        k_all = torch.cat([k_ids.reshape(-1, Tk), k_ids.new_full((1, Tk), -3)])[cols]  # (tasks, TILE, Tk)
        q_all = q_all.masked_fill(q_all < 0, -2)  # never equal to a key's −1
        for s in range(Tq):
            qs = q_all[:, :, s, None]  # (tasks, TILE, 1)
            for t in range(Tk):
                mask &= ~((qs == k_all[:, None, :, t]) & (qs < bucket))
    if causal:
        mask &= j <= i
    if radius >= 0 or global_tokens > 0:
        mask &= ~_pattern(i, j, radius, global_tokens)
    return rows, cols, mask


def _pattern_tasks(
    G: int, n: int, m: int, device: torch.device, *, causal: bool, radius: int, global_tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blocks covering the window band and the global rows/columns, in position order."""
    nqt, nkt = -(-n // TILE), -(-m // TILE)
    a = torch.arange(nqt, device=device)  # query tile of one group
    first_row, last_row = a * TILE, a * TILE + TILE - 1
    # Run 1: key tiles [0, c1) for global columns; every key tile when the query tile has a global row.
    c1 = torch.full_like(a, min(-(-global_tokens // TILE), nkt))
    c1 = torch.where(first_row < global_tokens, nkt, c1)
    # Run 2: the window band's key tiles not already in run 1.
    if radius >= 0:
        b0 = torch.maximum((first_row - radius).clamp_min(0) // TILE, c1)
        b1 = torch.clamp((last_row + radius) // TILE, max=nkt - 1)
    else:
        b0, b1 = c1, c1 - 1
    if causal:
        c1 = torch.minimum(c1, a + 1)
        b1 = torch.minimum(b1, a)
    c2 = (b1 - b0 + 1).clamp_min(0)
    tile_a, tile_b = _runs(torch.zeros_like(a), c1)
    tile_a2, tile_b2 = _runs(b0, c2)
    tile_a, tile_b = torch.cat([tile_a, tile_a2]), torch.cat([tile_b, tile_b2])  # (tasks of one group,)

    r = torch.arange(TILE, device=device)
    i = (tile_a[:, None] * TILE + r)[:, :, None]  # (tasks, TILE, 1) positions
    j = (tile_b[:, None] * TILE + r)[:, None, :]  # (tasks, 1, TILE)
    mask = _pattern(i, j, radius, global_tokens) & (i < n) & (j < m)
    if causal:
        mask &= j <= i
    g = torch.arange(G, device=device)[:, None, None]  # (G, 1, 1)
    rows = torch.where(i[:, :, 0] < n, g * n + i[:, :, 0], G * n).reshape(-1, TILE)  # (G·tasks, TILE)
    cols = torch.where(j[:, 0, :] < m, g * m + j[:, 0, :], G * m).reshape(-1, TILE)
    return rows, cols, mask.expand(G, *mask.shape).reshape(-1, TILE, TILE)


def plan_tiles(
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    causal: bool = False,
    radius: int = -1,
    global_tokens: int = 0,
) -> TilePlan:
    """Enumerate the attended pairs as masked dense blocks; buckets (batch, heads, n|m, T) int."""
    b, h, n, _ = q_buckets.shape
    m = k_buckets.shape[2]
    G = b * h
    q_ids = _drop_repeated_ids(q_buckets.reshape(G, n, q_buckets.shape[3]).long())  # (G, n, T)
    k_ids = _drop_repeated_ids(k_buckets.reshape(G, m, k_buckets.shape[3]).long())  # (G, m, T′)
    rows, cols, mask = _bucket_tasks(q_ids, k_ids, causal=causal, radius=radius, global_tokens=global_tokens)
    if radius >= 0 or global_tokens > 0:
        p_rows, p_cols, p_mask = _pattern_tasks(
            G, n, m, q_buckets.device, causal=causal, radius=radius, global_tokens=global_tokens
        )
        rows, cols, mask = torch.cat([rows, p_rows]), torch.cat([cols, p_cols]), torch.cat([mask, p_mask])
    keep = mask.flatten(1).any(1)  # drop blocks with no attended pair (causal cuts, range overlaps)
    return TilePlan(rows[keep], cols[keep], mask[keep], G * n, G * m)


def _per_query(values: torch.Tensor, rows: torch.Tensor, num_queries: int) -> torch.Tensor:
    """Sum per query of per-row values (tasks, TILE) → (num_queries + 1,); the last slot takes padding."""
    out = values.new_zeros(num_queries + 1)
    return out.index_add_(0, rows.reshape(-1), values.reshape(-1))


class _WholeRows:
    """Reductions when every block row holds all keys of its query: along the last dim, (…, W) → (…)."""

    @staticmethod
    def sum(values: torch.Tensor) -> torch.Tensor:
        return values.sum(-1)

    @staticmethod
    def max(values: torch.Tensor) -> torch.Tensor:
        return values.amax(-1)

    @staticmethod
    def count(hit: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Entries where the boolean ``hit`` holds, per row, in ``dtype``."""
        return hit.sum(-1, dtype=dtype)

    @staticmethod
    def at(per_query: torch.Tensor) -> torch.Tensor:
        """Per-query values (…) broadcast over a row's entries (…, 1)."""
        return per_query[..., None]


@dataclass(frozen=True)
class _SpreadRows:
    """Reductions when a query's keys are spread over several block rows: rows (tasks, TILE) names the query
    of each row, in [0, num_queries] (num_queries = padding); per-query values are (num_queries + 1,)."""

    rows: torch.Tensor
    num_queries: int

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return _per_query(values.sum(-1), self.rows, self.num_queries)

    def count(self, hit: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return _per_query(hit.sum(-1, dtype=dtype), self.rows, self.num_queries)

    def max(self, values: torch.Tensor) -> torch.Tensor:
        q_max = values.new_full((self.num_queries + 1,), float("-inf"))
        return q_max.scatter_reduce_(0, self.rows.reshape(-1), values.amax(-1).reshape(-1), "amax")

    def at(self, per_query: torch.Tensor) -> torch.Tensor:
        return per_query[self.rows][:, :, None]


Reducer = _WholeRows | _SpreadRows


def _newton_threshold(x: torch.Tensor, count: torch.Tensor, alpha: float, red: Reducer) -> torch.Tensor:
    """τ per query for x = (α − 1)(s − max) (−inf off the mask), any α > 1; count = attended keys per query.

    F(τ) = Σ_j [x_j − τ]₊^β (β = 1/(α − 1)) decreases and F(τ*) = 1 for τ* in [−1, −(1/count)^{α−1}].
    Newton on h(τ) = F(τ)^{1/β} − 1, safeguarded by bisection on that bracket.
    """
    beta = 1.0 / (alpha - 1.0)
    lo = torch.full_like(count, -1.0)  # F(lo) ≥ 1: the maximum alone contributes 1
    hi = -((1.0 / count.clamp_min(1)) ** (alpha - 1.0))  # F(hi) ≤ 1: each key contributes ≤ 1/count
    tau = lo.clone()
    tol = 4 * torch.finfo(x.dtype).eps
    diff = torch.empty_like(x)  # reused: fresh large buffers cost page faults
    for _ in range(_MAX_NEWTON_STEPS):
        torch.sub(x, red.at(tau), out=diff).clamp_min_(0)
        active = diff > 0
        mass = red.sum(diff.pow(beta))
        slope = beta * red.sum(torch.where(active, diff, 1.0).pow(beta - 1.0).masked_fill(~active, 0))
        lo = torch.where(mass >= 1, tau, lo)
        hi = torch.where(mass < 1, tau, hi)
        # For β ≥ 1, h is a norm of (x − τ)₊: convex and decreasing, so steps from below never overshoot,
        # yet nearly linear far from the root, where Newton on F crawls.
        newton = tau + beta * (mass - mass.pow(1.0 - 1.0 / beta)) / slope
        settled = ((newton - tau).abs() <= tol) | (hi - lo <= tol)
        inside = (newton > lo) & (newton < hi)  # a step onto the bracket's end could cycle: bisect instead
        tau = torch.where(settled, tau, torch.where(inside, newton, 0.5 * (lo + hi)))
        if bool(settled.all()):
            break
    return tau


def _support_threshold(
    x: torch.Tensor, start: torch.Tensor, alpha: float, red: Reducer, *, first_check: int = 1
) -> torch.Tensor:
    """Exact τ per query for α = 2 (β = 1) or α = 1.5 (β = 2); x = (α − 1)(s − max), start ≤ τ* per query.

    At τ ≤ τ* the support S = {x > τ} contains the true one. With y = x − τ on S, the τ′ = τ + δ solving
    Σ_S (y − δ) = 1 or Σ_S (y − δ)² = 1 (smaller root, written without cancellation) is τ* exactly when
    {x > τ′} still has |S| elements (nested sets, so then it is S itself): the sort-based value. Rows not yet
    there take a Newton step on F^{1/β} − 1 from below, which never overshoots. The check starts at step
    ``first_check`` (from τ = −1 the first support is almost never final). With whole rows, once most rows
    are settled the rest continue on their own (a gather of few rows beats more passes over all).
    """
    beta = 1.0 / (alpha - 1.0)
    tau = start
    diff = torch.empty_like(x)  # reused: fresh large buffers cost page faults
    square = torch.empty_like(x) if beta == 2.0 else None
    for step in range(_MAX_NEWTON_STEPS):
        torch.sub(x, red.at(tau), out=diff).clamp_min_(0)
        s1 = red.sum(diff)
        if square is None:
            k = red.sum(diff.sign_())
            exact = newton = tau + (s1 - 1.0) / k.clamp_min(1)
        else:
            s2 = red.sum(torch.mul(diff, diff, out=square))
            k = red.sum(diff.sign_())  # |S|; sign of a float, cheaper than counting a boolean mask
            root = (s1 * s1 - k * (s2 - 1.0)).clamp_min(0).sqrt()
            exact = tau + (s2 - 1.0) / (s1 + root).masked_fill(s1 + root == 0, 1.0)
            newton = tau + (s2 - s2.sqrt()) / s1.masked_fill(s1 == 0, 1.0)
        if step < first_check:
            tau = newton
            continue
        done = red.sum(torch.sub(x, red.at(exact), out=diff).clamp_min_(0).sign_()) == k
        tau = torch.where(done, exact, newton)
        left = int(done.numel() - done.sum())
        if left == 0:
            break
        if red is _WholeRows and 2 * left <= done.numel():
            rest = (~done).flatten().nonzero().squeeze(1)  # (left,) rows still searching
            flat = tau.flatten()  # a copy or a view of the fresh τ: safe to write into
            sub = x.reshape(-1, x.shape[-1]).index_select(0, rest)  # (left, M)
            flat[rest] = _support_threshold(sub, flat[rest], alpha, red, first_check=0)
            return flat.view(tau.shape)
    return tau


def _normalise(
    scores: torch.Tensor, alpha: float, red: Reducer, *, inplace: bool, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """p = α-entmax(s) per query (softmax for α = 1) over the entries ``red`` gathers, overwriting scores
    when ``inplace``. A query without keys gets zeros.

    α-entmax(s)_j = [(α − 1)(s_j − max s) − τ]₊^{1/(α−1)} with τ such that Σ_j p_j = 1.

    Entries off the mask hold −inf, or, when ``keep`` (1 on the mask, 0 off it) is given, ``_MASKED`` or
    less: exp then runs on arguments clamped to ``_EXP_FLOOR`` (below it exp underflows, and on CPU takes a
    slow path) and ``keep`` zeroes the entries off the mask exactly.
    """
    q_max = red.max(scores)
    q_max = q_max.masked_fill(q_max <= 0.5 * _MASKED, 0.0)  # empty queries: any finite shift
    shifted = scores.sub_(red.at(q_max)) if inplace else scores - red.at(q_max)  # ≤ 0 off empty queries
    if alpha == 1.0:
        probs = shifted.exp_() if keep is None else shifted.clamp_min_(_EXP_FLOOR).exp_().mul_(keep)
    else:
        x = shifted.mul_(alpha - 1.0)
        if alpha in (1.5, 2.0):
            tau = _support_threshold(x, torch.full_like(q_max, -1.0), alpha, red)
        else:
            count = red.count(x > 0.5 * _MASKED, x.dtype) if keep is None else red.sum(keep)
            tau = _newton_threshold(x, count, alpha, red)
        probs = x.sub_(red.at(tau)).clamp_min_(0)
        if alpha == 1.5:
            probs.square_()
        elif alpha != 2.0:
            probs.pow_(1.0 / (alpha - 1.0))
    total = red.sum(probs)
    return probs.div_(red.at(total.masked_fill(total == 0, 1.0)))


def entmax_gradient_weight(probs: torch.Tensor, alpha: float) -> torch.Tensor:
    """g = p^{2−α} of α-entmax probabilities p, elementwise: p itself for softmax (the same tensor, not a
    copy), the support's indicator for sparsemax, 0 off the support. The Jacobian of p = α-entmax(s) is
    diag(g) − g gᵀ / Σ g."""
    if alpha == 1.0:
        return probs
    if alpha == 2.0:
        return (probs > 0).to(probs.dtype)
    if alpha == 1.5:
        return probs.sqrt()
    return torch.where(probs > 0, probs, 1.0).pow(2.0 - alpha).masked_fill(probs == 0, 0)


def _normalise_backward(probs: torch.Tensor, grad: torch.Tensor, alpha: float, red: Reducer) -> torch.Tensor:
    """ds from dp for p = α-entmax(s): with g = :func:`entmax_gradient_weight`, ds = g·(dp − Σ g·dp / Σ g)
    per query. Overwrites ``grad``."""
    weight = entmax_gradient_weight(probs, alpha)
    wg = grad.mul_(weight)
    den = red.sum(weight)
    ratio = red.sum(wg) / den.masked_fill(den == 0, 1.0)
    if weight is probs:
        return wg.addcmul_(weight, red.at(ratio), value=-1.0)
    return wg.sub_(weight.mul_(red.at(ratio)))


class BlockEntmax(torch.autograd.Function):
    """α-entmax (softmax for α = 1) per query over masked blocks whose rows belong to queries.

    scores (tasks, TILE, TILE) with −inf off the mask; rows (tasks, TILE) int64 query of each block row, in
    [0, num_queries] (num_queries = padding). A query's keys may be spread over several blocks.
    """

    @staticmethod
    def forward(
        ctx, scores: torch.Tensor, rows: torch.Tensor, num_queries: int, alpha: float
    ) -> torch.Tensor:
        probs = _normalise(scores, alpha, _SpreadRows(rows, num_queries), inplace=False)
        ctx.save_for_backward(probs, rows)
        ctx.num_queries, ctx.alpha = num_queries, alpha
        return probs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        probs, rows = ctx.saved_tensors
        ds = _normalise_backward(probs, grad.clone(), ctx.alpha, _SpreadRows(rows, ctx.num_queries))
        return ds, None, None, None


def _group_chunks(
    q_buckets: torch.Tensor, k_buckets: torch.Tensor, radius: int, global_tokens: int
) -> list[int]:
    """Split the batch·heads groups into consecutive runs of at most ~``CHUNK_PAIRS`` attended pairs.

    The per-group bound Σ_b |queries in b|·|keys in b| + window band + global rows/columns needs bucket
    sizes only; a group above the budget forms a run of its own. Returns the run lengths.
    """
    b, h, n, _ = q_buckets.shape
    m = k_buckets.shape[2]
    G = b * h
    q_ids, k_ids = q_buckets.reshape(G, -1).long(), k_buckets.reshape(G, -1).long()  # (G, n·T), (G, m·T′)
    nid = int(torch.cat([q_ids.flatten(), k_ids.flatten(), q_ids.new_zeros(1)]).max()) + 1
    group = torch.arange(G, device=q_ids.device)[:, None]
    q_keys, q_count = torch.unique((group * nid + q_ids)[q_ids >= 0], return_counts=True)  # (buckets,)
    k_keys, k_count = torch.unique((group * nid + k_ids)[k_ids >= 0], return_counts=True)
    pairs = torch.zeros(G, dtype=torch.int64, device=q_ids.device)
    if k_keys.numel():
        at = torch.searchsorted(k_keys, q_keys).clamp_max(k_keys.numel() - 1)
        shared = torch.where(k_keys[at] == q_keys, q_count * k_count[at], 0)
        pairs.index_add_(0, q_keys // nid, shared)
    pairs += (n * min(m, 2 * radius + 1) if radius >= 0 else 0) + global_tokens * (n + m)
    chunk = (torch.cumsum(pairs, 0) - pairs) // CHUNK_PAIRS  # (G,) non-decreasing run index
    return torch.unique_consecutive(chunk, return_counts=True)[1].tolist()


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    alpha: float,
    causal: bool,
    radius: int,
    global_tokens: int,
) -> torch.Tensor:
    """One pass over all groups of its inputs; q (b, h, n, d) in the compute dtype, already scaled."""
    b, h, n, d = q.shape
    dv = v.shape[3]
    plan = plan_tiles(q_buckets, k_buckets, causal=causal, radius=radius, global_tokens=global_tokens)
    rows, cols = plan.task_rows.reshape(-1), plan.task_cols.reshape(-1)  # (tasks·TILE,)
    tasks = plan.task_rows.shape[0]
    # One zero row appended so padding indices gather zeros (their scores are masked anyway).
    qf = torch.cat([q.reshape(-1, d), q.new_zeros(1, d)])  # (b·h·n + 1, d)
    kf = torch.cat([k.reshape(-1, d), k.new_zeros(1, d)])  # (b·h·m + 1, d)
    vf = torch.cat([v.reshape(-1, dv), v.new_zeros(1, dv)])  # (b·h·m + 1, d_v)

    q_blocks = qf.index_select(0, rows).view(tasks, TILE, d)
    k_blocks = kf.index_select(0, cols).view(tasks, TILE, d)
    scores = torch.bmm(q_blocks, k_blocks.transpose(1, 2))  # (tasks, TILE, TILE)
    scores = scores.masked_fill_(~plan.mask, float("-inf"))  # bmm keeps its inputs, not its output
    probs = BlockEntmax.apply(scores, plan.task_rows, plan.num_queries, alpha)
    blocks = torch.bmm(probs, vf.index_select(0, cols).view(tasks, TILE, dv))  # (tasks, TILE, d_v)
    out = qf.new_zeros(plan.num_queries + 1, dv).index_add(0, rows, blocks.reshape(-1, dv))
    return out[:-1].view(b, h, n, dv)


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of x (N, d) at index (c, L): (c, L, d)."""
    return x.index_select(0, index.reshape(-1)).view(*index.shape, x.shape[1])


def _chunks(blocks: BlockClass) -> list[tuple[int, int]]:
    """Consecutive block ranges of about ``CHUNK_ENTRIES`` score entries (cache-sized)."""
    count, rows = blocks.queries.shape
    step = max(1, CHUNK_ENTRIES // (rows * blocks.keys.shape[1]))
    return [(a, min(a + step, count)) for a in range(0, count, step)]


def _block_scores(
    q: torch.Tensor, k: torch.Tensor, blocks: BlockClass, a: int, b: int, out: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores s = q_i·k_j of blocks a..b, ``_MASKED`` added off the attended set, and the mask as floats
    (1 on it, 0 off it; None when the class has no entry off it). q (N, d), k (M, d) flat over groups;
    s (c, L, M)."""
    scores = torch.bmm(_rows(q, blocks.queries[a:b]), _rows(k, blocks.keys[a:b]).transpose(1, 2), out=out)
    if not blocks.masked:
        return scores, None
    # Positions are whole numbers, so their difference clamped to [0, 1] is the indicator of key_pos > limit:
    # float arithmetic, cheaper than a boolean mask on CPU.
    off = torch.sub(blocks.key_pos[a:b, None, :], blocks.query_limit[a:b, :, None]).clamp_(0, 1)  # (c, L, M)
    scores.add_(off, alpha=_MASKED)
    return scores, off.neg_().add_(1.0)


def _blocks_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, alpha: float, *, keep: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """o_i = Σ_j p_ij v_j over the plan's blocks, a cache-sized chunk at a time; q (N, d), k (M, d),
    v (M, d_v) flat over groups. Returns o (N, d_v) and, when ``keep``, p per class (blocks, L, M)."""
    out = v.new_zeros(plan.num_queries, v.shape[1])
    kept = []
    for blocks in plan.classes:
        probs = q.new_empty(*blocks.queries.shape, blocks.keys.shape[1]) if keep else None
        for a, b in _chunks(blocks):
            scores, on = _block_scores(q, k, blocks, a, b, None if probs is None else probs[a:b])
            p = _normalise(scores, alpha, _WholeRows, inplace=True, keep=on)
            vb = _rows(v, blocks.keys[a:b])
            out.index_add_(0, blocks.queries[a:b].reshape(-1), torch.bmm(p, vb).flatten(0, 1))
        if probs is not None:
            kept.append(probs)
    return out, kept


class BucketBlockAttention(torch.autograd.Function):
    """Attention over a :class:`~kernels.bucket_blocks.BlockPlan`: every query's keys in one block row.

    q (N, d) already scaled, k (M, d), v (M, d_v) flat over groups; returns o (N, d_v). Saves p (the
    attended pairs plus padding); the backward recomputes nothing but the gathers:
    dv = pᵀ·do, dp = do·vᵀ, ds = entmax′(dp), dq = ds·k, dk = dsᵀ·q.
    """

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BlockPlan, alpha: float
    ) -> torch.Tensor:
        out, probs = _blocks_forward(q, k, v, plan, alpha, keep=True)
        ctx.save_for_backward(q, k, v, *probs)
        ctx.plan, ctx.alpha = plan, alpha
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, *probs = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for blocks, p_all in zip(ctx.plan.classes, probs, strict=True):
            for a, b in _chunks(blocks):
                p, rows, cols = p_all[a:b], blocks.queries[a:b], blocks.keys[a:b]
                qb, kb, vb, gb = _rows(q, rows), _rows(k, cols), _rows(v, cols), _rows(grad, rows)
                dv.index_add_(0, cols.reshape(-1), torch.bmm(p.transpose(1, 2), gb).flatten(0, 1))
                ds = _normalise_backward(p, torch.bmm(gb, vb.transpose(1, 2)), ctx.alpha, _WholeRows)
                dq.index_add_(0, rows.reshape(-1), torch.bmm(ds, kb).flatten(0, 1))
                dk.index_add_(0, cols.reshape(-1), torch.bmm(ds.transpose(1, 2), qb).flatten(0, 1))
        return dq, dk, dv, None, None


def _single_ids(buckets: torch.Tensor) -> torch.Tensor | None:
    """Ids (batch, heads, tokens, T) as (batch·heads, tokens) int64 when every token holds at most one
    distinct id ≥ 0 (−1 where none), else None."""
    b, h, n, T = buckets.shape
    ids = buckets.reshape(b * h, n, T).long()
    if T > 1:
        ids = _drop_repeated_ids(ids)
        if bool(((ids >= 0).sum(-1) > 1).any()):
            return None
    return ids.amax(-1)


def _block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_ids: torch.Tensor,
    k_ids: torch.Tensor,
    *,
    alpha: float,
    causal: bool,
) -> torch.Tensor:
    """The single-bucket path; q (b, h, n, d) in the compute dtype, already scaled; ids (b·h, n | m) int64."""
    b, h, n, d = q.shape
    m, dv = k.shape[2], v.shape[3]
    G = b * h
    plan = plan_blocks(q_ids, k_ids, causal=causal)
    flat = q.reshape(G * n, d), k.reshape(G * m, d), v.reshape(G * m, dv)
    if torch.is_grad_enabled() and any(x.requires_grad for x in flat):
        out = BucketBlockAttention.apply(*flat, plan, alpha)
    else:
        out = _blocks_forward(*flat, plan, alpha, keep=False)[0]
    return out.view(b, h, n, dv)


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
) -> torch.Tensor:
    """Bucketed α-entmax attention without any n × n tensor; returns (batch, heads, n, d_v) in q's dtype.

    q (batch, heads, n, d), k (batch, heads, m, d), v (batch, heads, m, d_v); buckets int
    (batch, heads, n|m, T) with −1 for none. Inputs are not validated here (``kernels.bucketed_attention``
    does that). Groups of (batch, head) are processed in runs of about ``CHUNK_PAIRS`` attended pairs.
    """
    b, h, n, d = q.shape
    m, dv = k.shape[2], v.shape[3]
    if b * h * n == 0 or m == 0:
        # Nothing to attend; the product keeps the result connected to the autograd graph.
        return q.new_zeros(b, h, n, dv) + 0.0 * (q.sum() + k.sum() + v.sum())
    scale = d**-0.5 if scale is None else scale
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32  # normaliser never in half
    # Groups side by side as heads of one batch; the scale goes on the n × d queries, not on the scores.
    parts = (
        (q.to(compute) * scale).reshape(1, b * h, n, d),
        k.to(compute).reshape(1, b * h, m, d),
        v.to(compute).reshape(1, b * h, m, dv),
        q_buckets.reshape(1, b * h, n, q_buckets.shape[3]),
        k_buckets.reshape(1, b * h, m, k_buckets.shape[3]),
    )
    q_single, k_single = _single_ids(q_buckets), _single_ids(k_buckets)
    if q_single is not None and k_single is not None and radius < 0 and global_tokens == 0:
        out = _block_attention(*parts[:3], q_single, k_single, alpha=float(alpha), causal=causal)
        return out.view(b, h, n, dv).to(q.dtype)
    sizes = _group_chunks(q_buckets, k_buckets, radius, global_tokens)
    opts = dict(alpha=float(alpha), causal=causal, radius=radius, global_tokens=global_tokens)
    outs = [_attend(*chunk, **opts) for chunk in zip(*(x.split(sizes, dim=1) for x in parts), strict=True)]
    return torch.cat(outs, dim=1).view(b, h, n, dv).to(q.dtype)
