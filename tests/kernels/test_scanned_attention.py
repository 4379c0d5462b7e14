"""The scanned C++ kernel (``attention_kernels/native/scanned_entmax.cpp``) against dense α-entmax attention,
in float64 — certified mode exact, approximate mode entmax over the predicted sets: outputs and gradients,
causal and not, padding, ragged tile and chunk edges, rows without keys, flat rows (every key in the support),
and chunks its bound rules out. The certified and approximate modes of
:func:`attention_kernels.indexed.attention.indexed_attention` run it on CPU (``backend="auto"``)."""

from __future__ import annotations

import pytest
import torch

from attention_kernels.indexed import scanned
from attention_kernels.indexed.attention import (
    dense_indexed_reference,
    index_needed,
    indexed_attention,
    predicted_sets,
)
from attention_kernels.indexed.scanned import scanned_attention, scanned_kernel

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        scanned_kernel(1.5, torch.zeros(1)) is None, reason="no C++ compiler or vectors narrower than AVX2"
    ),
]


def inputs(
    n: int, *, seed: int, m: int | None = None, d: int = 16, dv: int | None = None, spread: float = 2.0
):
    """q (2, 3, n, d), k (2, 3, m, d), v (2, 3, m, dv) in float64."""
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    q = spread * torch.randn(2, 3, n, d, generator=gen, dtype=torch.float64)
    k = spread * torch.randn(2, 3, m, d, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, m, d if dv is None else dv, generator=gen, dtype=torch.float64)
    return q, k, v


def padding(m: int, *, seed: int) -> torch.Tensor:
    """key_valid (2, m): some keys dropped, the second sequence's second half gone."""
    valid = torch.rand(2, m, generator=torch.Generator().manual_seed(seed)) > 0.25
    valid[1, (m + 1) // 2 :] = False
    return valid


def check_exact(q, k, v, *, alpha=1.5, causal=False, key_valid=None, scale=0.25) -> dict[str, float]:
    """Output and q, k, v gradients equal dense entmax's (float64 round-off); returns the kernel's counts."""
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    out, counts = scanned_attention(*inputs, alpha=alpha, causal=causal, key_valid=key_valid, scale=scale)
    ref_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = dense_indexed_reference(*ref_inputs, alpha=alpha, causal=causal, key_valid=key_valid, scale=scale)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * weight).sum(), ref_inputs)
    for name, g, rg in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(g, rg, atol=1e-11, rtol=1e-9, msg=f"gradient of {name}")
    return counts


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_equals_dense_entmax(alpha, causal, padded):
    """Sizes below, at and across the 48-query tiles and 128-key chunks."""
    for n, seed in ((1, 0), (47, 1), (129, 2), (300, 3)):
        q, k, v = inputs(n, seed=seed)
        check_exact(q, k, v, alpha=alpha, causal=causal, key_valid=padding(n, seed=seed) if padded else None)


def test_cross_attention_wide_heads_and_other_value_width():
    """n ≠ m, a head dim past the register path of the weighted sums (80), values of another width."""
    q, k, v = inputs(61, m=200, d=80, dv=7, seed=4, spread=0.6)
    check_exact(q, k, v, key_valid=padding(200, seed=4), scale=0.2)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_flat_rows_keep_every_key(alpha):
    """q = 0: every score is 0, every key is in the support (far more than a row's first trigger), p = 1/m."""
    _, k, v = inputs(300, seed=5)
    q = torch.zeros_like(k)
    counts = check_exact(q, k, v, alpha=alpha, causal=True)
    mean_keys = (torch.arange(300) + 1).double().mean()
    assert counts["kept_mean"] == pytest.approx(float(mean_keys))  # every causal key kept, none more


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_float32_keeps_every_key_of_flat_rows_and_matches_dense_entmax(alpha):
    """float32 has a filter of its own (AVX2: a permutation per vector in place of AVX-512's compress): on
    flat padded rows every valid causal key passes it, first from the scores, then again from the kept list
    each time the list is tightened; on scattered rows the output is dense entmax's to float round-off."""
    _, k, v = inputs(300, seed=5)
    k, v = k.float(), v.float()
    valid = padding(300, seed=5)
    q = torch.zeros_like(k)
    out, counts = scanned_attention(q, k, v, alpha=alpha, causal=True, key_valid=valid, scale=0.25)
    seen = valid.cumsum(-1)[:, None].expand(2, 3, 300)  # valid keys each query sees
    assert counts["kept_mean"] == pytest.approx(float(seen[seen > 0].double().mean()))
    mean_values = (v * valid[:, None, :, None]).cumsum(2) / seen.clamp(min=1)[..., None]
    torch.testing.assert_close(out, mean_values * (seen > 0)[..., None], atol=2e-6, rtol=2e-6)
    q, k, v = (x.float() for x in inputs(300, seed=10, d=32, spread=0.8))
    out, _ = scanned_attention(q, k, v, alpha=alpha, causal=True, key_valid=valid, scale=32**-0.5)
    ref = dense_indexed_reference(
        q.double(), k.double(), v.double(), alpha=alpha, causal=True, key_valid=valid, scale=32**-0.5
    )
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)


