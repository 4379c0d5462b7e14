"""Queries classed by their set of bucket ids, so that each query's keys lie in one block row.

With T ≥ 2 ids per query and no window or global tokens, query i attends the keys that share any of its ids,
A_i = {j : ids(j) ∩ S_i ≠ ∅} with S_i = ids(i). That set depends on S_i alone, so the queries of one id set
attend the same keys. Give each distinct id set a class c, and give each key the classes it meets:

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
"""The most (key, class) flags a call may hold (64 MB); a call that needs more keeps the spread rows."""


def id_set_buckets(q_ids: torch.Tensor, k_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(query classes (G, n, 1), key classes (G, m, W)) int64 for distinct ids (G, n, T) and (G, m, T′)
    (each token's ids distinct, −1 for none; :func:`~attention_kernels.bucketed.planning.distinct_ids`),
    −1 for a query with no id and in a key's unused slots; a key's classes ascend. None where the queries
    with an id number fewer than :data:`MIN_QUERIES_PER_CLASS` per (group, class) on average, or the
    flags of keys against classes would pass :data:`MAX_FLAGS`."""
    G, n, _ = q_ids.shape
    m = k_ids.shape[1]
    ids = q_ids.sort(-1).values.reshape(G * n, -1)  # (G·n, T): one spelling per set, −1 first
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
    # member[v, c]: the classes holding id value v (the values of the sets, ascending); a last row of none
    values = sets[sets >= 0].unique()  # (V,)
    member = torch.zeros(len(values) + 1, count, dtype=torch.bool)
    held = sets >= 0
    member[torch.searchsorted(values, sets[held]), held.nonzero()[:, 0]] = True
    # each key meets the classes of its ids that its own group's queries hold, each once
    at = torch.searchsorted(values, k_ids).clamp_max(len(values))  # (G, m, T′)
    at = (
        at.masked_fill(values.take(at.clamp_max(len(values) - 1)) != k_ids, len(values))
        if len(values)
        else at
    )
    meets = member[at].any(2) & present[:, None, :]  # (G, m, C)
    key, met_class = meets.view(G * m, count).nonzero(as_tuple=True)  # by key, then class
    per_key = meets.sum(-1).view(-1)  # (G·m,)
    width = max(int(per_key.max()), 1) if len(per_key) else 1
    slot = torch.arange(len(key)) - (per_key.cumsum(0) - per_key)[key]
    k_class = torch.full((G * m, width), -1, dtype=torch.int64)
    k_class[key, slot] = met_class
    return q_class.view(G, n, 1), k_class.view(G, m, width)


def _row_classes(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(class of each row (N,), a row of each class (C,)) for integer rows (N, T): equal rows, equal class.
    Column by column, each step a one-dimensional ``torch.unique`` (rows at once, ``dim=0``, sort about a
    hundred times slower on CPU): the classes so far, times the distinct values, plus the next value's rank,
    stays below N² (no overflow)."""
    values, rank = torch.unique(rows, return_inverse=True)  # rank (N, T) in [0, V)
    classes = rank[:, 0]
    for t in range(1, rows.shape[1]):
        _, classes = torch.unique(classes * len(values) + rank[:, t], return_inverse=True)
    first = torch.full((int(classes.max()) + 1 if len(classes) else 0,), len(rows), dtype=torch.int64)
    first.scatter_reduce_(0, classes, torch.arange(len(rows)), reduce="amin")
    return classes, first
