"""Planning of single-bucket attention as a batch of small dense blocks (the fast PyTorch path).

When every token holds at most one bucket id (T = 1) and there is no window or global token, the attended
set of query i is A_i = {j : id(j) = id(i) ≥ 0} (∩ {j ≤ i} when causal). Sorting the tokens of each
(batch·head) group by (id, position) makes every bucket a contiguous run of queries and a contiguous run of
keys, so attention is a batch of dense blocks with no per-pair gather:

* each bucket's queries are cut into chunks of at most ``rows`` consecutive (sorted) queries;
* a chunk faces the bucket's keys; when causal only the prefix of keys with position ≤ the chunk's last
  query position (keys are sorted by position inside a bucket, so the rest of the diagonal is masked by
  position);
* chunks are grouped into classes by their (rows, keys) rounded up on a ladder of four steps per octave, so
  a class is one (blocks, L, M) tensor and padding costs at most 25 % per side.

Every query sits in exactly one block row (or none when its bucket has no key), so the normaliser needs no
reduction across blocks. Block entries: the attended pairs plus that rounding (plus the causal diagonal
blocks), so memory stays linear in the attended pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROWS = 128
"""Most queries in one block (non-causal)."""

CAUSAL_ROWS = 64
"""Most queries in one block when causal: smaller chunks cut the masked half of each bucket's diagonal."""

_NO_LIMIT = 2.0**40
"""Position limit of a query that may attend every key of its block (positions are exact in float32 below
2²⁴; padding keys sit at twice this)."""


@dataclass(frozen=True)
class BlockClass:
    """Blocks of one shape: ``blocks`` × L queries against ``blocks`` × M keys.

    Query index ``g·n + i``, key index ``g·m + j``; padding rows and columns hold index 0. Entry (r, c) of a
    block is attended iff ``key_pos[c] ≤ query_limit[r]``; padding keys have a position above every limit
    and padding queries the limit −1, so their entries are never attended and their probabilities are 0.
    """

    queries: torch.Tensor  # (blocks, L) int64 flat query index
    keys: torch.Tensor  # (blocks, M) int64 flat key index
    query_limit: torch.Tensor  # (blocks, L) float32 largest key position the row may attend
    key_pos: torch.Tensor  # (blocks, M) float32 key position (or 0 when not causal)
    masked: bool  # False when every entry is attended (no padding, not causal)


@dataclass(frozen=True)
class BlockPlan:
    """The attended pairs as dense blocks, one class per block shape."""

    classes: list[BlockClass]
    num_queries: int  # groups · n
    num_keys: int  # groups · m

    @property
    def num_entries(self) -> int:
        """Block entries the kernel computes (attended pairs plus padding)."""
        return sum(c.queries.numel() * c.keys.shape[1] for c in self.classes)

    @property
    def num_pairs(self) -> int:
        """Number of attended pairs."""
        return sum(int((c.key_pos[:, None, :] <= c.query_limit[:, :, None]).sum()) for c in self.classes)


