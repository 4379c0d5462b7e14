"""A window band and global tokens on the fused kernel (attention_kernels.bucketed.band_keys): each query's
pattern keys outside its block row are exactly the pattern's pairs that share no id with it, each once, and
the fused kernel with them equals dense masked α-entmax over (shared bucket ∪ window ∪ global) ∩ causal."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attention_kernels.bucketed import band_keys, bucketed_attention, id_sets, torch_path
from attention_kernels.bucketed.block_attention import block_attention, fused_kernel
from attention_kernels.bucketed.reference import dense_bucketed_attention
from benchmarks.attention import balanced_buckets

pytestmark = pytest.mark.usefixtures("one_thread", "slots_at_any_share")
needs_kernel = pytest.mark.skipif(
    fused_kernel() is None, reason="the fused kernel is not built on this machine"
)


def _ids(batch: int, groups: int, tokens: int, slots: int, buckets: int, *, seed: int) -> torch.Tensor:
    """(batch, groups, tokens, slots) ids in [−1, buckets), with a run of tokens holding no id."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, buckets, (batch, groups, tokens, slots), generator=gen, dtype=torch.int32)
    ids[..., 20:26, :] = -1  # queries with no id: they attend their band alone
    return ids


def _brute_force(
    q_ids: torch.Tensor, k_ids: torch.Tensor, radius: int, causal: bool, global_tokens: int
) -> torch.Tensor:
    """The definition, pair by pair: window slot e of query (g, i) holds g·m + j, j = i − radius + e, and
    global slot s holds g·m + s outside the window (and s ≤ i when causal), when the key exists and holds
    no id equal to the query's."""
    G, n, _ = q_ids.shape
    m = k_ids.shape[1]
    window = 0 if radius < 0 else radius + 1 if causal else 2 * radius + 1
    width = window + min(global_tokens, m)
    band = torch.full((G * n, width), -1, dtype=torch.int64)
    for g in range(G):
        for i in range(n):
            own = int(q_ids[g, i, 0])
            keys = [i - radius + e for e in range(window)]
            keys += [
                s if abs(i - s) > radius and (not causal or s <= i) else -1 for s in range(width - window)
            ]
            for e, j in enumerate(keys):
                if 0 <= j < m and not (own >= 0 and own in k_ids[g, j].tolist()):
                    band[g * n + i, e] = g * m + j
    return band


@pytest.mark.parametrize("built", [True, False], ids=["cpp", "tensors"])
@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize("global_tokens", [0, 3])
@pytest.mark.parametrize(
    ("radius", "causal"), [(0, False), (2, False), (7, False), (0, True), (5, True), (-1, False), (-1, True)]
)
def test_band_keys_are_the_pattern_pairs_outside_the_query_row(
    monkeypatch, built, slots, global_tokens, radius, causal
):
    """n ≠ m when not causal (queries past the keys' end hold fewer slots); queries with no id keep their
    whole band; keys holding the query's id among several are left to the row; a global key inside the
    window is the window's."""
    if not built:
        monkeypatch.setattr(band_keys, "library", lambda name: None)
    gen = torch.Generator().manual_seed(radius * 7 + slots)
    n, m = (30, 30) if causal else (30, 24)
    q_ids = torch.randint(-1, 3, (4, n, 1), generator=gen)
    k_ids = torch.randint(-1, 3, (4, m, slots), generator=gen)
    pattern = dict(radius=radius, causal=causal, global_tokens=global_tokens)
    band, window = band_keys.band_keys(q_ids, k_ids, **pattern)
    assert window == (0 if radius < 0 else radius + 1 if causal else 2 * radius + 1)
    assert torch.equal(band, _brute_force(q_ids, k_ids, radius, causal, global_tokens))


