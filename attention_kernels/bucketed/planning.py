"""Planning of bucketed attention as a batch of small dense blocks (the PyTorch path's layout).

The attended set of query i (:mod:`attention_kernels.attended`) is the union of pairs that share a bucket id
and the pattern pairs (window band, global rows and columns), cut to j ≤ i when causal. Every attended pair is
placed in exactly one dense block, and every block is a contiguous run of queries facing a contiguous run of
keys of a sorted token sequence, so attention needs no per-pair gather:

* **Bucket blocks.** Key copies (one per id a key holds) are sorted by (group, id, position), so each bucket
  is a contiguous run of keys, positions ascending; query copies are sorted the same way. Each bucket's
  queries are cut into chunks of at most ``rows`` and a chunk faces its bucket's keys, when causal only the
  prefix of keys up to the chunk's last query position.
* **Pattern blocks**, in position order: the first g queries (global rows) face every key; the other queries,
  in chunks, face the window band's keys beyond the g global keys, and the global keys, which lead the band
  blocks' columns (or, with a band too narrow for it or none, have blocks of their own).

A pair met more than once is kept in one place: in the bucket block of the smallest id the two tokens share,
and in a pattern block only when they share none (pattern blocks are the fewer entries to check). Entries of
a block that are not attended (causal cut, the band's corners, pairs kept elsewhere, padding) are left out by
a rule on positions and ids (:class:`BlockMask`) that the kernels apply where they read the scores: the plan
holds no tensor of a block's size.
With one id per token and no pattern, each query sits in one block row, so a normaliser is a plain row
operation (``spread`` is False); otherwise a query's keys are spread over up to T + 2 rows.

Blocks are grouped into classes by their kind and their (rows, keys) rounded up on a ladder of four steps
per octave, so a class is one (blocks, L, M) tensor and padding costs at most 25 % per side; a pattern
block's keys only to a whole number of ``PATTERN_KEY_STEP``, since the band's blocks, nearly all of one
width, take few widths anyway. Every class costs a few dozen small operations whatever its size, so two
roundings keep the classes few: a bucket block's keys are a whole number of ``KEY_STEP`` (whole vectors for
the normalisers' row passes), and when causal the short chunk of a bucket of several chunks has the full
``rows`` when it faces at most 2 · ``rows`` keys: it comes first, where it faces the fewest keys, so its
padding rows cost at most 2 · rows² entries, beside the rows² / 2 pairs or more of the full chunk after it (a
bucket of one chunk keeps its rows on the ladder: padded to ``rows``, a bucket of a few queries would cost
dozens of times its pairs). Block entries: the attended pairs plus that rounding, the causal
diagonal blocks and the band's corners, so memory stays linear in the attended pairs.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from attention_kernels.attended import has_pattern
from attention_kernels.native import call, library

ROWS = 256
"""Most queries in one block (non-causal)."""

CAUSAL_ROWS = 64
"""Most queries in one block when causal: smaller chunks cut the masked half of each bucket's diagonal."""

BAND_ROWS = 16
"""Fewest queries in one block of the window band (more when the band is wider)."""

KEY_STEP = 32
"""Bucket blocks face a whole multiple of this many keys."""

PATTERN_KEY_STEP = 8
"""Pattern blocks (window band, global rows or columns) face a whole multiple of this many keys."""

_NO_LIMIT = 2.0**40
"""Position limit of a query that may attend every key of its block (positions are exact in float32 below
2²⁴; padding keys sit at twice this)."""

_RADIX_FROM = 2**15
"""torch's CPU sort of integers is a radix sort from this many elements on and a comparison sort below it,
about 15× slower per element (35 ns against 2.4 at 2^14 int16 keys)."""

_PAD_FROM = 4608
"""Below this many keys the comparison sort takes less than the radix sort of ``_RADIX_FROM`` (about 73 µs
for int16 keys: 40 µs at 4,400 keys, 69 at 4,600, 122 at 5,000)."""

_BUCKET, _BAND, _GLOBAL = 0, 1, 2
"""Kinds of block: a bucket's chunk, a window band's chunk, global rows or columns."""


