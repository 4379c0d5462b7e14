"""Grouped-query attention (fewer key/value heads than query heads) in both backends of
``attention_kernels.bucketed.bucketed_attention``: values and, above all, dk and dv, which must sum over the
query heads that share a key/value head. The reference repeats k and v to every query head, which the backends
must not do.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the Triton kernels are decorated

from attention_kernels.bucketed import bucketed_attention, torch_path
from attention_kernels.bucketed.reference import dense_bucketed_attention
from tests.kernels.test_torch_bucketed import assert_close_to_truth, dense64

pytestmark = pytest.mark.usefixtures("one_thread")

# the Triton backend runs on CUDA tensors where a GPU is, else in the interpreter on CPU tensors
TRITON_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

CASES = [  # (n, m, heads, kv_heads, T, causal, window, global_tokens, alpha)
    (17, 17, 4, 2, 1, False, 0, 0, 1.5),
    (17, 17, 6, 2, 2, True, 3, 1, 1.0),
    (33, 33, 4, 1, 2, True, 5, 0, 1.5),
    (9, 40, 6, 3, 1, False, 0, 2, 2.0),
]


def grouped_inputs(n, m, heads, kv_heads, t, *, seed, dtype=torch.float32):
    """q (2, heads, n, 16), k and v (2, kv_heads, m, 16), per-query-head bucket ids in [−1, 4)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, n, 16, generator=gen, dtype=dtype)
    k, v = (torch.randn(2, kv_heads, m, 16, generator=gen, dtype=dtype) for _ in "kv")
    qb = torch.randint(-1, 4, (2, heads, n, t), generator=gen, dtype=torch.int32)
    kb = torch.randint(-1, 4, (2, heads, m, t), generator=gen, dtype=torch.int32)
    return q, k, v, qb, kb


def repeated(fn):
    """``fn`` with k and v repeated to every query head (what grouped-query attention means)."""

    def call(q, k, v, qb, kb, **opts):
        group = q.shape[1] // k.shape[1]
        return fn(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), qb, kb, **opts)

    return call


def grads(fn, q, k, v, qb, kb, opts, grad_out):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v, qb, kb, **opts)
    out.backward(grad_out.to(out.dtype))
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(
    ("n", "m", "heads", "kv_heads", "t", "causal", "window", "global_tokens", "alpha"), CASES
)
def test_grouped_keys_match_repeated_keys(
    backend, n, m, heads, kv_heads, t, causal, window, global_tokens, alpha
):
    q, k, v, qb, kb = grouped_inputs(n, m, heads, kv_heads, t, seed=n + heads + t)
    if backend == "triton":
        q, k, v, qb, kb = (x.to(TRITON_DEVICE) for x in (q, k, v, qb, kb))
    opts = dict(alpha=alpha, causal=causal, window=window, global_tokens=global_tokens)

    def ours(q, k, v, qb, kb, **opts):
        return bucketed_attention(q, k, v, qb, kb, backend=backend, **opts)

    grad_out = torch.randn(2, heads, n, 16, generator=torch.Generator().manual_seed(1)).to(q.device)
    mine = grads(ours, q, k, v, qb, kb, opts, grad_out)
    ref = grads(repeated(dense_bucketed_attention), q, k, v, qb, kb, opts, grad_out)
    truth = grads(repeated(dense64), q.double(), k.double(), v.double(), qb, kb, opts, grad_out)
    assert mine[2].shape == k.shape and mine[3].shape == v.shape  # gradients of the shared heads
    for got, want, exact in zip(mine, ref, truth, strict=True):
        assert_close_to_truth(got, want, exact)
    # the reference itself reads grouped keys and values as their copies per query head
    grouped = grads(dense_bucketed_attention, q, k, v, qb, kb, opts, grad_out)
    for got, want in zip(grouped, ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_torch_path_reads_each_key_where_it_is(monkeypatch):
    """The torch path's blocks index the kv_heads × m keys themselves: no row of a per-query-head copy."""
    q, k, v, qb, kb = grouped_inputs(17, 17, 6, 2, 2, seed=3)
    seen = {}
    original = torch_path.BucketBlockAttention.apply

    def spy(q_flat, k_flat, v_flat, plan, alpha):
        seen.update(k=k_flat, keys=max(int(c.keys.max()) for c in plan.classes), num_keys=plan.num_keys)
        return original(q_flat, k_flat, v_flat, plan, alpha)

    monkeypatch.setattr(torch_path.BucketBlockAttention, "apply", spy)
    bucketed_attention(q.requires_grad_(), k, v, qb, kb, window=3, backend="torch")
    assert seen["k"].shape == (2 * 2 * 17, 16) and seen["num_keys"] == 2 * 2 * 17
    assert 2 * 2 * 17 // 2 <= seen["keys"] < 2 * 2 * 17  # indices reach the second half, never beyond


def test_triton_path_broadcasts_keys_without_copying(monkeypatch):
    from attention_kernels.bucketed import triton_kernel

    q, k, v, qb, kb = (x.to(TRITON_DEVICE) for x in grouped_inputs(9, 9, 4, 1, 1, seed=5))
    seen = {}
    original = triton_kernel._BucketedAttention.apply

    def spy(q, k, v, qb, kb, cfg):
        seen.update(k=k, v=v)
        return original(q, k, v, qb, kb, cfg)

    monkeypatch.setattr(triton_kernel._BucketedAttention, "apply", spy)
    out = bucketed_attention(q, k, v, qb, kb, backend="triton")
    assert out.shape == q.shape
    for name, x in (("k", k), ("v", v)):
        assert seen[name].stride(1) == 0 and seen[name].data_ptr() == x.data_ptr(), name  # a view of the head


def test_heads_must_divide():
    q, k, v, qb, kb = grouped_inputs(9, 9, 4, 3, 1, seed=0)
    with pytest.raises(ValueError, match=r"k must be \(batch, kv_heads, m, d\) = \(2, a divisor of 4"):
        bucketed_attention(q, k, v, qb, kb)
