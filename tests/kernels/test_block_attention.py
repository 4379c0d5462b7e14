"""The fused C++ block attention (attention_kernels.bucketed.block_attention) against the unfused block path
and dense α-entmax, and the dispatch that sends no-grad top-1 calls to it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attention_kernels.bucketed import bucketed_attention, id_sets, torch_path
from attention_kernels.bucketed.block_attention import block_attention, fits, fused_kernel
from attention_kernels.bucketed.planning import BlockMask
from attention_kernels.bucketed.reference import dense_bucketed_attention
from tests.kernels.test_block_products import needs_vectors

ALPHAS = [1.0, 1.5, 2.0]


def _flat_problem(
    heads: int, n: int, d: int, dv: int, buckets: int, dtype: torch.dtype, *, seed: int, split: bool
):
    """Scaled flat q (heads·n, d), k, v (heads·n, dv), and bucket ids (1, heads, n, 1) of uneven buckets, a
    few tokens in none (−1); with ``split`` the keys draw their own ids (as a learned predictor's do)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n, d, generator=gen, dtype=dtype)
    k = torch.randn(1, heads, n, d, generator=gen, dtype=dtype)
    v = torch.randn(1, heads, n, dv, generator=gen, dtype=dtype)
    # bucket b drawn with weight b + 1: sizes from a few tokens to many, so blocks fall in several classes
    weights = torch.arange(1, buckets + 1, dtype=torch.float64)
    q_ids = torch.multinomial(weights, heads * n, replacement=True, generator=gen).view(1, heads, n, 1)
    k_ids = torch.multinomial(weights, heads * n, replacement=True, generator=gen).view(1, heads, n, 1)
    q_ids[..., 1::13, :] = -1  # token 0 keeps a bucket: padding rows point at it
    k_ids = k_ids if split else q_ids.clone()
    return (q, k, v), (q_ids.int(), k_ids.int())


def _fused_and_unfused(qkv, ids, alpha: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel's output and the unfused block path's, on the same whole-bucket plan."""
    q, k, v = qkv
    b, h, n, d = q.shape
    plan = torch_path.plan_attention(*ids, causal=causal, whole_buckets=True)
    flat = (q.reshape(h * n, d), k.reshape(h * n, d), v.reshape(h * n, -1))
    fused = block_attention(*flat, plan, alpha, d**-0.5)
    assert fused is not None, "the fused kernel refused a whole-query plan"
    unfused = torch_path._blocks_forward(flat[0] * d**-0.5, *flat[1:], plan, alpha, keep=False)[0]
    return fused.view(b, h, n, -1), unfused.view(b, h, n, -1)


@needs_vectors
def test_the_fused_kernel_is_built_where_it_can_run():
    """Else every test below would be skipped by a None."""
    assert fused_kernel() is not None


@needs_vectors
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("split", [False, True], ids=["shared-ids", "own-key-ids"])
@pytest.mark.parametrize(("d", "dv"), [(16, 16), (7, 5), (64, 64)], ids=["d16", "d7-dv5", "d64"])
def test_fused_equals_dense_entmax_in_float64(alpha, causal, split, d, dv):
    """Outputs equal dense masked α-entmax to float64 round-off: uneven buckets (several block classes,
    padding rows and keys), tokens in no bucket (zeros), keys with their own ids (causal rows whose bucket
    holds no earlier key get zeros), a head size that is no whole vector (the copied value rows)."""
    qkv, ids = _flat_problem(3, 211, d, dv, 6, torch.float64, seed=d + dv, split=split)
    fused, unfused = _fused_and_unfused(qkv, ids, alpha, causal)
    q, k, v = qkv
    dense = dense_bucketed_attention(q, k, v, *ids, alpha=alpha, causal=causal)
    torch.testing.assert_close(fused, dense, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(fused, unfused, atol=1e-12, rtol=1e-10)
    assert (fused[..., 1::13, :] == 0).all(), "a query in no bucket must output zeros"


@needs_vectors
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fused_matches_the_unfused_path_in_float32(alpha, causal):
    """Buckets of 100 to 300 tokens (tiles of every width, several product strips): float32 round-off."""
    qkv, ids = _flat_problem(2, 1500, 64, 64, 8, torch.float32, seed=3, split=False)
    fused, unfused = _fused_and_unfused(qkv, ids, alpha, causal)
    torch.testing.assert_close(fused, unfused, atol=2e-6, rtol=1e-4)


@needs_vectors
@pytest.mark.parametrize("alpha", [1.0, 1.5])
def test_fused_output_does_not_depend_on_the_thread_count(alpha):
    """Each query's arithmetic is its own: one and two threads give the same bits."""
    qkv, ids = _flat_problem(4, 400, 32, 32, 5, torch.float32, seed=5, split=True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _fused_and_unfused(qkv, ids, alpha, True)[0]
        torch.set_num_threads(2)
        two = _fused_and_unfused(qkv, ids, alpha, True)[0]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@needs_vectors
def test_plans_the_kernel_cannot_take_are_refused_not_miscomputed():
    """Spread plans (two ids per token, a pattern), α outside {1, 1.5, 2}, half precision and key positions
    out of order give None (the caller's unfused path runs); bad indices a one-line error."""
    (q, k, v), ids = _flat_problem(1, 120, 16, 16, 3, torch.float32, seed=7, split=False)
    flat = (q.reshape(120, 16), k.reshape(120, 16), v.reshape(120, 16))
    plan = torch_path.plan_attention(*ids, causal=True, whole_buckets=True)
    assert fits(plan, 1.5, *flat)
    two_ids = torch.cat([ids[0], ids[0].flip(2)], -1)
    assert block_attention(*flat, torch_path.plan_attention(two_ids, two_ids, causal=True), 1.5) is None
    assert block_attention(*flat, torch_path.plan_attention(*ids, causal=True, radius=2), 1.5) is None
    assert block_attention(*flat, plan, 1.3) is None
    assert block_attention(*(x.half() for x in flat), plan, 1.5) is None
    blocks = plan.classes[0]
    shuffled = BlockMask(blocks.mask.key_pos.flip(1).contiguous(), blocks.mask.limit)
    out_of_order = replace(plan, classes=[replace(blocks, mask=shuffled)])
    assert block_attention(*flat, out_of_order, 1.5) is None
    bad = replace(plan, classes=[replace(blocks, keys=blocks.keys + 1000)])
    with pytest.raises(ValueError, match=r"keys must index rows in \[0, 120\)"):
        block_attention(*flat, bad, 1.5)


@pytest.mark.parametrize("alpha", [1.0, 1.5])
@pytest.mark.parametrize("wide", [True, False], ids=["wide", "no_wide"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_inference_calls_take_the_fused_kernel_and_training_calls_do_not(monkeypatch, causal, wide, alpha):
    """Without gradients, top-1 ids and no pattern on the CPU, the fused kernel runs wherever it was built
    with vectors, whether or not the 512-bit block products run (an AVX2 machine has none: on AVX2 the
    kernel is 1.3–2.0× the path it replaces); with gradients (the backward needs the probabilities) it does
    not, nor with two ids per token where their id sets hold too few queries each (here: the bound set out
    of reach), and the results agree either way."""
    called = []

    def recording(*args):
        called.append(args[3])
        return original(*args)

    original = torch_path.block_attention
    monkeypatch.setattr(torch_path, "block_attention", recording)
    # as on an AVX-512 machine, or an AVX2 one (whose non-causal softmax training calls take SDPA blocks)
    monkeypatch.setattr(torch_path, "wide_kernel", (lambda: object()) if wide else (lambda: None))
    monkeypatch.setattr(id_sets, "MIN_QUERIES_PER_CLASS", 10**9)
    (q, k, v), ids = _flat_problem(2, 150, 16, 16, 4, torch.float32, seed=11, split=False)
    with torch.no_grad():
        inference = bucketed_attention(q, k, v, *ids, alpha=alpha, causal=causal, backend="torch")
    assert len(called) == (1 if fused_kernel() is not None else 0)
    training = bucketed_attention(q.requires_grad_(), k, v, *ids, alpha=alpha, causal=causal, backend="torch")
    two_ids = torch.cat([ids[0], ids[0].flip(2)], -1)
    with torch.no_grad():
        bucketed_attention(q, k, v, two_ids, two_ids, alpha=alpha, causal=causal, backend="torch")
    assert len(called) == (1 if fused_kernel() is not None else 0)
    torch.testing.assert_close(inference, training.detach(), atol=2e-6, rtol=1e-4)