@dataclass(frozen=True)
class BlockMask:
    """Which entries of a class's blocks (blocks, L, M) are attended pairs, with no (blocks, L, M) tensor:
    entry (r, c) of block b is one when

        low[b, r] ≤ key_pos[b, c] ≤ limit[b, r]   and   q_tags[s, b, r] ≠ k_tags[s′, b, c] for every s, s′.

    The limits cut the causal keys, the window band's corners and padding (padding keys sit above every
    limit; padding rows have the limit −1 and no lower one); the global keys that lead a band block's
    columns carry the position of its first query, which each of its rows admits. Tags leave a pair to
    another block: a bucket block's rows and columns carry the ids below the block's own that their tokens
    hold (a pair stays in the smallest bucket its tokens share), a pattern block's every id (a pair sharing
    one is in a bucket block). Tags are int32 ids; where none, a query's tag is −2 and a key's −1 or −3, so
    they never match. Kernels evaluate the rule where they read the scores, a chunk or a vector at a time."""

    key_pos: torch.Tensor  # (blocks, M) float32 key position (or 0 when positions cut nothing)
    limit: torch.Tensor  # (blocks, L) float32 largest key position the row may attend
    low: torch.Tensor | None = None  # (blocks, L) float32 smallest key position the row may attend
    q_tags: torch.Tensor | None = None  # (S, blocks, L) int32
    k_tags: torch.Tensor | None = None  # (S′, blocks, M) int32

    def excluded(self) -> torch.Tensor:
        """(blocks, L, M) float, 1 on the entries that are not attended, else 0. Positions are whole
        numbers, so a difference clamped to [0, 1] is the indicator of key_pos > limit (float arithmetic,
        cheaper than boolean masks on CPU); low ≤ limit on every row, so the two indicators never both
        hold."""
        off = torch.sub(self.key_pos[:, None, :], self.limit[:, :, None]).clamp_(0, 1)
        if self.low is not None:
            off.add_(torch.sub(self.low[:, :, None], self.key_pos[:, None, :]).clamp_(0, 1))
        if self.q_tags is not None:
            for q_tags in self.q_tags:
                for k_tags in self.k_tags:
                    off.masked_fill_(q_tags[:, :, None] == k_tags[:, None, :], 1.0)
        return off

    def chunk(self, a: int, b: int) -> BlockMask:
        """The mask of blocks a..b."""
        tags = (None, None) if self.q_tags is None else (self.q_tags[:, a:b], self.k_tags[:, a:b])
        low = None if self.low is None else self.low[a:b]
        return BlockMask(self.key_pos[a:b], self.limit[a:b], low, *tags)


@dataclass(frozen=True)
class BlockClass:
    """Blocks of one shape: ``blocks`` × L queries against ``blocks`` × M keys.

    Query index ``g·n + i``, key index ``g·m + j``; padding rows and columns hold index 0. The entries
    attended are those of ``mask`` (:class:`BlockMask`), every one when it is None (no padding, not causal,
    nothing left to another block); the others' probabilities are 0.
    """

    queries: torch.Tensor  # (blocks, L) int64 flat query index
    keys: torch.Tensor  # (blocks, M) int64 flat key index
    mask: BlockMask | None

    def chunk(self, a: int, b: int) -> BlockClass:
        """Blocks a..b, a class of their own."""
        mask = None if self.mask is None else self.mask.chunk(a, b)
        return BlockClass(self.queries[a:b], self.keys[a:b], mask)

    def padding_keys(self) -> torch.Tensor:
        """(blocks, M) bool, True on the columns that pad a block's keys to its class's M."""
        if self.mask is None:
            return torch.zeros(self.keys.shape, dtype=torch.bool, device=self.keys.device)
        return self.mask.key_pos > _NO_LIMIT

    def real_queries(self) -> torch.Tensor:
        """(blocks, L) bool, True on the rows that hold a query (not padding)."""
        if self.mask is None:
            return torch.ones(self.queries.shape, dtype=torch.bool, device=self.queries.device)
        return self.mask.limit >= 0


