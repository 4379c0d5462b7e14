"""Queries classed by their set of bucket ids, so that each query's keys lie in one block row.

With T ≥ 2 ids per query, query i attends the keys that share any of its ids (a window band aside:
:mod:`attention_kernels.bucketed.band_keys`), A_i = {j : ids(j) ∩ S_i ≠ ∅} with S_i = ids(i). That set
depends on S_i alone, so the queries of one id set attend the same keys. Give each distinct id set a class c,
and give each key the classes it meets:

    class of query i = c(S_i),    classes of key j = {c : S_c ∩ ids(j) ≠ ∅}   (each at most once)

Then bucketed attention over these one-id queries and many-id keys attends exactly the same pairs, each
once (a key meets a class once however many ids they share), and each query sits in one block row: the
fused kernel (:mod:`attention_kernels.bucketed.block_attention`) takes it, where a query with two ids would
otherwise have its keys spread over two block rows and the pairs of both ids counted once by tags.

The price is that a key's rows are packed once per class it meets, that the classes cost a pass over a flag
per (key, class), and that a small class fills few of the kernel's query tiles: the classes pay off only
when they hold enough queries each (:data:`MIN_QUERIES_PER_CLASS`). On one core at d = 64, top-2 of
balanced buckets, 8 heads, the whole call without gradients (``python -m benchmarks.fused_kernel --buckets 4
--top 2``): 4 buckets (10 id sets, 100–400 queries a class at 1k–4k tokens) 1.39–1.89× the spread rows, the
classes themselves 5–10 ms; 8 buckets at 4k tokens (36 sets, about 115 a class) 1.32–1.41×. With 16
buckets (136 sets) at 2k tokens, about 15 queries a class, the kernel and its plan alone were no faster
than the spread rows. :func:`id_set_buckets` returns None below the bound.
"""

from __future__ import annotations

import torch

MIN_QUERIES_PER_CLASS = 64
"""The fewest queries per (group, class), on average, at which the classes replace the spread rows."""
MAX_FLAGS = 2**26
"""The most (key, class) flags a call may hold, a byte each; a call that needs more keeps the spread rows."""


def id_set_buckets(q_ids: torch.Tensor, k_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(query classes (G, n, 1), key classes (G, m, W)) int64 for distinct ids (G, n, T) and (G, m, T′)
    (each token's ids distinct, −1 for none; :func:`~attention_kernels.bucketed.planning.distinct_ids`),
    −1 for a query with no id and in a key's unused slots; a key's classes ascend. None where the queries
    with an id number fewer than :data:`MIN_QUERIES_PER_CLASS` per (group, class) on average, or the
    flags of keys against classes would pass :data:`MAX_FLAGS`.

    Classes are numbered across groups: a learned predictor gives every head the ids 0 … B − 1, so the
    heads' sets coincide. Id spaces that differ from group to group multiply the classes every key is
    flagged against, and the flag bound then refuses sooner."""
    G, n, T = q_ids.shape
    m, T_k = k_ids.shape[1], k_ids.shape[2]
    ids = q_ids.sort(-1).values.reshape(G * n, T)  # one spelling per set, −1 first
    inverse, first = _row_classes(ids)
    sets = ids[first]  # (C, T): each class's ids
    count = len(sets)
    has_id = (ids >= 0).any(-1)  # (G·n,)
    q_class = inverse.masked_fill(~has_id, -1).view(G, n)
    present = torch.zeros(G, count + 1, dtype=torch.bool)  # the last column: queries with no id
    present.scatter_(1, torch.where(q_class >= 0, q_class, count), True)
    present = present[:, :count]
    if int(has_id.sum()) < MIN_QUERIES_PER_CLASS * int(present.sum()) or G * m * count > MAX_FLAGS:
        return None
    # member[v, c]: whether class c holds id value v (the sets' values, ascending), then a row for every
    # other id (none, or one no query holds)
    held = sets >= 0
    values = sets[held].unique()  # (V,)
    member = torch.zeros(len(values) + 1, count, dtype=torch.bool)
    member[torch.searchsorted(values, sets[held]), held.nonzero()[:, 0]] = True
    bounded = torch.cat([values, values.new_full((1,), -2)])  # (V + 1,): −2 matches no id
    at = torch.searchsorted(values, k_ids)  # (G, m, T′), in [0, V]
    at = at.masked_fill(bounded[at] != k_ids, len(values))
    # each key meets the classes of its ids that its own group's queries hold, each once
    by_class = member.T.contiguous()  # (C, V + 1)
    meets = by_class[:, at[..., 0]]  # (C, G, m)
    for t in range(1, T_k):  # one slot at a time: (C, G, m, T′) would cost T′ bytes a flag
        meets |= by_class[:, at[..., t]]
    meets &= present.T[:, :, None]
    meets = meets.view(count, G * m)
    width = max(int(meets.sum(0).max()), 1) if G * m else 1
    k_class = torch.full((G * m, width), -1, dtype=torch.int64)
    filled = torch.zeros(G * m, dtype=torch.int64)  # each key's classes so far
    for c in range(count):  # in class order, so each key's classes ascend
        keys = meets[c].nonzero().squeeze(1)
        k_class[keys, filled[keys]] = c
        filled[keys] += 1
    return q_class.view(G, n, 1), k_class.view(G, m, width)


def _row_classes(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(class of each row (N,), a row of each class (C,)) for integer rows (N, T): equal rows, equal class.
    Column by column, each step a one-dimensional ``torch.unique`` (rows at once, ``dim=0``, sort about a
    hundred times slower on CPU): the classes so far (< N), times the distinct values (≤ N·T), plus the next
    value's rank, stays below N²·T (no overflow)."""
    values, rank = torch.unique(rows, return_inverse=True)  # rank (N, T) in [0, V)
    classes = rank[:, 0]
    for t in range(1, rows.shape[1]):
        _, classes = torch.unique(classes * len(values) + rank[:, t], return_inverse=True)
    first = torch.full((int(classes.max()) + 1 if len(classes) else 0,), len(rows), dtype=torch.int64)
    first.scatter_reduce_(0, classes, torch.arange(len(rows)), reduce="amin")
    return classes, first