def test_kept_entries_hold_the_support_and_lie_within_beta_of_the_maximum():
    """support ⊆ kept ⊆ {s > m − β}: the kernel's running floor never passes the threshold."""
    q, k, v = inputs(256, seed=6, d=32, spread=0.7)
    _, counts = scanned_attention(q, k, v, alpha=1.5, causal=True, key_valid=None, scale=32**-0.5)
    scores = (q @ k.transpose(-1, -2)) * 32**-0.5
    scores = scores.masked_fill(~torch.ones(256, 256, dtype=torch.bool).tril(), float("-inf"))
    probs = dense_indexed_reference(
        q, k, torch.eye(256, dtype=q.dtype).expand(2, 3, 256, 256), causal=True, scale=32**-0.5
    )
    support = float((probs > 0).sum(-1).double().mean())
    near = float((scores > scores.amax(-1, keepdim=True) - 2.0).sum(-1).double().mean())
    assert support <= counts["kept_mean"] <= near
    assert counts["kept_mean"] < 0.5 * near  # flat rows: the floor rises well above m − β


def test_chunks_far_from_every_query_are_skipped_and_the_result_stays_exact():
    """Keys in two opposite clusters, queries facing the first: once the first cluster's keys set the running
    maximum, the bound rules out the chunks of the second."""
    gen = torch.Generator().manual_seed(7)
    direction = torch.randn(16, generator=gen, dtype=torch.float64)
    direction = 3 * direction / direction.norm()
    k = 0.1 * torch.randn(2, 3, 512, 16, generator=gen, dtype=torch.float64)
    k[..., :256, :] += direction
    k[..., 256:, :] -= direction
    q = direction + 0.1 * torch.randn(2, 3, 200, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, 512, 8, generator=gen, dtype=torch.float64)
    counts = check_exact(q, k, v, scale=1.0)
    assert counts["chunks_skipped"] >= 0.25  # at least one of the second cluster's two chunks per tile


def test_rows_without_keys_give_zeros_and_no_gradient():
    q, k, v = inputs(60, seed=8)
    valid = torch.ones(2, 60, dtype=torch.bool)
    valid[0] = False  # no key at all in the first sequence
    valid[1, :5] = False  # causal: the first five queries of the second see no valid key
    q = q.clone().requires_grad_()
    out, _ = scanned_attention(q, k, v, alpha=1.5, causal=True, key_valid=valid, scale=0.25)
    out.sum().backward()
    assert out[0].abs().max() == 0 and out[1, :, :5].abs().max() == 0
    assert q.grad[0].abs().max() == 0 and q.grad[1, :, :5].abs().max() == 0
    check_exact(q.detach(), k, v, causal=True, key_valid=valid)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lower_precision_computes_in_float32(dtype):
    q, k, v = (x.to(dtype) for x in inputs(150, seed=9))
    out, _ = scanned_attention(q, k, v, alpha=1.5, causal=True, key_valid=None, scale=0.25)
    assert out.dtype == dtype
    ref = dense_indexed_reference(q.double(), k.double(), v.double(), causal=True, scale=0.25)
    tolerance = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), ref, atol=tolerance, rtol=tolerance)


def test_repeated_calls_are_bitwise_equal():
    q, k, v = inputs(200, seed=10)
    results = []
    for _ in range(2):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, _ = scanned_attention(
            *leaves, alpha=1.5, causal=True, key_valid=padding(200, seed=10), scale=0.3
        )
        results.append([out, *torch.autograd.grad(out.square().sum(), leaves)])
    for first, second in zip(*results, strict=True):
        assert torch.equal(first, second)


