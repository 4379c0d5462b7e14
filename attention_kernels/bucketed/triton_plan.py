"""The Triton bucketed kernel's plan: the (token, bucket) entries of each side sorted by (bucket, position),
and for each block of sorted entries the range of the other side's entries it meets.

Per batch·head row of L tokens with T id slots, a valid id b (≥ 0, the first copy of a repeat) of token l
is the entry key b·L + l; one sort of the L·T keys (invalid cells last, at INT64_MAX) orders the entries by
(bucket, position). From the sorted keys and the sort's permutation, each entry e gets its token, bucket
and rank (the slot of that bucket among the token's ids), and each (token, slot) its entry row, the row its
partial output lands in. The range of a block of row entries is a pair of binary searches over the other
side's sorted buckets (``torch.searchsorted``'s left and right), cut at the block's own positions when
causal (see :func:`bucket_ranges`).

The work is small (n·T entries) and on a GPU the cost is the launches: as a sequence of 94 PyTorch ops the
plan took 2.3 ms of a 3.8 ms top-1 forward at n = 16384 on an H200. Here a side costs two kernels and one
sort (and the sort of each token's ids when T > 1), the ranges one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from attention_kernels.attended import has_pattern

INT32_MAX = torch.iinfo(torch.int32).max
INT64_MAX = torch.iinfo(torch.int64).max
_I32_MAX = tl.constexpr(INT32_MAX)
_I64_MAX = tl.constexpr(INT64_MAX)
BLOCK = 1024
"""Cells, entries or blocks each program of the plan's kernels handles."""


@dataclass(frozen=True)
class Side:
    """Bucket entries of one side (queries or keys) for every batch·head."""

    ids: torch.Tensor  # (BH, L, T) int32: the token's distinct ids ascending, then the side's "none" value
    tok: torch.Tensor  # (BH, L·T) int32: token of each entry, entries sorted by (bucket, position)
    bkt: torch.Tensor  # (BH, L·T) int32: bucket of each entry ("none" value past the valid entries)
    rank: torch.Tensor  # (BH, L·T) int32: rank of that bucket among the token's ids
    bucket_key: torch.Tensor  # (BH, L·T) int64: sorted buckets, INT64_MAX past the valid entries
    count: torch.Tensor  # (BH, 1) int64: number of valid entries
    gather: torch.Tensor  # (BH, L, S) int64: flat per-entry output rows of each token's parts
    n_out: int  # per-entry output rows per batch·head: L·T bucket rows, L pattern rows, 1 neutral row


