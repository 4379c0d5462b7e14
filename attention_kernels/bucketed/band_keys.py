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

MAX_RADIUS = 64
"""The widest band (radius) whose keys the fused kernel scores one by one beside a query's block row."""


def band_keys(q_ids: torch.Tensor, k_ids: torch.Tensor, *, radius: int, causal: bool) -> torch.Tensor:
    """(G·n, E) int64 flat key index g·m + j of each query's band keys (see the module docstring), −1 for
    none; E = 2·radius + 1, or radius + 1 when causal. q_ids (G, n, 1) one id per query (−1 for none),
    k_ids (G, m, T) (−1 for none); ``radius`` ≥ 0."""
    G, n, _ = q_ids.shape
    m = k_ids.shape[1]
    offsets = torch.arange(-radius, (0 if causal else radius) + 1)  # (E,)
    j = torch.arange(n)[:, None] + offsets  # (n, E) key positions
    inside = (j >= 0) & (j < m)
    j = j.clamp(0, max(m - 1, 0))
    own = q_ids[:, :, :1]  # (G, n, 1)
    in_row = torch.zeros(G, n, len(offsets), dtype=torch.bool)
    for t in range(k_ids.shape[2]):  # one id slot at a time: (G, n, E, T) would cost T times the memory
        in_row |= k_ids[:, :, t][:, j] == own
    in_row &= own >= 0  # a query with no id has no block row: its whole band is its own
    group = torch.arange(G)[:, None, None] * m
    return torch.where(inside & ~in_row, group + j, -1).view(G * n, len(offsets))


def lone_queries(plan: BlockPlan, band: torch.Tensor) -> torch.Tensor:
    """(count,) int64: the queries with band keys (``band`` (num_queries, E), −1 for none) that hold no row
    of ``plan``'s blocks."""
    in_block = torch.zeros(plan.num_queries, dtype=torch.bool)
    for blocks in plan.classes:
        in_block[blocks.queries[blocks.real_queries()]] = True
    return ((band >= 0).any(1) & ~in_block).nonzero().squeeze(1)
