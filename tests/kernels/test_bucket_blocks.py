"""The single-bucket fast path (``attention_kernels.bucketed.planning`` plans, ``BucketBlockAttention``
computes) against the dense reference: exact pair coverage, values and gradients at awkward shapes, gradcheck
in float64."""

from __future__ import annotations

import functools

import pytest
import torch
from entmax import entmax15, sparsemax

from attention_kernels.attended import attended_mask
from attention_kernels.bucketed import bucketed_attention, planning, torch_path
from attention_kernels.bucketed.planning import ladder, plan_blocks
from attention_kernels.bucketed.reference import dense_bucketed_attention
from attention_kernels.bucketed.torch_path import plan_attention
from attention_kernels.native import call
from benchmarks.attention import balanced_buckets
from tests.kernels.test_block_products import needs_compiler
from tests.kernels.test_torch_bucketed import assert_close_to_truth, dense64, pair_counts

pytestmark = pytest.mark.usefixtures("one_thread")

attention = functools.partial(bucketed_attention, backend="torch")


def skewed_ids(heads: int, n: int, *, seed: int) -> torch.Tensor:
    """(1, heads, n, 1) ids: one bucket with about half the tokens, a few small ones, and some −1."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 5, (1, heads, n, 1), generator=gen, dtype=torch.int32)
    ids[torch.rand(ids.shape, generator=gen) < 0.5] = 0
    ids[torch.rand(ids.shape, generator=gen) < 0.1] = -1
    return ids


@pytest.mark.parametrize("count", [0, 1, 4096, 4607, 4608, 20000, 2**15])
@pytest.mark.parametrize("dtype", [torch.int16, torch.int64])
def test_stable_order_is_the_stable_sort(count, dtype):
    """Padded to the radix sort's length or not, the order is the stable sort's: equal keys keep theirs."""
    keys = torch.randint(0, 7, (count,), generator=torch.Generator().manual_seed(count), dtype=dtype)
    order = planning._stable_order(keys)
    assert torch.equal(order, torch.sort(keys, stable=True).indices)


def test_a_causal_buckets_short_chunk_comes_first_with_full_rows():
    """Every causal bucket block facing few keys has the full rows, its bucket's short chunk the first (so
    the padding rows face the fewest keys), and key counts are whole KEY_STEPs."""
    n, rows = 300, planning.CAUSAL_ROWS
    ids = torch.zeros(1, n, 1, dtype=torch.long)  # one bucket of 300 queries: chunks of 44, 64, 64, 64, 64
    plan = plan_blocks(ids, ids, causal=True)
    assert all(c.queries.shape[1] == rows for c in plan.classes)
    assert all(c.keys.shape[1] % planning.KEY_STEP == 0 for c in plan.classes)
    first = min(plan.classes, key=lambda c: c.keys.shape[1])
    real = first.real_queries()[0]
    assert int(real.sum()) == n - 4 * rows  # the short chunk: positions 0..43
    assert first.queries[0][real].tolist() == list(range(n - 4 * rows))
    assert torch.equal(pair_counts(plan, n), attended_mask(ids[None], ids[None], causal=True)[0, 0].long())


def test_causal_buckets_of_one_chunk_keep_their_rows_on_the_ladder():
    """Buckets of a few queries (a short sentence over a dozen buckets) are not padded to full chunks: a
    block's rows are its queries rounded up the ladder, so the plan computes fewer entries than dense
    attention (padded to full chunks, ten times as many)."""
    G, n, nid = 8, 48, 12
    ids = torch.randint(0, nid, (G, n, 1), generator=torch.Generator().manual_seed(0))
    plan = plan_blocks(ids, ids, causal=True)
    assert all(c.queries.shape[1] < planning.CAUSAL_ROWS for c in plan.classes)
    for blocks in plan.classes:
        real = blocks.real_queries().sum(1)
        assert bool((ladder(real) == blocks.queries.shape[1]).all())
    assert plan.num_entries < G * n * n
    expected = attended_mask(ids[None], ids[None], causal=True)[0].reshape(G * n, n)
    assert torch.equal(pair_counts(plan, n), expected.long())


def test_a_causal_buckets_copies_of_every_slot_are_one_run():
    """A bucket's query copies from every id slot are one run sorted by position, cut into chunks that each
    face the bucket's keys up to their last query: an early chunk faces a short prefix (one run per slot
    would make every chunk span the sequence and face nearly all of the bucket's keys)."""
    n = 256
    i = torch.arange(n)
    ids = torch.stack([i % 4, (i + 1) % 4], -1)[None]  # bucket b: slot 0 of i ≡ b, slot 1 of i ≡ b − 1, mod 4
    plan = plan_blocks(ids, ids, causal=True)
    held = [set(token.tolist()) for token in ids[0]]
    chunks: dict[int, list[list[int]]] = {}
    for blocks in plan.classes:
        real_q, real_k = blocks.real_queries(), ~blocks.padding_keys()
        for b in range(len(blocks.queries)):
            queries, keys = blocks.queries[b][real_q[b]].tolist(), blocks.keys[b][real_k[b]].tolist()
            (bucket,) = set.intersection(*(held[t] for t in queries + keys))
            assert keys == [j for j in range(n) if bucket in held[j] and j <= queries[-1]]
            chunks.setdefault(bucket, []).append(queries)
    for bucket, runs in chunks.items():
        copies = [t for t in range(n) if bucket in held[t]]  # 128 of them, from both slots
        assert [t for run in sorted(runs) for t in run] == copies
        assert len(runs) == len(copies) // planning.CAUSAL_ROWS