def ladder(x: torch.Tensor) -> torch.Tensor:
    """Round x ≥ 1 up to a multiple of 2^max(⌊log₂ x⌋ − 2, 0): four sizes per octave, at most 25 % above x."""
    step = torch.exp2((torch.log2(x.clamp_min(1).double()).floor() - 2).clamp_min(0)).long()
    return -(-x // step) * step


def _sorted_tokens(ids: torch.Tensor, nid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens holding an id, sorted by (group, id, position); ids (G, L) int64 with −1 for none.

    Returns bucket keys ``g·nid + id``, flat token indices ``g·L + position`` and positions, each (tokens,).
    """
    G, L = ids.shape
    group = torch.arange(G, device=ids.device)[:, None]
    valid = ids >= 0
    keys = (group * nid + ids)[valid]  # (tokens,) in (group, position) order
    flat = (group * L + torch.arange(L, device=ids.device))[valid]
    keys, order = torch.sort(keys, stable=True)  # stable: positions stay ascending inside a bucket
    flat = flat[order]
    return keys, flat, flat % L


def _runs(start: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand runs: item r gets ids start[r], ..., start[r] + count[r] − 1. Returns (owner, id)."""
    owner = torch.repeat_interleave(torch.arange(count.numel(), device=count.device), count)
    first = torch.cumsum(count, 0) - count  # (runs,) offset of each run
    within = torch.arange(owner.numel(), device=count.device) - first[owner]
    return owner, start[owner] + within


def _padded(
    start: torch.Tensor, count: torch.Tensor, width: int, *values: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """(blocks, width) mask of c < count, then for each of ``values`` the rows values[start + c] (index 0
    where c ≥ count); start, count (blocks,)."""
    c = torch.arange(width, device=start.device)
    inside = c < count[:, None]
    at = (start[:, None] + c).masked_fill(~inside, 0)
    return inside, *(x[at] for x in values)


def plan_blocks(q_ids: torch.Tensor, k_ids: torch.Tensor, *, causal: bool) -> BlockPlan:
    """Dense blocks covering exactly the pairs that share a bucket; q_ids (G, n), k_ids (G, m) int64, −1 none.

    Causal needs n = m (positions are shared).
    """
    G, n = q_ids.shape
    m = k_ids.shape[1]
    nid = int(torch.cat([q_ids.flatten(), k_ids.flatten(), q_ids.new_zeros(1)]).max()) + 1
    q_key, q_flat, q_pos = _sorted_tokens(q_ids, nid)
    k_key, k_flat, k_pos = _sorted_tokens(k_ids, nid)
    bucket, q_count = torch.unique_consecutive(q_key, return_counts=True)  # (buckets,)
    q_start = torch.cumsum(q_count, 0) - q_count
    k_start = torch.searchsorted(k_key, bucket, side="left")
    k_count = torch.searchsorted(k_key, bucket, side="right") - k_start

    # Query chunks of at most `rows` sorted queries per bucket.
    rows = CAUSAL_ROWS if causal else ROWS
    chunks = -(-q_count // rows) * (k_count > 0)
    owner, index = _runs(torch.zeros_like(chunks), chunks)  # (blocks,) bucket and chunk number
    c_start = q_start[owner] + index * rows
    c_rows = torch.minimum(q_count[owner] - index * rows, torch.full_like(c_start, rows))
    b_start, b_keys = k_start[owner], k_count[owner]
    if causal:
        # Keys of the bucket at positions ≤ the chunk's last query: a prefix of the bucket's sorted keys.
        last = bucket[owner] * m + q_pos[c_start + c_rows - 1]
        b_keys = torch.searchsorted(k_key * m + k_pos, last, side="right") - b_start
        keep = b_keys > 0
        c_start, c_rows, b_start, b_keys = c_start[keep], c_rows[keep], b_start[keep], b_keys[keep]

    L, M = ladder(c_rows), ladder(b_keys)
    shapes, which = torch.unique(L * (m + 1) * 4 + M, return_inverse=True)
    classes = []
    for s, shape in enumerate(shapes.tolist()):
        sel = which == s
        width_q, width_k = divmod(shape, (m + 1) * 4)
        real_q, queries, q_at = _padded(c_start[sel], c_rows[sel], width_q, q_flat, q_pos)
        real_k, keys, k_at = _padded(b_start[sel], b_keys[sel], width_k, k_flat, k_pos)
        queries, keys = queries * real_q, keys * real_k
        limit = q_at.float() if causal else torch.full(q_at.shape, _NO_LIMIT, device=q_at.device)
        key_pos = k_at.float() if causal else torch.zeros(k_at.shape, device=k_at.device)
        limit, key_pos = limit.masked_fill(~real_q, -1), key_pos.masked_fill(~real_k, 2 * _NO_LIMIT)
        masked = causal or not bool(real_q.all() and real_k.all())
        classes.append(BlockClass(queries, keys, limit, key_pos, masked))
    return BlockPlan(classes, G * n, G * m)
