"""Whole-row softmax (not causal, one id per query, no pattern) runs as blocks of SDPA where the block
products have no wide kernel and the fused kernel does not take the call (gradients asked for, or no
vectors): the same values and gradients as the dense reference, padding keys weighted exactly 0, and the
other cases left to the block path; with the wide kernel, the block path."""

from __future__ import annotations

import pytest
import torch

from attention_kernels.bucketed import torch_path
from benchmarks.attention import balanced_buckets
from tests.kernels.test_torch_bucketed import (
    _grads,
    assert_close_to_truth,
    attended_mask,
    dense64,
    dense_bucketed_attention,
    entmax_normalize,
    make_inputs,
    torch_bucketed_attention,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The query shapes of every SDPA call the PyTorch path makes while the test runs, on a machine where
    the block products have no wide kernel (where they have, they beat SDPA)."""
    monkeypatch.setattr(torch_path, "wide_kernel", lambda: None)
    calls = []
    sdpa = torch_path.F.scaled_dot_product_attention

    def counting(q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(torch_path.F, "scaled_dot_product_attention", counting)
    return calls


@pytest.mark.parametrize(("n", "m"), [(2, 9), (37, 37), (130, 65), (257, 300)])
@pytest.mark.parametrize("t_keys", [1, 2])
def test_values_and_gradients_match_reference(n, m, t_keys, sdpa_calls):
    """Random buckets of uneven sizes (so blocks pad their keys), some tokens in none; keys may hold two."""
    q, k, v, qb, _ = make_inputs(n, 32, 1, seed=n + m, m=m)
    kb = torch.randint(
        -1, 5, (2, 2, m, t_keys), generator=torch.Generator().manual_seed(m), dtype=torch.int32
    )
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    opts = dict(alpha=1.0)
    ours = _grads(torch_bucketed_attention, q, k, v, qb, kb, opts, grad_out)
    assert sdpa_calls  # the SDPA blocks ran
    ref = _grads(dense_bucketed_attention, q, k, v, qb, kb, opts, grad_out)
    truth = _grads(dense64, q.double(), k.double(), v.double(), qb, kb, opts, grad_out)
    with torch.no_grad():
        assert_close_to_truth(
            torch_bucketed_attention(q, k, v, qb, kb, **opts),
            dense_bucketed_attention(q, k, v, qb, kb, **opts),
            dense64(q, k, v, qb, kb, **opts),
        )
    for g_ours, g_ref, g_truth in zip(ours, ref, truth, strict=True):
        assert_close_to_truth(g_ours, g_ref, g_truth)


def test_a_bucket_is_one_block_row(sdpa_calls):
    """Balanced buckets of 96 queries: one class of whole buckets, one call, no padding (a training call:
    without gradients the fused kernel takes it, where it was built)."""
    n, heads, buckets = 384, 2, 4
    ids = balanced_buckets(1, heads, n, buckets, 1, seed=0)
    q, k, v = torch.randn(3, 1, heads, n, 16, generator=torch.Generator().manual_seed(0)).unbind(0)
    torch_bucketed_attention(q.requires_grad_(), k, v, ids, ids, alpha=1.0)
    assert sdpa_calls == [(heads * buckets, 1, n // buckets, 16)]


@pytest.mark.parametrize(
    "opts",
    [
        {"alpha": 1.5},
        {"alpha": 1.0, "causal": True},
        {"alpha": 1.0, "window": 3},
        {"alpha": 1.0, "global_tokens": 1},
        {"alpha": 1.0, "t": 2},
    ],
    ids=["entmax", "causal", "window", "global", "two-ids"],
)
def test_other_cases_take_the_block_path(opts, sdpa_calls):
    opts = dict(opts)
    q, k, v, qb, kb = make_inputs(40, 16, opts.pop("t", 1), seed=5)
    out = torch_bucketed_attention(q, k, v, qb, kb, **opts)
    assert not sdpa_calls
    torch.testing.assert_close(out.double(), dense64(q, k, v, qb, kb, **opts), rtol=1e-4, atol=1e-5)


def test_values_of_another_size_take_the_block_path(sdpa_calls):
    """SDPA's fast kernel wants one head size for q, k and v; the internal entry allows v its own."""
    q, k, _, qb, kb = make_inputs(40, 16, 1, seed=5)
    v = torch.randn(*k.shape[:-1], 8, generator=torch.Generator().manual_seed(6))
    out = torch_path.torch_bucketed_attention(q, k, v, qb, kb, alpha=1.0)
    assert not sdpa_calls
    torch.testing.assert_close(out.double(), dense64(q, k, v, qb, kb, alpha=1.0), rtol=1e-4, atol=1e-5)


def test_with_the_wide_block_products_whole_buckets_take_the_block_path(monkeypatch):
    """They beat SDPA's flash kernel on such blocks; the values and gradients are the reference's.

    Where they were not built (no AVX-512), the dispatch is told they were: the block path then multiplies
    with ``bmm``, so the rule and the block path's results are tested on every machine."""
    if torch_path.wide_kernel() is None:
        monkeypatch.setattr(torch_path, "wide_kernel", lambda: "the wide library")
    calls = []
    monkeypatch.setattr(torch_path.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1))
    q, k, v, qb, kb = make_inputs(130, 32, 1, seed=7)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
    ours = _grads(torch_bucketed_attention, q, k, v, qb, kb, {"alpha": 1.0}, grad_out)
    assert not calls
    ref = _grads(dense_bucketed_attention, q, k, v, qb, kb, {"alpha": 1.0}, grad_out)
    truth = _grads(dense64, q.double(), k.double(), v.double(), qb, kb, {"alpha": 1.0}, grad_out)
    for g_ours, g_ref, g_truth in zip(ours, ref, truth, strict=True):
        assert_close_to_truth(g_ours, g_ref, g_truth)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_blocks_keep_padding_out_down_to_small_scales(dtype):
    """The blocks in the inputs' half precision (as on CUDA, for the flash kernel): the sentinel's score is
    256 · scale times the dtype's lowest where −1e30 does not fit, the scale is SDPA's, and padding keys
    still weigh 0 down to a scale of 1e-4 (their weight would pull the output past half-precision
    rounding)."""
    q, k, v, qb, kb = make_inputs(70, 16, 1, seed=8, m=90)
    plan = torch_path.plan_attention(qb, kb, whole_buckets=True)
    assert any(blocks.mask is not None for blocks in plan.classes)  # uneven buckets: padded blocks
    for scale in (0.25, 1e-4):
        out = torch_path._whole_rows_sdpa(
            q.to(dtype).reshape(-1, 16), k.to(dtype).reshape(-1, 16), v.to(dtype).reshape(-1, 16), plan, scale
        )
        assert out.dtype == dtype
        mask = attended_mask(qb, kb)
        scores = (q.to(dtype).double() @ k.to(dtype).double().transpose(-1, -2)) * scale
        truth = entmax_normalize(scores.masked_fill(~mask, float("-inf")), 1.0) @ v.to(dtype).double()
        truth = truth.masked_fill(~mask.any(-1, keepdim=True), 0.0)  # queries with no key: zeros
        torch.testing.assert_close(
            out.double().view(truth.shape), truth, rtol=0, atol=8 * torch.finfo(dtype).eps
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_half_precision_blocks_run_in_their_dtype(monkeypatch):
    """On CUDA the blocks keep bf16 (flash attention takes no float32) and match the float64 truth to bf16
    rounding, padding included."""
    dtypes = []
    sdpa = torch_path.F.scaled_dot_product_attention
    monkeypatch.setattr(
        torch_path.F,
        "scaled_dot_product_attention",
        lambda q, *a, **kw: dtypes.append(q.dtype) or sdpa(q, *a, **kw),
    )
    q, k, v, qb, kb = make_inputs(300, 64, 1, seed=9, m=260)
    cuda = [x.cuda() for x in (q, k, v, qb, kb)]
    out = torch_bucketed_attention(*(x.bfloat16() if x.is_floating_point() else x for x in cuda), alpha=1.0)
    assert out.dtype == torch.bfloat16 and dtypes and set(dtypes) == {torch.bfloat16}
    truth = dense64(*(x.bfloat16().double() for x in (q, k, v)), qb, kb, alpha=1.0)
    torch.testing.assert_close(out.double().cpu(), truth, rtol=0, atol=0.05)
