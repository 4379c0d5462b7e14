"""Queries classed by their id sets (attention_kernels.bucketed.id_sets): the classes attend exactly the pairs
of the bucket ids, each once, and the fused kernel takes several ids per query through them."""

from __future__ import annotations

import pytest
import torch

from attention_kernels.bucketed import bucketed_attention, id_sets, torch_path
from attention_kernels.bucketed.block_attention import fused_kernel
from attention_kernels.bucketed.planning import distinct_ids
from attention_kernels.bucketed.reference import attended_mask, dense_bucketed_attention
from benchmarks.attention import balanced_buckets

pytestmark = pytest.mark.usefixtures("one_thread")


def _ids(groups: int, tokens: int, slots: int, buckets: int, *, seed: int) -> torch.Tensor:
    """(1, groups, tokens, slots) ids in [−1, buckets): repeats within a token and tokens with no id."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, buckets, (1, groups, tokens, slots), generator=gen, dtype=torch.int32)
    ids[..., 3, :] = -1  # a token with no id
    ids[..., 5, :] = ids[..., 5, :1]  # a token holding one id twice
    return ids


def _classes(q_ids: torch.Tensor, k_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    G = q_ids.shape[0] * q_ids.shape[1]
    flat = [distinct_ids(x.reshape(G, x.shape[2], -1)) for x in (q_ids, k_ids)]
    return id_sets.id_set_buckets(*flat)


@pytest.mark.parametrize(("q_slots", "k_slots"), [(2, 2), (3, 2), (2, 1)])
def test_a_query_meets_through_its_class_exactly_the_keys_it_shares_an_id_with(monkeypatch, q_slots, k_slots):
    """Class ids as bucket ids attend the same pairs as the ids themselves: a query's one class meets key j
    iff the two share an id; each key holds a class at most once, in ascending order; no id, no class."""
    monkeypatch.setattr(id_sets, "MIN_QUERIES_PER_CLASS", 1)
    q_ids, k_ids = _ids(3, 40, q_slots, 5, seed=q_slots), _ids(3, 33, k_slots, 5, seed=10 + k_slots)
    q_class, k_class = _classes(q_ids, k_ids)
    assert q_class.shape == (3, 40, 1)
    assert (q_class[:, 3] == -1).all()  # the token with no id
    expected = attended_mask(q_ids, k_ids)[0]  # (G, n, m)
    met = attended_mask(q_class.view(1, 3, 40, 1), k_class.view(1, 3, 33, -1))[0]
    assert torch.equal(met, expected)
    held = k_class >= 0
    assert (held[..., 1:] <= held[..., :-1]).all()  # the unused slots last
    assert ((k_class.diff(dim=-1) > 0) | ~held[..., 1:]).all()  # distinct and ascending
    # the same id set is the same class, in every group
    sets = q_ids[0]  # (groups, tokens, slots)
    for g, i, h, j in [(0, 0, 1, 7), (2, 9, 0, 11), (1, 1, 1, 2)]:
        same = set(sets[g, i].tolist()) - {-1} == set(sets[h, j].tolist()) - {-1}
        assert same == bool(q_class[g, i, 0] == q_class[h, j, 0])


def test_too_few_queries_per_class_keep_the_spread_rows():
    """16 buckets, two ids each, 64 tokens: about 0.5 queries per id set, far below the rule's 64."""
    ids = balanced_buckets(1, 2, 64, 16, 2, seed=1)
    assert _classes(ids, ids) is None
    assert torch_path.fused_plan(ids, ids, alpha=1.5) is None
    many = balanced_buckets(1, 2, 1024, 2, 2, seed=1)  # 2 buckets: at most 3 id sets
    assert _classes(many, many) is not None


def test_empty_sequences_plan_nothing():
    none = torch.zeros(1, 2, 0, 2, dtype=torch.int32)
    some = _ids(2, 10, 2, 3, seed=4)
    for q_ids, k_ids in ((none, some), (some, none)):
        plan = torch_path.fused_plan(q_ids, k_ids, alpha=1.5)
        assert plan is None or plan.num_pairs == 0


