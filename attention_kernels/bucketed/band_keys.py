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

Each slot costs a dot product of its own, or a share of a small dense tile of its neighbours' window, and
passes through three passes and an (N, E) array of scores, where the spread rows' pattern blocks are tiles of
the block products: per key, a slot costs several times a block entry. So the fused kernel takes the slots
only where they are few beside a query's block row (:func:`takes_slots`), and bands up to
:data:`MAX_RADIUS` and up to :data:`MAX_GLOBAL` global tokens; others keep the spread rows and their pattern
blocks. Measured on one thread, d 64, 8 heads (``python -m benchmarks.fused_kernel --window W
--global-tokens g``), against the spread rows: 16 buckets at 2k tokens (128 keys a row), 1.03–1.43× at
w = 15 (15 slots), 0.89–1.02× at w = 31, 0.70–0.85× at w = 65 with 8 global tokens; 8 buckets (256 keys),
w = 65: 0.83–0.97×; 16 buckets at 4k tokens (256 keys), w = 31: 1.09–1.46×; top-2 of 4 buckets (about
1,370 keys), w = 65 with 8 global tokens: 1.16–1.22×.
"""

from __future__ import annotations

import torch

from attention_kernels.bucketed.planning import BlockPlan
from attention_kernels.native import call, library

MAX_RADIUS = 64
"""The widest band (radius) whose keys the fused kernel scores beside a query's block row."""

MAX_GLOBAL = 64
"""The most global tokens whose keys the fused kernel scores beside a query's block row."""

SLOT_SHARE = 0.15
"""The most slots per query, as a share of its block row's keys on average, that the fused kernel takes (the
measurements above break even between 0.2 and 0.25)."""


def slot_count(n: int, m: int, *, radius: int, causal: bool, global_tokens: int) -> tuple[int, int]:
    """(E, W): the slots of each query and the window's first W of them (see the module docstring)."""
    window = 0 if radius < 0 else radius + 1 if causal else 2 * radius + 1
    return window + min(max(global_tokens, 0), m), window


def takes_slots(plan: BlockPlan, slots: int) -> bool:
    """Whether ``slots`` per query are few enough beside the keys of ``plan``'s block rows (its entries
    over its queries, padding and a causal block's upper corner included) for the fused kernel:
    at most :data:`SLOT_SHARE` of them."""
    return slots <= SLOT_SHARE * plan.num_entries / max(plan.num_queries, 1)


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
    width, window = slot_count(n, m, radius=radius, causal=causal, global_tokens=global_tokens)
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