@needs_kernel
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("window", "global_tokens"), [(1, 0), (3, 0), (11, 0), (17, 0), (0, 2), (11, 3)])
@pytest.mark.parametrize("top", [1, 2])
def test_inference_with_a_pattern_runs_the_fused_kernel_exactly(
    monkeypatch, fused_plans, alpha, causal, window, global_tokens, top
):
    """float64, 150 tokens (the band's chunks of 16 queries cross the groups' ends), separate query and key
    ids: outputs equal dense masked α-entmax over (shared bucket ∪ window ∪ global) ∩ causal, in one fused
    call whose plan carries the pattern's keys (the global queries' rows dense beside it); a training call
    (the spread rows and their pattern blocks) agrees. Windows 11 and 17 take the band's dense tiles where 1
    and 3 take a dot product per key."""
    monkeypatch.setattr(id_sets, "MIN_QUERIES_PER_CLASS", 1)
    gen = torch.Generator().manual_seed(window + 10 * top)
    q, k, v = (torch.randn(2, 3, 150, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    q_ids, k_ids = _ids(2, 3, 150, top, 4, seed=window), _ids(2, 3, 150, top, 4, seed=window + 1)
    pattern = dict(alpha=alpha, causal=causal, window=window, global_tokens=global_tokens)
    with torch.no_grad():
        out = bucketed_attention(q, k, v, q_ids, k_ids, **pattern, backend="torch")
    assert len(fused_plans) == 1 and not fused_plans[0].spread and fused_plans[0].band_keys is not None
    expected = dense_bucketed_attention(q, k, v, q_ids, k_ids, **pattern)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    trained = bucketed_attention(q.requires_grad_(), k, v, q_ids, k_ids, **pattern, backend="torch")
    assert len(fused_plans) == 1  # gradients: the spread rows, whose probabilities the backward reuses
    torch.testing.assert_close(trained.detach(), out, rtol=0, atol=1e-12)


@needs_kernel
def test_queries_with_no_id_and_no_band_key_output_zeros():
    """More queries than keys, not causal: queries with no id attend their band alone, and those past the
    keys' end by more than the radius attend nothing (zeros), as dense attention over an empty row gives."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 90, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 60, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    q_ids = torch.full((1, 2, 90, 1), -1, dtype=torch.int32)
    q_ids[..., :10, 0] = 0
    k_ids = torch.zeros(1, 2, 60, 1, dtype=torch.int32)
    with torch.no_grad():
        out = bucketed_attention(q, k, v, q_ids, k_ids, alpha=1.5, window=5, backend="torch")
    expected = dense_bucketed_attention(q, k, v, q_ids, k_ids, alpha=1.5, window=5)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert (out[..., 63:, :] == 0).all() and (out[..., 10:62, :].abs().sum(-1) > 0).all()


@needs_kernel
def test_the_band_passes_give_the_same_bits_on_any_number_of_threads():
    """Each query's band scores and outputs are computed by one thread in a fixed order."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 4, 200, 32, generator=gen) for _ in range(3))
    ids = balanced_buckets(2, 4, 200, 4, 1, seed=2)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.no_grad():
            outs.append(bucketed_attention(q, k, v, ids, ids, alpha=1.5, window=21, backend="torch"))
    assert torch.equal(*outs)


def test_wide_bands_and_many_global_tokens_keep_the_spread_rows():
    """Past MAX_RADIUS or MAX_GLOBAL a query's pattern keys, one by one, would cost more than their
    blocks."""
    ids = balanced_buckets(1, 2, 256, 2, 1, seed=1)
    wide = dict(radius=band_keys.MAX_RADIUS + 1)
    many = dict(radius=3, global_tokens=band_keys.MAX_GLOBAL + 1)
    assert torch_path.fused_plan(ids, ids, alpha=1.5, **wide) is None
    assert torch_path.fused_plan(ids, ids, alpha=1.5, **many) is None
    if fused_kernel() is not None:
        most = dict(radius=band_keys.MAX_RADIUS, global_tokens=band_keys.MAX_GLOBAL)
        assert torch_path.fused_plan(ids, ids, alpha=1.5, **most) is not None


@needs_kernel
def test_slots_many_beside_the_rows_keep_the_spread_rows(monkeypatch):
    """16 balanced buckets of 2,048 tokens: 128 keys a row. A window of 15 (15 slots, 0.12 of a row) takes
    the slots; 31 (0.24) and 65 with 8 global tokens (0.57) keep the spread rows, as does w = 31 at 1,024
    tokens; at 4,096 tokens (256 keys a row) w = 31 takes the slots again."""
    monkeypatch.setattr(band_keys, "SLOT_SHARE", 0.15)
    for n, window, global_tokens, taken in [
        (2048, 15, 0, True),
        (2048, 31, 0, False),
        (2048, 65, 8, False),
        (1024, 31, 0, False),
        (4096, 31, 0, True),
    ]:
        ids = balanced_buckets(1, 1, n, 16, 1, seed=1)
        pattern = dict(radius=window // 2, global_tokens=global_tokens)
        assert (torch_path.fused_plan(ids, ids, alpha=1.5, **pattern) is not None) == taken, (n, window)


@needs_kernel
def test_a_plan_with_band_keys_runs_on_the_fused_kernel_alone():
    """The unfused paths have no band blocks in such a plan: they refuse it rather than drop the band; the
    kernel refuses band keys that index no key."""
    ids = balanced_buckets(1, 2, 128, 2, 1, seed=1)
    plan = torch_path.fused_plan(ids, ids, alpha=1.5, radius=2)
    q, k, v = (torch.randn(2 * 128, 8) for _ in range(3))
    with pytest.raises(ValueError, match="band_keys"):
        torch_path._blocks_forward(q, k, v, plan, 1.5, keep=False)
    outside = plan.band_keys.clone()
    outside[5, 0] = len(k)
    with pytest.raises(ValueError, match=r"band_keys must index rows in \[0, 256\)"):
        block_attention(q, k, v, replace(plan, band_keys=outside), 1.5)
    with pytest.raises(ValueError, match="band_keys must be"):
        block_attention(q, k, v, replace(plan, band_keys=plan.band_keys[:10]), 1.5)