def test_keys_with_ids_no_query_holds_meet_no_class(monkeypatch):
    """Key ids outside every query's set (above, below and between their values) and other groups' sets."""
    monkeypatch.setattr(id_sets, "MIN_QUERIES_PER_CLASS", 1)
    q_ids = torch.tensor([[[[2, 6], [2, 6], [6, -1]], [[9, 2], [9, 9], [-1, -1]]]], dtype=torch.int32)
    k_ids = torch.tensor([[[[0, 4], [7, 100], [6, 1]], [[6, -1], [2, 3], [4, 9]]]], dtype=torch.int32)
    q_class, k_class = _classes(q_ids, k_ids)
    assert torch.equal(
        attended_mask(q_class.view(1, 2, 3, 1), k_class.view(1, 2, 3, -1)), attended_mask(q_ids, k_ids)
    )
    assert (k_class[0, :2] == -1).all()  # group 0: keys with ids 0, 4, 7, 100 meet nothing
    assert (k_class[1, 0] == -1).all()  # group 1: id 6 is a set of group 0's only
    assert int(q_class[1, 1, 0]) not in k_class[0].tolist()  # the class {9} is group 1's alone


def test_a_call_whose_flags_would_pass_the_bound_keeps_the_spread_rows(monkeypatch):
    monkeypatch.setattr(id_sets, "MIN_QUERIES_PER_CLASS", 1)
    ids = _ids(2, 40, 2, 5, seed=1)
    monkeypatch.setattr(id_sets, "MAX_FLAGS", 2 * 40 * 3)  # fewer than 2 groups × 40 keys × the classes
    assert _classes(ids, ids) is None


@pytest.mark.skipif(fused_kernel() is None, reason="the fused kernel is not built on this machine")
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "split"])
def test_inference_with_two_ids_runs_the_classes_exactly(monkeypatch, fused_plans, alpha, causal, shared):
    """Without gradients, two ids per token and no pattern, the fused kernel runs the id-set plan: float64
    outputs equal dense masked α-entmax (tokens in no bucket give zeros), and a training call, which keeps
    the spread rows, agrees."""
    monkeypatch.setattr(id_sets, "MIN_QUERIES_PER_CLASS", 1)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 150, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    q_ids = torch.cat([_ids(3, 150, 2, 6, seed=1), _ids(3, 150, 2, 6, seed=2)])
    k_ids = q_ids if shared else torch.cat([_ids(3, 150, 2, 6, seed=3), _ids(3, 150, 2, 6, seed=4)])
    with torch.no_grad():
        out = bucketed_attention(q, k, v, q_ids, k_ids, alpha=alpha, causal=causal, backend="torch")
    assert len(fused_plans) == 1 and not fused_plans[0].spread
    expected = dense_bucketed_attention(q, k, v, q_ids, k_ids, alpha=alpha, causal=causal)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    trained = bucketed_attention(
        q.requires_grad_(), k, v, q_ids, k_ids, alpha=alpha, causal=causal, backend="torch"
    )
    assert len(fused_plans) == 1  # gradients: the spread rows, whose probabilities the backward reuses
    torch.testing.assert_close(trained.detach(), out, rtol=0, atol=1e-12)


@pytest.mark.skipif(fused_kernel() is None, reason="the fused kernel is not built on this machine")
@pytest.mark.parametrize("window", [0, 9], ids=["no-window", "window-9"])
def test_grouped_query_heads_read_their_shared_keys_through_the_classes(monkeypatch, fused_plans, window):
    """Four query heads on two key/value heads, float32, balanced top-2 buckets as the benchmark draws,
    causal; with a window, each query's band keys too are read where the keys lie."""
    monkeypatch.setattr(id_sets, "MIN_QUERIES_PER_CLASS", 1)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 300, 32, generator=gen)
    k, v = (torch.randn(1, 2, 300, 32, generator=gen) for _ in range(2))
    ids = balanced_buckets(1, 4, 300, 4, 2, seed=7)
    pattern = dict(alpha=1.5, causal=True, window=window)
    with torch.no_grad():
        out = bucketed_attention(q, k, v, ids, ids, **pattern, backend="torch")
    assert len(fused_plans) == 1 and not fused_plans[0].spread  # the classes ran, with no fallback
    assert (fused_plans[0].band_keys is not None) == (window > 0)
    keys = [x.repeat_interleave(2, dim=1) for x in (k, v)]
    expected = dense_bucketed_attention(q, *keys, ids, ids, **pattern)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