def test_ladder_rounds_up_by_at_most_a_quarter():
    x = torch.arange(1, 5000)
    up = ladder(x)
    assert (up >= x).all() and (up <= torch.maximum(x + 3, (x * 5) // 4)).all()
    assert len(set(ladder(torch.arange(257, 513)).tolist())) == 4  # four sizes per octave


@pytest.mark.parametrize(
    ("n", "m", "causal"),
    [(n, n, c) for n in (1, 17, 97, 130, 300) for c in (False, True)] + [(97, 40, False), (17, 130, False)],
)
def test_blocks_hold_each_attended_pair_once(n, m, causal):
    qb, kb = skewed_ids(3, n, seed=n), skewed_ids(3, m, seed=m + 1)
    plan = plan_blocks(qb.reshape(3, n, 1).long(), kb.reshape(3, m, 1).long(), causal=causal)
    assert not plan.spread
    mask = attended_mask(qb, kb, causal=causal)[0].reshape(3 * n, m)
    assert torch.equal(pair_counts(plan, m), mask.long())
    assert plan.num_pairs == int(mask.sum())
    # ladder rounding, whole KEY_STEPs of keys per row, and when causal the full rows of short chunks of
    # buckets of several chunks (at most 2 · rows² entries for each of the 5 buckets of 3 heads)
    rows = planning.CAUSAL_ROWS
    short_chunks = 3 * 5 * 2 * rows * rows if causal else 0
    assert plan.num_entries <= 4 * plan.num_pairs + 3 * n * (8 + planning.KEY_STEP) + short_chunks


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("alpha", [1.0, 1.3, 1.5, 2.0])
@pytest.mark.parametrize("d", [32, 64])
@pytest.mark.parametrize("n", [1, 17, 97, 130])
def test_values_and_gradients_match_reference(n, d, alpha, causal):
    gen = torch.Generator().manual_seed(n + d)
    q, k, v = (torch.randn(1, 3, n, d, generator=gen) for _ in "qkv")
    qb = kb = skewed_ids(3, n, seed=n)
    qb = qb.clone()
    qb[0, 0, : n // 3] = 7  # a bucket no key holds: rows with no key
    opts = dict(alpha=alpha, causal=causal)
    assert_close_to_truth(
        attention(q, k, v, qb, kb, **opts),
        dense_bucketed_attention(q, k, v, qb, kb, **opts),
        dense64(q, k, v, qb, kb, **opts),
    )
    grad_out = torch.randn(q.shape, generator=gen)
    grads = []
    for fn, dtype in (
        (attention, torch.float32),
        (dense_bucketed_attention, torch.float32),
        (dense64, torch.float64),
    ):
        leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        fn(*leaves, qb, kb, **opts).backward(grad_out.to(dtype))
        grads.append([x.grad for x in leaves])
    # dS = P ∘ (dP − rowsum(dO ∘ O)) cancels to 0 on a row with one key; its terms are of size |dO|·|v|
    terms = (grad_out.abs().max() * v.abs().max()).item()
    for ours, ref, truth in zip(*grads, strict=True):
        assert_close_to_truth(ours, ref, truth, terms=terms)


@pytest.mark.parametrize("spread", [False, True], ids=["one-row", "spread"])
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.7])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradcheck_over_several_chunks(alpha, causal, spread, monkeypatch):
    monkeypatch.setattr(torch_path, "CHUNK_ENTRIES", 8)  # one block per chunk
    monkeypatch.setattr(planning, "ROWS", 3)
    monkeypatch.setattr(planning, "CAUSAL_ROWS", 2)  # buckets span several query chunks
    monkeypatch.setattr(planning, "BAND_ROWS", 2)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (
        torch.randn(1, 2, 11, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in "qkv"
    )
    ids = skewed_ids(2, 11, seed=3)
    pattern = {}
    if spread:  # two ids per token, a window and a global token: every query's keys in several rows
        ids = torch.cat([ids, skewed_ids(2, 11, seed=5)], dim=-1)
        pattern = {"window": 3, "global_tokens": 1}
    plan = torch_path.plan_attention(
        ids, ids, causal=causal, radius=1 if spread else -1, **({"global_tokens": 1} if spread else {})
    )
    assert plan.spread == spread and len(plan.classes) > 1

    def fn(q, k, v):
        return attention(q, k, v, ids, ids, alpha=alpha, causal=causal, **pattern)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6, fast_mode=True)
    # inference keeps no probabilities: its chunks share one buffer (the unfused path's: the fused kernel,
    # which would take this call, sums in another order)
    monkeypatch.setattr(torch_path, "takes_fused_kernel", lambda *args, **kwargs: False)
    with torch.no_grad():
        inferred = fn(q, k, v)
    assert torch.equal(inferred, fn(q, k, v).detach())


def test_one_id_per_token_keeps_whole_rows():
    """Extra slots that hold −1 or repeat the token's id add no bucket: still one row per query."""
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in "qkv")
    ids = skewed_ids(2, 40, seed=0)
    wide = torch.cat([ids, torch.full_like(ids, -1), ids], dim=-1)
    wide[0, 0, ::3, 1], wide[0, 0, ::3, 0] = wide[0, 0, ::3, 0], -1
    assert not torch_path.plan_attention(wide, wide, causal=True).spread
    out = attention(q, k, v, ids, ids, alpha=1.5, causal=True)
    torch.testing.assert_close(out, dense_bucketed_attention(q, k, v, ids, ids, alpha=1.5, causal=True))
    torch.testing.assert_close(attention(q, k, v, wide, wide, alpha=1.5, causal=True), out)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("spread", [0.3, 1.0, 4.0])