@dataclass(frozen=True)
class BlockPlan:
    """The attended pairs as dense blocks, one class per block shape."""

    classes: list[BlockClass]
    num_queries: int  # groups · n
    num_keys: int  # groups · m
    spread: bool  # True when a query may have rows in several blocks
    groups: int  # batch · heads; in a class, a group's blocks are consecutive, groups ascending
    # (num_queries, E) int64: keys a query attends beyond its block row, −1 for none (the window band's and
    # the global keys of a whole-block plan, attention_kernels/bucketed/band_keys.py), the first band_window
    # slots the window's; only the fused kernel reads them
    band_keys: torch.Tensor | None = None
    band_window: int = 0

    @property
    def num_entries(self) -> int:
        """Block entries the kernel computes (attended pairs plus padding)."""
        return sum(c.queries.numel() * c.keys.shape[1] for c in self.classes)

    @property
    def num_pairs(self) -> int:
        """Number of attended pairs."""
        return sum(int(attended(c).sum()) for c in self.classes)


def attended(blocks: BlockClass) -> torch.Tensor:
    """(blocks, L, M) bool: the entries of ``blocks`` that are attended pairs."""
    if blocks.mask is None:
        count, rows = blocks.queries.shape
        return torch.ones(count, rows, blocks.keys.shape[1], dtype=torch.bool, device=blocks.keys.device)
    return blocks.mask.excluded() == 0


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x[index] along x's first dimension, (*index.shape, *x.shape[1:]): ``index_select``, 2-4× faster on
    CPU than indexing with a tensor."""
    return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])


def round_up(x: torch.Tensor | int, step: torch.Tensor | int) -> torch.Tensor | int:
    """x rounded up to a whole multiple of ``step`` (integers or integer tensors)."""
    return -(-x // step) * step


def ladder(x: torch.Tensor) -> torch.Tensor:
    """Round x ≥ 1 up to a multiple of 2^max(⌊log₂ x⌋ − 2, 0): four sizes per octave, at most 25 % above x."""
    step = torch.exp2((torch.log2(x.clamp_min(1).double()).floor() - 2).clamp_min(0)).long()
    return round_up(x, step)


def _planning(tensor: torch.Tensor) -> ctypes.CDLL | None:
    """The C++ planning passes (attention_kernels/native/planning.cpp) for ``tensor``: CPU, if built."""
    return library("planning") if tensor.device.type == "cpu" else None


def distinct_ids(buckets: torch.Tensor) -> torch.Tensor:
    """Ids (G, tokens, T) as int64 with an id already held in an earlier slot of its token replaced by −1,
    in one slot (each token's id, or −1) when no token holds two. In C++ where it is built
    (attention_kernels/native/planning.cpp: one pass over the tokens, where the tensor path's slot-by-slot
    comparisons of strided slices are a dozen slow operations), else by tensor operations."""
    ids = buckets.long().contiguous()
    G, tokens, T = ids.shape
    if T == 1:
        return ids
    kernel = _planning(ids)
    if kernel is not None:
        out, single = torch.empty_like(ids), torch.empty(G, tokens, 1, dtype=torch.int64)
        several = torch.zeros(1, dtype=torch.int64)
        call(kernel, "distinct_ids", ids, G * tokens, T, out, single, several)
        return out if int(several) else single
    repeated = torch.zeros_like(ids, dtype=torch.bool)
    for t in range(1, T):  # slot by slot: reductions along a dimension of a few entries are slow on CPU
        for u in range(t):
            repeated[..., t] |= ids[..., t] == ids[..., u]
    ids = ids.masked_fill(repeated, -1)
    if not bool(((ids >= 0).sum(-1) > 1).any()):
        ids = ids.amax(-1, keepdim=True)
    return ids


def _sorted_tokens(ids: torch.Tensor, nid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copies of the tokens, one per id held, sorted by (group, id, position); ids (G, L, T) int64 with −1
    for none, every other id below ``nid``, and no id repeated within a token: a stable sort of the keys.

    Returns bucket keys ``g·nid + id``, flat token indices ``g·L + position`` and positions, each (copies,).
    """
    G, L, _ = ids.shape
    group = torch.arange(G, device=ids.device)[:, None, None]
    keys = (group * nid + ids).flatten()  # (copies,) in (group, position, slot) order
    flat = (group * L + torch.arange(L, device=ids.device)[:, None]).expand_as(ids).flatten()
    valid = ids.flatten() >= 0
    if not bool(valid.all()):
        keys, flat = keys[valid], flat[valid]
    # Stable, so positions stay ascending inside a bucket; on the narrowest integers that hold the keys,
    # since the sort's cost grows with their bytes (int16 sorts about 4x faster than int64 on CPU).
    narrow = next(t for t in (torch.int16, torch.int32, torch.int64) if G * nid <= torch.iinfo(t).max)
    order = _stable_order(keys.to(narrow))
    flat = take(flat, order)
    return take(keys, order), flat, flat % L


def _stable_order(keys: torch.Tensor) -> torch.Tensor:
    """The stable sorting order of integer keys (N,), each below its dtype's maximum. On CPU, between
    ``_PAD_FROM`` and ``_RADIX_FROM`` keys are padded to ``_RADIX_FROM`` with that maximum, which sorts after
    every key: torch's radix sort of the longer input is the faster one."""
    count = keys.numel()
    if keys.device.type == "cpu" and _PAD_FROM <= count < _RADIX_FROM:
        pad = keys.new_full((_RADIX_FROM - count,), torch.iinfo(keys.dtype).max)
        return torch.sort(torch.cat([keys, pad]), stable=True).indices[:count]
    return torch.sort(keys, stable=True).indices


def _runs(start: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand runs: item r gets ids start[r], ..., start[r] + count[r] − 1. Returns (owner, id)."""
    owner = torch.repeat_interleave(torch.arange(count.numel(), device=count.device), count)
    first = torch.cumsum(count, 0) - count  # (runs,) offset of each run
    within = torch.arange(owner.numel(), device=count.device) - first[owner]
    return owner, start[owner] + within


def _padded_runs(
    start: torch.Tensor,
    count: torch.Tensor,
    width: int,
    flat: torch.Tensor,
    pos: torch.Tensor,
    rule: tuple[int, int, float],
    *,
    with_index: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Blocks of runs (start, count (blocks,)) of the sequence (flat, pos) padded to ``width``: (blocks,
    width) int64 flat indices (0 on padding; None unless ``with_index``) and float32 positions
    pos · scale + shift for ``rule`` = (scale, shift, fill), ``fill`` on padding. In C++ where it is built
    (attention_kernels/native/planning.cpp: one pass, where these tensor operations are a dozen)."""
    scale, shift, fill = rule
    kernel = _planning(start)
    if kernel is not None:
        index = start.new_empty(len(start), width) if with_index else None
        positions = torch.empty(len(start), width, dtype=torch.float32)
        call(
            kernel,
            "padded_runs",
            start,
            count,
            len(start),
            width,
            flat,
            pos,
            scale,
            shift,
            fill,
            index,
            positions,
        )
        return index, positions
    c = torch.arange(width, device=start.device)
    inside = c < count[:, None]
    at = (start[:, None] + c).masked_fill(~inside, 0)
    positions = (take(pos, at) * scale + shift).float().masked_fill_(~inside, fill)
    return (take(flat, at) * inside if with_index else None), positions


def _block_tags(
    ids: torch.Tensor, index: torch.Tensor, bucket: torch.Tensor | None, none: int
) -> torch.Tensor:
    """The ids of each entry's token index (blocks, width) of ``ids`` (tokens, T) int32: all of them, (T,
    blocks, width), when ``bucket`` is None; else (T − 1, blocks, width) the T − 1 largest of those below
    the block's bucket (blocks,), largest first, ``none`` for the others
    (attention_kernels/native/planning.cpp where it is built).

    The second form is for bucket blocks when both sides hold several ids (with one, a pair shares at most
    one bucket): the pair stays in the smallest bucket its tokens share, so an entry is dropped when they
    share an id below the block's, and a token holds at most T − 1 of those (not the block's own).
    """
    slots = ids.shape[1]
    kernel = _planning(ids)
    if kernel is not None:
        tags = torch.empty(slots - (bucket is not None), *index.shape, dtype=torch.int32)
        width = index.shape[1]
        call(kernel, "block_tags", ids, slots, index, index.numel(), width, bucket, none, tags)
        return tags
    held = take(ids, index)  # (blocks, width, T)
    if bucket is None:
        return held.permute(2, 0, 1).contiguous()
    return _largest_but_one(held.masked_fill(held >= bucket[:, None, None], none))


@dataclass
class _Blocks:
    """Blocks under construction: runs of a query sequence facing runs of a key sequence.

    Sequences are concatenated as parts are added; a block's ``q_start`` and ``k_start`` index them.
    """

    q_flat: list[torch.Tensor]
    q_pos: list[torch.Tensor]
    k_flat: list[torch.Tensor]
    k_pos: list[torch.Tensor]
    runs: list[tuple[torch.Tensor, ...]]  # (q_start, q_rows, k_start, k_count, kind, bucket id) per part

    def queries(self, flat: torch.Tensor, pos: torch.Tensor) -> int:
        """Append a query sequence; returns its offset."""
        offset = sum(x.numel() for x in self.q_flat)
        self.q_flat.append(flat)
        self.q_pos.append(pos)
        return offset

    def keys(self, flat: torch.Tensor, pos: torch.Tensor) -> int:
        """Append a key sequence; returns its offset."""
        offset = sum(x.numel() for x in self.k_flat)
        self.k_flat.append(flat)
        self.k_pos.append(pos)
        return offset

    def extend(self, other: _Blocks) -> None:
        """Append the sequences and blocks of ``other``, its blocks' starts moved past ours."""
        q_offset, k_offset = (sum(x.numel() for x in seqs) for seqs in (self.q_flat, self.k_flat))
        self.q_flat += other.q_flat
        self.q_pos += other.q_pos
        self.k_flat += other.k_flat
        self.k_pos += other.k_pos
        self.runs += [(q + q_offset, rows, k + k_offset, *rest) for q, rows, k, *rest in other.runs]


def _joined(sequences: list[torch.Tensor]) -> torch.Tensor:
    """The sequences one after another: the one itself when alone (``torch.cat`` would copy it)."""
    return sequences[0] if len(sequences) == 1 else torch.cat(sequences)


def _chunks(
    start: torch.Tensor, count: torch.Tensor, rows: int, *, short_first: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut runs of queries (start, count) into chunks of at most ``rows``, the short one last (or first):
    (run, chunk start, chunk rows)."""
    chunks = -(-count // rows)
    owner, index = _runs(torch.zeros_like(count), chunks)
    if short_first:  # chunk i ends (chunks − 1 − i) full chunks before the run's end
        end = count[owner] - (chunks[owner] - 1 - index) * rows
        begin = (end - rows).clamp_min(0)
        return owner, start[owner] + begin, end - begin
    c_start = start[owner] + index * rows
    c_rows = torch.minimum(count[owner] - index * rows, torch.full_like(c_start, rows))
    return owner, c_start, c_rows


def _bucket_runs(
    q_ids: torch.Tensor, k_ids: torch.Tensor, causal: bool, rows: int
) -> tuple[torch.Tensor, ...]:
    """The token copies sorted by (group, id, position) and each bucket's queries in chunks against its keys.

    Returns the query copies' flat indices and positions, the key copies' (each (copies,) int64), and per
    chunk (chunks,) int64: its first query copy, rows, first key copy, keys (when causal those up to its
    last query's position, the bucket's short chunk first) and bucket id; chunks in (group, id, position)
    order, none for a bucket without keys. In C++ where it is built (attention_kernels/native/planning.cpp: a
    counting sort and one pass over the buckets), else by tensor operations.
    """
    (G, n, T), (m, Tk) = q_ids.shape, k_ids.shape[1:]
    nid = max([0] + [int(ids.max()) for ids in (q_ids, k_ids) if ids.numel()]) + 1
    kernel = _planning(q_ids)
    if kernel is not None:
        q_sorted = torch.empty(2, G * n * T, dtype=torch.int64)  # flat indices, positions
        k_sorted = torch.empty(2, G * m * Tk, dtype=torch.int64)
        capacity = G * n * T // rows + min(G * nid, G * n * T) + 1  # full chunks, and a short one per bucket
        chunks, counts = torch.empty(5, capacity, dtype=torch.int64), torch.empty(3, dtype=torch.int64)
        ids = (q_ids.long().contiguous(), n, T, k_ids.long().contiguous(), m, Tk, G, nid)
        call(kernel, "bucket_chunks", *ids, int(causal), rows, *q_sorted, *k_sorted, chunks, capacity, counts)
        q_copies, k_copies, count = counts.tolist()
        return (*q_sorted[:, :q_copies], *k_sorted[:, :k_copies], *chunks[:, :count])
    k_key, k_flat, k_pos = _sorted_tokens(k_ids, nid)
    q_key, q_flat, q_pos = _sorted_tokens(q_ids, nid)
    bucket, q_count = torch.unique_consecutive(q_key, return_counts=True)  # (buckets,)
    k_start = torch.searchsorted(k_key, bucket, side="left")
    k_count = torch.searchsorted(k_key, bucket, side="right") - k_start
    q_start, q_count = torch.cumsum(q_count, 0) - q_count, q_count * (k_count > 0)
    owner, c_start, c_rows = _chunks(q_start, q_count, rows, short_first=causal)
    b_start, b_keys = k_start[owner], k_count[owner]
    if causal:
        # Keys of the bucket at positions ≤ the chunk's last query: a prefix of the bucket's sorted keys.
        last = bucket[owner] * m + q_pos[c_start + c_rows - 1]
        b_keys = torch.searchsorted(k_key * m + k_pos, last, side="right") - b_start
    return q_flat, q_pos, k_flat, k_pos, c_start, c_rows, b_start, b_keys, bucket[owner] % nid


def _bucket_blocks(out: _Blocks, q_ids: torch.Tensor, k_ids: torch.Tensor, causal: bool, rows: int) -> None:
    """Each bucket's query copies, in chunks, against every key copy of the same bucket."""
    q_flat, q_pos, k_flat, k_pos, c_start, c_rows, b_start, b_keys, bucket = _bucket_runs(
        q_ids, k_ids, causal, rows
    )
    q_offset, k_offset = out.queries(q_flat, q_pos), out.keys(k_flat, k_pos)
    kind = torch.full_like(c_start, _BUCKET)
    out.runs.append((c_start + q_offset, c_rows, b_start + k_offset, b_keys, kind, bucket))


@functools.lru_cache(maxsize=16)
def _pattern_blocks(
    G: int, n: int, m: int, causal: bool, radius: int, global_tokens: int, rows: int, device: torch.device
) -> _Blocks:
    """Global rows against every key; the other queries against the band and the global keys before it.
    They depend on the shapes alone, not on the ids, so a model's layers of one length share them (kept for
    the last 16 shapes; never written to).

    Where a band block has at most radius + 1 rows, the global keys lead its columns, at the position of the
    block's first query, which every row of the block admits (the band's limits are the rows' positions ±
    radius): one block for both, where a block of the global keys alone, a few columns wide, costs a class
    and a product of its own."""
    out = _Blocks([], [], [], [], [])
    group = torch.arange(G, device=device)
    i, j = torch.arange(n, device=device), torch.arange(m, device=device)
    q_offset = out.queries((group[:, None] * n + i).flatten(), i.repeat(G))
    k_offset = out.keys((group[:, None] * m + j).flatten(), j.repeat(G))
    g = min(global_tokens, n)
    # A band chunk of R rows faces R + 2·radius keys for 2·radius + 1 attended per row: R ≈ radius keeps its
    # entries within 1.5× its pairs.
    band_rows = min(rows, max(BAND_ROWS, radius))
    lead = min(global_tokens, m) if radius >= 0 and band_rows <= radius + 1 else 0  # global keys of the band
    spans = []  # (first query, queries, first key, keys, kind) of one group
    if g > 0:
        spans.append((0, g, 0, m, _GLOBAL))
    if global_tokens > 0 and n > g and not lead:
        spans.append((g, n - g, 0, min(global_tokens, m), _GLOBAL))
    if radius >= 0 and n > g:
        spans.append((g, n - g, None, None, _BAND))
    for first, count, k_first, k_count, kind in spans:
        size = band_rows if kind == _BAND else rows
        _, c_start, c_rows = _chunks(i.new_tensor([first]), i.new_tensor([count]), size)
        last = c_start + c_rows - 1  # (chunks,) last query position
        if kind == _BAND:
            lo = (c_start - radius).clamp_min(global_tokens)
            hi = (last + radius + 1).clamp_max(m)
        else:
            lo, hi = torch.full_like(c_start, k_first), torch.full_like(c_start, k_first + k_count)
        if causal:
            hi = torch.minimum(hi, last + 1)
        width = (hi - lo).clamp_min(0) + (lead if kind == _BAND else 0)  # (chunks,) keys of each block
        keep = width > 0
        c_start, c_rows, lo, width = c_start[keep], c_rows[keep], lo[keep], width[keep]
        chunks = c_start.numel()
        at = group.repeat_interleave(chunks)  # (G·chunks,) group of each block
        if kind == _BAND and lead:  # each block's columns: the global keys, then its band's
            owner, column = _runs(torch.zeros_like(width), width)
            band = column >= lead
            key = torch.where(band, take(lo, owner) + column - lead, column)  # (Σ width,) key positions
            pos = torch.where(band, key, take(c_start, owner))
            offset = out.keys((group[:, None] * m + key).flatten(), pos.repeat(G))
            k_start = offset + at * key.numel() + (torch.cumsum(width, 0) - width).repeat(G)
        else:
            k_start = k_offset + at * m + lo.repeat(G)
        out.runs.append(
            (
                q_offset + at * n + c_start.repeat(G),
                c_rows.repeat(G),
                k_start,
                width.repeat(G),
                torch.full_like(at, kind),
                torch.full_like(at, -1),
            )
        )
    return out


def _block_classes(
    runs: torch.Tensor, q_flat: torch.Tensor, n: int, G: int, causal: bool, rows: int, key_step: int
) -> tuple[tuple[torch.Tensor, ...], list[tuple[int, int, int, int]]]:
    """The blocks ``runs`` (6, blocks) (the fields of :attr:`_Blocks.runs`) that hold queries and keys,
    each rounded to its class's shape (see the module docstring) and ordered by class, then by group
    (stable: in their order within one), so that a class is a slice of them and a run of groups a slice of
    each class.

    Returns their first query copy, rows, first key copy, keys and bucket id, each (blocks,), and each
    class's (kind, L, M, number of blocks) in order. In C++ where it is built
    (attention_kernels/native/planning.cpp, one pass and a sort of the blocks), else by tensor operations.
    """
    kernel = _planning(runs)
    if kernel is not None:
        blocks = runs.shape[1]
        ordered = torch.empty(5, blocks, dtype=torch.int64)  # the fields returned, in class order
        classes = torch.empty(4, blocks, dtype=torch.int64)  # (kind, L, M, blocks) of each class
        counts = torch.empty(2, dtype=torch.int64)
        shape = (runs.contiguous(), blocks, q_flat, n, G, int(causal), rows, key_step, PATTERN_KEY_STEP)
        call(kernel, "block_classes", *shape, ordered, classes, counts)
        kept, found = counts.tolist()
        return tuple(ordered[:, :kept]), [tuple(shape) for shape in classes[:, :found].T.tolist()]
    # the next block is the next chunk of the same bucket: its queries run on, in the same group
    start, group = runs[0], take(q_flat, runs[0]) // n
    chunk_follows = torch.zeros_like(runs[0], dtype=torch.bool)
    chunk_follows[:-1] = (
        (runs[4, 1:] == _BUCKET)
        & (runs[5, 1:] == runs[5, :-1])
        & (start[1:] == start[:-1] + runs[1, :-1])
        & (group[1:] == group[:-1])
    )
    keep = (runs[1] > 0) & (runs[3] > 0)  # blocks with queries and keys
    runs, group, chunk_follows = runs[:, keep], group[keep], chunk_follows[keep]
    _, c_rows, _, b_keys, kind, _ = runs
    bucket_block = kind == _BUCKET
    L = ladder(c_rows)
    M = torch.where(bucket_block, round_up(ladder(b_keys), key_step), round_up(b_keys, PATTERN_KEY_STEP))
    if causal:  # a bucket's short chunk is its first, facing few keys (see the module docstring)
        L = torch.where(bucket_block & (2 * rows >= M) & chunk_follows, rows, L)
    height, width = (int(x.max()) + 1 if x.numel() else 1 for x in (L, M))  # above every rounded size
    shape, order = torch.sort(((kind * height + L) * width + M) * G + group, stable=True)
    shapes, counts = torch.unique_consecutive(shape // G, return_counts=True)
    classes = []
    for shape, count in zip(shapes.tolist(), counts.tolist(), strict=True):
        rest, width_k = divmod(shape, width)
        classes.append((*divmod(rest, height), width_k, count))
    return tuple(runs[[0, 1, 2, 3, 5]][:, order]), classes


def plan_blocks(
    q_ids: torch.Tensor,
    k_ids: torch.Tensor,
    *,
    causal: bool,
    radius: int = -1,
    global_tokens: int = 0,
    rows: int | None = None,
    key_step: int = KEY_STEP,
) -> BlockPlan:
    """Dense blocks covering each attended pair exactly once; q_ids (G, n, T), k_ids (G, m, T′) int64 with
    −1 for none and no id repeated within a token; ``radius`` of the window band (−1 for none), the first
    ``global_tokens`` positions global; at most ``rows`` queries per bucket block (``ROWS``, or
    ``CAUSAL_ROWS`` when causal), facing a whole multiple of ``key_step`` keys. Causal needs n = m
    (positions are shared)."""
    G, n, T = q_ids.shape
    m, Tk = k_ids.shape[1:]
    pattern = has_pattern(radius, global_tokens)
    if rows is None:
        rows = CAUSAL_ROWS if causal else ROWS
    if k_ids.shape[0] != G or (causal and m != n) or rows < 1 or key_step < 1:
        raise ValueError(
            f"plan_blocks needs as many key groups as query groups ({k_ids.shape[0]} and {G}), n = m when "
            f"causal ({n} and {m}), rows ≥ 1 ({rows}) and key_step ≥ 1 ({key_step})"
        )
    parts = _Blocks([], [], [], [], [])
    _bucket_blocks(parts, q_ids, k_ids, causal, rows)
    if pattern:
        parts.extend(_pattern_blocks(G, n, m, causal, radius, global_tokens, rows, q_ids.device))
    q_flat, q_pos, k_flat, k_pos = map(_joined, (parts.q_flat, parts.q_pos, parts.k_flat, parts.k_pos))
    runs = torch.cat([torch.stack(part) for part in parts.runs], 1)  # (6, blocks), the fields of _Blocks.runs
    (c_start, c_rows, b_start, b_keys, bucket), shapes = _block_classes(
        runs, q_flat, n, G, causal, rows, key_step
    )
    # Every id of a flat query or key, for the classes whose mask compares tags: pattern blocks, and bucket
    # blocks when both sides hold several ids. An empty slot is −2 for a query and stays −1 for a key, so
    # two empty slots never match.
    dedupe = T > 1 and Tk > 1
    if pattern or dedupe:
        q_all = q_ids.reshape(G * n, T)
        q_all = q_all.masked_fill(q_all < 0, -2).int()
        k_all = k_ids.reshape(G * m, Tk).int()
    classes, end = [], 0
    for block_kind, width_q, width_k, count in shapes:
        sel, end = slice(end, end + count), end + count
        band = block_kind == _BAND
        q_rule = (1, 0, -1.0) if causal else (1, radius, -1.0) if band else (0, int(_NO_LIMIT), -1.0)
        k_rule = (1 if causal or band else 0, 0, 2 * _NO_LIMIT)
        q_runs, k_runs = (c_start[sel], c_rows[sel], width_q), (b_start[sel], b_keys[sel], width_k)
        queries, limit = _padded_runs(*q_runs, q_flat, q_pos, q_rule)
        keys, key_pos = _padded_runs(*k_runs, k_flat, k_pos, k_rule)
        low = _padded_runs(*q_runs, q_flat, q_pos, (1, -radius, -1.0), with_index=False)[1] if band else None
        tags = (None, None)
        if block_kind != _BUCKET or dedupe:
            below = None if block_kind != _BUCKET else bucket[sel]
            tags = _block_tags(q_all, queries, below, -2), _block_tags(k_all, keys, below, -3)
        whole = (
            not causal
            and tags[0] is None
            and bool((c_rows[sel] == width_q).all() and (b_keys[sel] == width_k).all())
        )
        mask = None if whole else BlockMask(key_pos, limit, low, *tags)
        classes.append(BlockClass(queries, keys, mask))
    spread = pattern or (T > 1 and bool((q_ids >= 0).sum(-1).gt(1).any()))  # (one slot: one id at most)
    return BlockPlan(classes, G * n, G * m, spread, G)


def _largest_but_one(ids: torch.Tensor) -> torch.Tensor:
    """(T − 1, …): the T − 1 largest of each token's ids (…, T), the slot dimension first; with T = 2 the
    maximum (a sort along two entries costs far more)."""
    if ids.shape[-1] == 2:
        return ids.amax(-1)[None]
    return ids.sort(-1, descending=True).values[..., :-1].permute(2, 0, 1).contiguous()
