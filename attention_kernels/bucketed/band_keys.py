"""A query's keys beyond its block row: the window band's and the global keys that share no id with it.

With a window band of radius r and g global tokens (:mod:`attention_kernels.attended`), query i attends

    A_i = S_i ∪ W_i ∪ G_i,   S_i = {j : ids(j) ∋ id(i)},   W_i = {j : |i − j| ≤ r},   G_i = {j : j < g}

(∩ {j ≤ i} when causal), and a global query (i < g) every key. Where each query holds one id (its bucket, or
its class of id sets from :mod:`attention_kernels.bucketed.id_sets`), its block row of a whole-block plan
holds S_i already. What the pattern adds is a short list of its own, in E = W + g′ slots:

    window slots e < W:   key j = i − r + e  if 0 ≤ j < m and id(i) ∉ ids(j)    (W = 2r + 1; r + 1 causal)
    global slots W + s:   key s              if s < m, |i − s| > r and id(i) ∉ ids(s)      (g′ = min(g, m))

so A_i is the row's keys and these, each pair once, and the fused kernel
(:mod:`attention_kernels.bucketed.block_attention`) scores them beside the row: its α-entmax covers all of
them, and each query still needs no normaliser across rows. A query in no block row (no id, or no key holds
its id) attends its slots alone (:func:`lone_queries`). A global query's row is every key: the caller
computes those few rows densely (their slots here are whatever its position gives).

Each slot costs a dot product of its own, or a share of a small dense tile of its neighbours' window (a
gather, not the block products), so the fused kernel takes bands up to :data:`MAX_RADIUS` and up to
:data:`MAX_GLOBAL` global tokens; more keep the spread rows and their pattern blocks.
"""

from __future__ import annotations

import torch

from attention_kernels.bucketed.planning import BlockPlan
from attention_kernels.native import call, library

MAX_RADIUS = 64
"""The widest band (radius) whose keys the fused kernel scores beside a query's block row."""

MAX_GLOBAL = 64
"""The most global tokens whose keys the fused kernel scores beside a query's block row."""


def band_keys(
    q_ids: torch.Tensor, k_ids: torch.Tensor, *, radius: int, causal: bool, global_tokens: int = 0
) -> tuple[torch.Tensor, int]:
    """(slots (G·n, E) int64, W): slot e of query g·n + i holds the flat key index g·m + j of its key (see
    the module docstring) when that is one of the query's pattern keys, else −1; the first W slots are the
    window's (W = 0 for ``radius`` −1, no band), the others the global keys'. q_ids (G, n, 1) one id per
    query (−1 for none), k_ids (G, m, T) (−1 for none). In C++ where it is built
    (attention_kernels/native/planning.cpp: one pass), else by tensor operations, slot by slot (each window
    slot's keys a shifted slice of the keys)."""
    G, n, _ = q_ids.shape
    m, slots = k_ids.shape[1:]
    window = 0 if radius < 0 else radius + 1 if causal else 2 * radius + 1
    width = window + min(max(global_tokens, 0), m)
    kernel = library("planning") if q_ids.device.type == "cpu" else None
    if kernel is not None:
        band = torch.empty(G * n, width, dtype=torch.int64)
        ids = (q_ids[:, :, 0].long().contiguous(), k_ids.long().contiguous())
        call(kernel, "band_keys", *ids, G, n, m, slots, radius, window, width, int(causal), band)
        return band, window
    band = torch.full((width, G, n), -1, dtype=torch.int64)
    own = q_ids[:, :, 0].masked_fill(q_ids[:, :, 0] < 0, -2)  # (G, n); a query with no id shares none
    flat = torch.arange(G)[:, None] * m + torch.arange(m)  # (G, m) flat key index
    for e in range(window):  # key j = i + offset: shifted slices, no gather
        offset = e - radius
        first, end = max(0, -offset), min(n, m - offset)  # the queries whose key lies in [0, m)
        if first >= end:
            continue
        keys = slice(first + offset, end + offset)
        in_row = (k_ids[:, keys] == own[:, first:end, None]).any(-1)  # (G, end − first)
        band[e, :, first:end] = flat[:, keys].masked_fill(in_row, -1)
    i = torch.arange(n)
    for s in range(width - window):  # global key s: every query but those its window or row holds
        kept = ~(k_ids[:, s : s + 1] == own[:, :, None]).any(-1)  # (G, n)
        if radius >= 0:
            kept &= (i - s).abs() > radius
        if causal:
            kept &= i >= s
        band[window + s] = torch.where(kept, flat[:, s : s + 1], -1)
    return band.view(width, G * n).T.contiguous(), window


def lone_queries(plan: BlockPlan) -> torch.Tensor:
    """(count,) int64: the queries that hold no row of ``plan``'s blocks (they attend their pattern keys
    alone)."""
    in_block = torch.zeros(plan.num_queries, dtype=torch.bool)
    for blocks in plan.classes:
        in_block[blocks.queries[blocks.real_queries()]] = True
    return (~in_block).nonzero().squeeze(1)