def test_row_normaliser_equals_sort_based_entmax(alpha, spread):
    """Row α-entmax, each row its own query (support check, rows that settle late continuing on their own)
    against the sort-based entmax15 / sparsemax, with −inf entries and an empty row."""
    gen = torch.Generator().manual_seed(int(spread * 10))
    scores = torch.randn(6, 64, 50, generator=gen, dtype=torch.float64) * spread
    scores[scores < -1.5 * spread] = float("-inf")
    scores[0, 0] = float("-inf")
    expected = (entmax15 if alpha == 1.5 else sparsemax)(scores.masked_fill(scores.isinf(), -1e300), dim=-1)
    expected[0, 0] = 0
    rows = torch_path._SpreadRows([torch.arange(6 * 64).view(6, 64)], 6 * 64)
    [probs] = torch_path._normalise([scores.clone()], alpha, rows)
    torch.testing.assert_close(probs, expected, rtol=0, atol=1e-12)


def test_pattern_blocks_are_shared_between_plans_of_one_shape_and_left_as_they_were():
    """The window and global blocks depend on the shapes alone: a plan made after others of the same shape
    (other ids, other patterns) is the very plan made afresh, and the kept blocks are never written to."""
    pattern = dict(causal=True, radius=4, global_tokens=2)

    def plan(seed: int, **opts):
        ids = skewed_ids(2, 60, seed=seed).long()[0]
        return plan_blocks(ids, ids, **opts)

    def fields(p):
        return [x for c in p.classes for x in (c.queries, c.keys, *vars(c.mask).values()) if x is not None]

    planning._pattern_blocks.cache_clear()
    first = fields(plan(0, **pattern))
    plan(1, **pattern), plan(2, causal=True, radius=1), plan(3, causal=False, radius=4, global_tokens=2)
    assert planning._pattern_blocks.cache_info().hits == 1
    again = fields(plan(0, **pattern))
    assert len(again) == len(first) and all(torch.equal(a, b) for a, b in zip(again, first, strict=True))
    planning._pattern_blocks.cache_clear()
    fresh = fields(plan(0, **pattern))
    assert all(torch.equal(a, b) for a, b in zip(fresh, first, strict=True))