@triton.jit
def _keys_kernel(IDS, KEY, IDS_OUT, n_cells, length, T: tl.constexpr, none, BLOCK: tl.constexpr):
    """Per cell c = l·T + r of a row: key = id·L + l for a valid id (≥ 0 and not INT32_MAX, the mark of a
    repeat), else INT64_MAX; the id as the side stores it ("none" for an invalid one)."""
    bh = tl.program_id(1)
    cells = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = cells < n_cells
    row = bh.to(tl.int64) * n_cells
    ids = tl.load(IDS + row + cells, mask=inside, other=-1)
    valid = (ids >= 0) & (ids != _I32_MAX)
    key = tl.where(valid, ids.to(tl.int64) * length + cells // T, _I64_MAX)
    tl.store(KEY + row + cells, key, mask=inside)
    tl.store(IDS_OUT + row + cells, tl.where(valid, ids, none), mask=inside)


@triton.jit
def _entries_kernel(
    KEY, ORDER, TOK, BKT, RANK, BUCKET_KEY, GATHER, COUNT,
    n_entries, length, n_out, none,
    T: tl.constexpr, S: tl.constexpr, PATTERN: tl.constexpr, BLOCK: tl.constexpr,
):
    """Per sorted entry e of a row (key k, cell o = l·T + r): token l, rank r, bucket k // L ("none" and
    INT64_MAX past the valid ones), and the cell's output row e (the neutral last row for an invalid cell),
    offset by the row's n_out. The valid count is written by the program holding the last valid entry (or
    entry 0 when none is valid). With the pattern part, token l's row n_entries + l fills slot T."""
    bh = tl.program_id(1)
    entries = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = entries < n_entries
    row = bh.to(tl.int64) * n_entries
    key = tl.load(KEY + row + entries, mask=inside, other=_I64_MAX)
    cell = tl.load(ORDER + row + entries, mask=inside, other=0)
    ok = key != _I64_MAX
    bucket = tl.where(ok, key // length, _I64_MAX)
    token, rank = cell // T, cell % T
    tl.store(TOK + row + entries, token.to(tl.int32), mask=inside)
    tl.store(RANK + row + entries, rank.to(tl.int32), mask=inside)
    tl.store(BKT + row + entries, tl.where(ok, bucket, none).to(tl.int32), mask=inside)
    tl.store(BUCKET_KEY + row + entries, bucket, mask=inside)
    base = bh.to(tl.int64) * n_out
    out_row = tl.where(ok, entries.to(tl.int64), n_out - 1) + base
    gather_row = bh.to(tl.int64) * length * S
    tl.store(GATHER + gather_row + token * S + rank, out_row, mask=inside)
    # keys ascend with the invalid ones last: the valid count is where ok turns false
    after = tl.load(KEY + row + entries + 1, mask=entries + 1 < n_entries, other=_I64_MAX)
    last_valid = ok & (after == _I64_MAX)
    none_valid = (entries == 0) & ~ok
    at = tl.where(last_valid, entries + 1, 0).to(tl.int64)
    tl.store(COUNT + bh + 0 * entries, at, mask=inside & (last_valid | none_valid))
    if PATTERN:  # this program's entry numbers, read as tokens (L ≤ L·T: every token is one)
        tokens = entries.to(tl.int64)
        tl.store(GATHER + gather_row + tokens * S + T, n_entries + tokens + base, mask=tokens < length)


def build_side(buckets: torch.Tensor, none: int, pattern: bool) -> Side:
    """Sort the (token, bucket) entries of ``buckets`` (BH, L, T) of ids in [−1, 2³¹) (the entry point's
    check: an int64 tensor is cast without loss); ``none`` marks missing ids (−1 for queries, −2 for keys,
    so that no missing pair matches)."""
    bh, length, t = buckets.shape
    device = buckets.device
    ids = buckets.to(torch.int32).contiguous()
    if t > 1:  # each token's distinct ids ascending: a repeat would put the token twice in one bucket
        ids = torch.where(ids >= 0, ids, INT32_MAX).sort(-1).values
        repeat = torch.zeros_like(ids, dtype=torch.bool)
        repeat[..., 1:] = ids[..., 1:] == ids[..., :-1]
        ids = torch.where(repeat, INT32_MAX, ids).sort(-1).values
    n_entries = length * t
    key = torch.empty(bh, n_entries, device=device, dtype=torch.int64)
    side_ids = torch.empty(bh, length, t, device=device, dtype=torch.int32)
    grid = (triton.cdiv(n_entries, BLOCK), bh)
    _keys_kernel[grid](ids, key, side_ids, n_entries, length, t, none, BLOCK=BLOCK)
    key, order = key.sort(-1)  # (BH, L·T) each
    s = t + (1 if pattern else 0)
    n_out = n_entries + (length if pattern else 0) + 1
    fields = torch.empty(3, bh, n_entries, device=device, dtype=torch.int32)  # token, bucket, rank
    bucket_key = torch.empty(bh, n_entries, device=device, dtype=torch.int64)
    gather = torch.empty(bh, length, s, device=device, dtype=torch.int64)
    count = torch.empty(bh, 1, device=device, dtype=torch.int64)
    if n_entries == 0:  # no program runs to write it
        count.zero_()
    _entries_kernel[grid](
        key, order, fields[0], fields[1], fields[2], bucket_key, gather, count,
        n_entries, length, n_out, none, T=t, S=s, PATTERN=pattern, BLOCK=BLOCK,
    )  # fmt: skip
    return Side(side_ids, fields[0], fields[1], fields[2], bucket_key, count, gather, n_out)


@triton.jit
def _first_at_least(SORTED, TOK, n, target, span, RIGHT: tl.constexpr, WITH_TOK: tl.constexpr, steps):
    """Per lane the first index i < n with SORTED[i] ≥ target (> target when RIGHT), else n: the binary
    search of ``torch.searchsorted``. WITH_TOK compares the (bucket, position) key bucket·span + TOK[i]
    instead (INT64_MAX stays INT64_MAX)."""
    lo = tl.zeros_like(target)
    hi = lo + n
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        value = tl.load(SORTED + mid, mask=active, other=0)
        if WITH_TOK:
            tok = tl.load(TOK + mid, mask=active, other=0).to(tl.int64)
            value = tl.where(value != _I64_MAX, value * span + tok, _I64_MAX)
        right_of = value <= target if RIGHT else value < target
        lo = tl.where(active & right_of, mid + 1, lo)
        hi = tl.where(active & ~right_of, mid, hi)
    return lo


@triton.jit
def _ranges_kernel(
    ROW_KEY, ROW_TOK, ROW_COUNT, COL_KEY, COL_TOK, OUT,
    n_rows, n_cols, n_blocks, block, col_block, span, steps,
    CAUSAL: tl.constexpr, KEY_MAJOR: tl.constexpr, BLOCK: tl.constexpr,
):
    """Per block of ``block`` row entries: [lo, hi) of the column entries whose bucket lies in the block's
    buckets, cut at its own positions when CAUSAL (see :func:`bucket_ranges`); (0, 0) for a block of
    padding only."""
    bh = tl.program_id(1)
    blocks = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = blocks < n_blocks
    row_base = bh.to(tl.int64) * n_rows
    col_base = bh.to(tl.int64) * n_cols
    count = tl.load(ROW_COUNT + bh + 0 * blocks)
    start = blocks.to(tl.int64) * block
    last = tl.maximum(tl.minimum(start + block - 1, count - 1), 0)
    first_key = tl.load(ROW_KEY + row_base + start, mask=inside, other=0)
    last_key = tl.load(ROW_KEY + row_base + last, mask=inside, other=0)
    cols, toks = COL_KEY + col_base, COL_TOK + col_base
    lo = _first_at_least(cols, toks, n_cols, first_key, span, False, False, steps)
    hi = _first_at_least(cols, toks, n_cols, last_key, span, True, False, steps)
    if CAUSAL:  # (bucket, position) of the block's edge entry
        if KEY_MAJOR:
            tok = tl.load(ROW_TOK + row_base + start, mask=inside, other=0).to(tl.int64)
            edge = tl.where(first_key != _I64_MAX, first_key * span + tok, _I64_MAX)
            first = _first_at_least(cols, toks, n_cols, edge, span, False, True, steps)
            lo = lo + (first - lo) // col_block * col_block  # first ≥ lo: whole tiles
        else:
            tok = tl.load(ROW_TOK + row_base + last, mask=inside, other=0).to(tl.int64)
            edge = tl.where(last_key != _I64_MAX, last_key * span + tok, _I64_MAX)
            hi = _first_at_least(cols, toks, n_cols, edge, span, True, True, steps)
    empty = start >= count
    out = OUT + (bh.to(tl.int64) * n_blocks + blocks) * 2
    tl.store(out, tl.where(empty, 0, lo).to(tl.int32), mask=inside)
    tl.store(out + 1, tl.where(empty, 0, hi).to(tl.int32), mask=inside)


def bucket_ranges(
    rows: Side, cols: Side, block: int, col_block: int, *, causal: bool, key_major: bool
) -> torch.Tensor:
    """(BH, NB, 2) int32 [lo, hi) range of ``cols`` entries whose bucket lies within the buckets of each
    block of ``block`` sorted ``rows`` entries (both sides sorted by bucket, so the range is contiguous);
    ``col_block`` is the tile along ``cols``. Rows are query entries, or key entries when ``key_major``.

    When causal, the range is cut at the block's own positions in its edge bucket, comparing (bucket,
    position): a block of queries needs no key of its last bucket after its last query (j ≤ i), a block of
    keys no query of its first bucket before its first key. Its other buckets keep their whole range, and
    entries of different buckets never pair, so the cut drops only pairs the mask drops. A cut start moves
    by whole tiles, so the tiles that remain, and the order of every sum, are those of the uncut range."""
    bh, n_rows = rows.bucket_key.shape
    n_cols = cols.bucket_key.shape[1]
    n_blocks = triton.cdiv(n_rows, block)
    span = max(rows.ids.shape[1], cols.ids.shape[1])  # every position of either side is below it
    steps = max(1, n_cols).bit_length()  # halvings until a range of n_cols + 1 places is one
    out = torch.empty(bh, n_blocks, 2, device=rows.tok.device, dtype=torch.int32)
    grid = (triton.cdiv(n_blocks, BLOCK), bh)
    _ranges_kernel[grid](
        rows.bucket_key, rows.tok, rows.count, cols.bucket_key, cols.tok, out,
        n_rows, n_cols, n_blocks, block, col_block, span, steps,
        CAUSAL=causal, KEY_MAJOR=key_major, BLOCK=BLOCK,
    )  # fmt: skip
    return out


def pattern_ranges(
    n_self: int, n_other: int, block: int, *, radius: int, global_tokens: int, causal: bool, key_major: bool,
    device: torch.device,
) -> torch.Tensor:
    """(NB, 4) int32: two [lo, hi) ranges of the other side's positions that each block of ``block``
    positions meets through the window band or global tokens: global positions left of the band, then the
    band itself (all positions for a block holding global tokens). No blocks, (0, 4), without a window or
    global tokens."""
    if not has_pattern(radius, global_tokens):
        return torch.empty(0, 4, device=device, dtype=torch.int32)
    lo_blk = torch.arange(0, n_self, block, device=device)  # (NB,)
    hi_blk = (lo_blk + block).clamp_max(n_self)
    if key_major:  # a key block meets queries i ≥ j when causal
        first = lo_blk if causal else torch.zeros_like(lo_blk)
        cap = torch.full_like(lo_blk, n_other)
    else:  # a query block meets keys j ≤ i when causal
        first = torch.zeros_like(lo_blk)
        cap = hi_blk.clamp_max(n_other) if causal else torch.full_like(lo_blk, n_other)
    if radius >= 0:
        w_lo = torch.maximum(lo_blk - radius, first)
        w_hi = torch.minimum(hi_blk + radius, cap)
    else:
        w_lo, w_hi = cap, cap
    holds_global = lo_blk < global_tokens
    w_lo = torch.where(holds_global, first, w_lo)
    w_hi = torch.where(holds_global, cap, w_hi)
    g_hi = torch.minimum(torch.minimum(w_lo, cap), torch.full_like(w_lo, global_tokens))
    return torch.stack([first, g_hi, w_lo, w_hi], -1).int().contiguous()