def test_certified_mode_runs_the_scanned_kernel_on_cpu(monkeypatch):
    """indexed_attention's certified mode ("auto", CPU, α 1.5 or 2) is this kernel; α = 1.3, or a kernel that
    cannot be built, takes the block path, exact too."""
    q, k, v = inputs(100, seed=11)
    index = torch.zeros(2, 3, 100, 4, dtype=torch.float64)
    calls = []
    original = scanned.scanned_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr("attention_kernels.indexed.attention.scanned_attention", counted)
    ref = dense_indexed_reference(q, k, v, causal=True, scale=0.25)
    out, stats = indexed_attention(q, k, v, index, index, causal=True, scale=0.25, return_stats=True)
    assert len(calls) == 1 and stats["recomputed"] == 0
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    for alpha in (1.3,):
        indexed_attention(q, k, v, index, index, alpha=alpha, causal=True, scale=0.25)
    monkeypatch.setattr("attention_kernels.indexed.attention.scanned_kernel", lambda alpha, q: None)
    out = indexed_attention(q, k, v, index, index, causal=True, scale=0.25)
    assert len(calls) == 1  # neither α = 1.3 nor a missing kernel ran it
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


def test_certified_mode_on_this_kernel_needs_no_index(monkeypatch):
    """Certified mode on the scanned kernel reads no index: index_needed says so, and without one the
    output is exact. Where the index would be read (approximate mode, α = 1.3, backend "torch", no kernel),
    omitting it is a one-line ValueError."""
    q, k, v = inputs(70, seed=12)
    assert not index_needed(1.5, q, "certified")
    ref = dense_indexed_reference(q, k, v, causal=True, scale=0.25)
    torch.testing.assert_close(indexed_attention(q, k, v, None, None, causal=True, scale=0.25), ref)
    assert index_needed(1.5, q, "approximate") and index_needed(1.3, q, "certified")
    assert index_needed(1.5, q, "certified", backend="torch")
    for change, match in [
        ({"mode": "approximate"}, "mode 'approximate' needs q_index and k_index"),
        ({"alpha": 1.3}, "may be omitted only where the scanned CPU kernel runs"),
        ({"backend": "torch"}, "may be omitted only where the scanned CPU kernel runs"),
    ]:
        with pytest.raises(ValueError, match=match):
            indexed_attention(q, k, v, None, None, causal=True, scale=0.25, **change)
    monkeypatch.setattr("attention_kernels.indexed.attention.scanned_kernel", lambda alpha, q: None)
    assert index_needed(1.5, q, "certified")
    with pytest.raises(ValueError, match="may be omitted only"):
        indexed_attention(q, k, v, None, None, causal=True, scale=0.25)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("margin", "candidates"), [(0.0, 64), (0.3, 64), (2.0, 5)])
def test_approximate_is_entmax_over_the_predicted_sets(alpha, causal, margin, candidates):
    """Values and gradients of entmax with the exact scores over Ŝ (predicted_sets' definition: the low-rank
    threshold less the margin, the largest ``candidates`` where more; the cap cuts at (2.0, 5)), with padding
    and a noisy rank-6 indexer."""
    q, k, v = inputs(150, seed=12)
    gen = torch.Generator().manual_seed(13)
    basis = torch.randn(16, 6, generator=gen, dtype=torch.float64)
    qi = q @ basis + 0.5 * torch.randn(2, 3, 150, 6, generator=gen, dtype=torch.float64)
    ki = k @ basis
    valid = padding(150, seed=12)
    options = dict(alpha=alpha, causal=causal, key_valid=valid, scale=0.25)
    sets = predicted_sets(qi, ki, margin=margin, candidates=candidates, block=16, **options)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, counts = scanned_attention(*leaves, index=(qi, ki), margin=margin, candidates=candidates, **options)
    ref_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = dense_indexed_reference(*ref_leaves, allowed=sets, **options)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    weight = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), leaves)
    ref_grads = torch.autograd.grad((ref * weight).sum(), ref_leaves)
    for name, g, rg in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(g, rg, atol=1e-11, rtol=1e-9, msg=f"gradient of {name}")
    live = sets.any(-1)
    assert counts["kept_mean"] == pytest.approx(float(sets.sum(-1)[live].double().mean()))
    assert (counts["filled"] > 0) == (candidates == 5)