@pytest.mark.parametrize(
    ("groups", "n", "m", "slots", "nid", "causal", "rows"),
    [
        (3, 50, 50, 1, 5, True, 4),
        (3, 50, 31, 1, 5, False, 4),
        (2, 40, 40, 2, 7, True, 3),
        (2, 40, 70, 2, 7, False, 64),
        (4, 33, 33, 3, 9, True, 2),
        (4, 33, 20, 3, 9, False, 1),
        (2, 0, 0, 2, 3, True, 4),
    ],
)
def test_bucket_runs_in_cpp_equal_the_tensor_reference(groups, n, m, slots, nid, causal, rows, monkeypatch):
    """The C++ counting sort and chunking (where built) and the tensor path's stable sort, searches and
    chunks give the same copies and chunks, with −1 left out, no id repeated within a token, ids that only
    queries or only keys hold, and causal prefixes."""
    gen = torch.Generator().manual_seed(n + m)

    def ids(length: int, top: int) -> torch.Tensor:  # (groups, length, slots), −1 for none
        rows = [torch.randperm(top + 1, generator=gen)[:slots] - 1 for _ in range(groups * length)]
        return torch.stack(rows).view(groups, length, slots) if rows else torch.empty(groups, 0, slots).long()

    q_ids, k_ids = ids(n, nid), ids(m, nid - 2)  # the top two ids only among the queries
    found = planning._bucket_runs(q_ids, k_ids, causal, rows)
    monkeypatch.setattr(planning, "library", lambda name: None)
    expected = planning._bucket_runs(q_ids, k_ids, causal, rows)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(found, expected, strict=True))
    assert len(found[0]) == int((q_ids >= 0).sum()) and len(found[2]) == int((k_ids >= 0).sum())
    assert bool((found[5] <= rows).all())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [0, 1, 300])
def test_block_classes_in_cpp_equal_the_tensor_reference(blocks, causal, monkeypatch):
    """Blocks of every kind, some without rows or keys, in four groups: the C++ pass (where built) keeps,
    rounds and orders them as the tensor operations do, class for class."""
    gen = torch.Generator().manual_seed(blocks)
    n, groups = 500, 4
    q_flat = torch.randperm(groups * n, generator=gen)  # a block's group: that of its first query copy
    runs = torch.stack(
        [
            torch.randint(0, groups * n - 160, (blocks,), generator=gen),  # first query copy
            torch.randint(0, 80, (blocks,), generator=gen),  # rows (0: dropped)
            torch.randint(0, 10_000, (blocks,), generator=gen),  # first key copy
            torch.randint(0, 700, (blocks,), generator=gen),  # keys (0: dropped)
            torch.randint(0, 3, (blocks,), generator=gen),  # kind
            torch.randint(-1, 16, (blocks,), generator=gen),  # bucket id
        ]
    )
    # every third block the next chunk of the bucket before it (its queries run on), one in two of those in
    # the same group
    for b in range(1, blocks, 3):
        runs[[0, 4, 5], b] = torch.stack([runs[0, b - 1] + runs[1, b - 1], torch.tensor(0), runs[5, b - 1]])
    found = planning._block_classes(runs, q_flat, n, groups, causal, 64, 32)
    monkeypatch.setattr(planning, "library", lambda name: None)
    expected = planning._block_classes(runs, q_flat, n, groups, causal, 64, 32)
    assert found[1] == expected[1] and sum(c[3] for c in found[1]) == len(found[0][0])
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(found[0], expected[0], strict=True))
    assert blocks < 300 or len(found[1]) > 3  # many classes among many blocks


