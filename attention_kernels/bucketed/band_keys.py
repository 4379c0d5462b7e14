"""A query's keys beyond its block row: the window band's keys that share no id with it.

With a window band of radius r (:mod:`attention_kernels.attended`), query i attends

    A_i = S_i ∪ W_i,   S_i = {j : ids(j) ∋ id(i)},   W_i = {j : |i − j| ≤ r}   (∩ {j ≤ i} when causal)

Where each query holds one id (its bucket, or its class of id sets from
:mod:`attention_kernels.bucketed.id_sets`), its block row of a whole-block plan holds S_i already. What the
band adds is a short list of its own,

    band keys of i = {j ∈ W_i : 0 ≤ j < m, id(i) ∉ ids(j)}      (at most 2r + 1; r + 1 when causal),

so A_i is the row's keys and these, each pair once, and the fused kernel
(:mod:`attention_kernels.bucketed.block_attention`) scores them beside the row: its α-entmax covers both, and
each query still needs no normaliser across rows. A query in no block row (no id, or no key holds its id)
attends its band keys alone (:func:`lone_queries`).

Each band key costs a dot product of its own (a gather, not a tile of the block products), so the fused
kernel takes bands up to :data:`MAX_RADIUS`; wider ones keep the spread rows and their band blocks.
"""

from __future__ import annotations

import torch

from attention_kernels.bucketed.planning import BlockPlan
from attention_kernels.native import call, library

MAX_RADIUS = 64
"""The widest band (radius) whose keys the fused kernel scores one by one beside a query's block row."""


def band_keys(q_ids: torch.Tensor, k_ids: torch.Tensor, *, radius: int, causal: bool) -> torch.Tensor:
    """(G·n, E) int64: slot e of query g·n + i holds the flat key index g·m + j of key j = i − radius + e
    when it is one of the query's band keys (see the module docstring), else −1; E = 2·radius + 1, or
    radius + 1 when causal. q_ids (G, n, 1) one id per query (−1 for none), k_ids (G, m, T) (−1 for
    none); ``radius`` ≥ 0. In C++ where it is built (attention_kernels/native/planning.cpp: one pass), else
    by tensor operations, slot by slot (each slot's keys a shifted slice of the keys)."""
    G, n, _ = q_ids.shape
    m, slots = k_ids.shape[1:]
    width = radius + 1 if causal else 2 * radius + 1
    kernel = library("planning") if q_ids.device.type == "cpu" else None
    if kernel is not None:
        band = torch.empty(G * n, width, dtype=torch.int64)
        ids = (q_ids[:, :, 0].long().contiguous(), k_ids.long().contiguous())
        call(kernel, "band_keys", *ids, G, n, m, slots, radius, width, band)
        return band
    band = torch.full((width, G, n), -1, dtype=torch.int64)
    own = q_ids[:, :, 0].masked_fill(q_ids[:, :, 0] < 0, -2)  # (G, n); a query with no id shares none
    flat = torch.arange(G)[:, None] * m + torch.arange(m)  # (G, m) flat key index
    for e in range(width):  # key j = i + offset: shifted slices, no gather
        offset = e - radius
        first, end = max(0, -offset), min(n, m - offset)  # the queries whose key lies in [0, m)
        if first >= end:
            continue
        keys = slice(first + offset, end + offset)
        in_row = k_ids[:, keys, 0] == own[:, first:end]  # (G, end − first)
        for t in range(1, slots):
            in_row |= k_ids[:, keys, t] == own[:, first:end]
        band[e, :, first:end] = flat[:, keys].masked_fill(in_row, -1)
    return band.view(width, G * n).T.contiguous()


def lone_queries(plan: BlockPlan) -> torch.Tensor:
    """(count,) int64: the queries that hold no row of ``plan``'s blocks (they attend their band keys
    alone)."""
    in_block = torch.zeros(plan.num_queries, dtype=torch.bool)
    for blocks in plan.classes:
        in_block[blocks.queries[blocks.real_queries()]] = True
    return (~in_block).nonzero().squeeze(1)