@pytest.mark.parametrize(
    ("slots", "top", "one_each"), [(1, 5, False), (2, 3, False), (3, 6, False), (3, 6, True)]
)
def test_distinct_ids_in_cpp_equal_the_tensor_reference(slots, top, one_each, monkeypatch):
    """Repeated ids within a token become −1 (−1 among them), int32 input included; with at most one id a
    token, one slot holding it (or −1)."""
    gen = torch.Generator().manual_seed(slots + top)
    ids = torch.randint(-1, top, (3, 70, slots), generator=gen, dtype=torch.int32)
    if one_each:  # every slot but one −1
        ids = torch.where(torch.arange(slots) == torch.randint(0, slots, (3, 70, 1), generator=gen), ids, -1)
    found = planning.distinct_ids(ids)
    monkeypatch.setattr(planning, "library", lambda name: None)
    expected = planning.distinct_ids(ids)
    assert found.dtype == expected.dtype == torch.int64 and torch.equal(found, expected)
    assert found.shape[-1] == (1 if one_each else slots)
    for token, row in zip(
        ids.view(-1, slots).tolist(), found.view(-1, found.shape[-1]).tolist(), strict=True
    ):
        assert {i for i in row if i >= 0} == {i for i in token if i >= 0}  # the same ids, each once
        assert len([i for i in row if i >= 0]) == len({i for i in token if i >= 0})


@pytest.mark.parametrize(
    ("k_shape", "options"),
    [
        ((1, 20, 1), {}),
        ((3, 21, 1), {"causal": True}),
        ((3, 20, 1), {"rows": 0}),
        ((3, 20, 1), {"key_step": 0}),
    ],
)
def test_plans_of_mismatched_groups_or_empty_steps_are_refused(k_shape, options):
    """Before any pass reads past the keys' groups or divides by a step of 0."""
    q_ids = torch.zeros(3, 20, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="plan_blocks needs as many key groups"):
        plan_blocks(q_ids, torch.zeros(k_shape, dtype=torch.int64), **{"causal": False, **options})


@needs_compiler
def test_the_planning_kernel_is_built_where_a_compiler_is():
    """Else the comparisons above would be the tensor path against itself."""
    assert planning.library("planning") is not None


@needs_compiler
@pytest.mark.parametrize(("nid", "capacity", "status"), [(3, 4, -2), (4, 1, -3)])
def test_the_bucket_chunks_refuse_an_id_past_its_count_or_chunks_past_their_room(nid, capacity, status):
    """Its caller counts the ids and the chunks' room; a miscount is an error, not a write past them."""
    kernel = planning.library("planning")
    ids, sorted_ = torch.tensor([[[0], [3]]]), torch.empty(4, 2, dtype=torch.int64)
    chunks, counts = torch.empty(5, capacity, dtype=torch.int64), torch.empty(3, dtype=torch.int64)
    with pytest.raises(ValueError, match=rf"bucket_chunks refused its arguments \(status {status}"):
        call(kernel, "bucket_chunks", ids, 2, 1, ids, 2, 1, 1, nid, 0, 1, *sorted_, chunks, capacity, counts)


def _fields(plan) -> list[torch.Tensor | None]:
    """Every tensor of a plan, in order."""
    masks = [c.mask for c in plan.classes]
    names = ("key_pos", "limit", "low", "q_tags", "k_tags")
    return [t for c, mask in zip(plan.classes, masks, strict=True) for t in (c.queries, c.keys)] + [
        None if mask is None else getattr(mask, name) for mask in masks for name in names
    ]


@pytest.mark.parametrize(
    ("n", "top", "causal", "pattern"),
    [
        (300, 1, False, {}),
        (300, 1, True, {}),
        (257, 2, True, {}),
        (257, 3, False, {}),
        (200, 2, True, {"radius": 5, "global_tokens": 3}),
        (200, 1, False, {"radius": 5, "global_tokens": 3}),
        (130, 3, False, {"global_tokens": 2}),
    ],
)
def test_plans_from_the_cpp_passes_equal_the_tensor_reference(n, top, causal, pattern, monkeypatch):
    """attention_kernels/native/planning.cpp (sort, padded runs, tags) where it is built and the tensor
    operations give the same plan, tensor for tensor: indices, limits, positions and tags, with tokens holding
    no id."""
    ids = balanced_buckets(2, 3, n, 8, top, seed=n)
    ids[..., :5, 0] = -1
    found = plan_attention(ids, ids, causal=causal, **pattern)
    monkeypatch.setattr(planning, "library", lambda name: None)
    expected = plan_attention(ids, ids, causal=causal, **pattern)
    assert found.spread == expected.spread and len(found.classes) == len(expected.classes)
    for a, b in zip(_fields(found), _fields(expected), strict=True):
        assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b))
