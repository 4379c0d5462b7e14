"""Triton forward of certified indexed attention against dense α-entmax attention.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py: fp32/fp16,
small shapes). Tolerances are derived as in test_triton_bucketed.py: the kernel and the dense reference, both
from inputs in the test dtype, are compared with a float64 evaluation, and the kernel may deviate by at most
``ERROR_FACTOR`` times the reference's own deviation (``ERROR_FACTOR`` eps of the dtype where the reference is
exact).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are decorated

from attention_kernels.indexed import attention as indexed_module
from attention_kernels.indexed import triton_kernel
from attention_kernels.indexed.attention import dense_indexed_reference, indexed_attention, predicted_sets
from benchmarks.attention import structured_inputs

pytestmark = pytest.mark.usefixtures("one_thread")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ERROR_FACTOR = 4.0
f32 = torch.float32


def random_inputs(
    n: int, *, seed: int, m: int | None = None, d: int = 16, r: int = 4, d_v: int | None = None
):
    """q, k, v (2, 2, n|m, d) in fp32 with a wide spread of scores, and an unrelated (garbage) indexer."""
    gen = torch.Generator().manual_seed(seed)
    m = n if m is None else m
    q = 2 * torch.randn(2, 2, n, d, generator=gen)
    k = 2 * torch.randn(2, 2, m, d, generator=gen)
    v = torch.randn(2, 2, m, d if d_v is None else d_v, generator=gen)
    qi = torch.randn(2, 2, n, r, generator=gen)
    ki = torch.randn(2, 2, m, r, generator=gen)
    return tuple(x.to(DEVICE) for x in (q, k, v, qi, ki))


def padding(batch: int, m: int, *, seed: int) -> torch.Tensor:
    """key_valid (batch, m): some keys dropped, the second sequence shortened."""
    valid = torch.rand(batch, m, generator=torch.Generator().manual_seed(seed)) > 0.25
    valid[1, (m + 1) // 2 :] = False
    return valid.to(DEVICE)


def run_triton(q, k, v, qi, ki, **options):
    return indexed_attention(q, k, v, qi, ki, backend="triton", return_stats=True, **options)


def check_matches_dense(q, k, v, qi, ki, **options) -> dict[str, float]:
    """The Triton output is within ERROR_FACTOR of the dense reference's own error; returns the stats."""
    dense_opts = {key: options[key] for key in ("alpha", "causal", "key_valid", "scale") if key in options}
    out, stats = run_triton(q, k, v, qi, ki, **options)
    assert out.dtype == q.dtype and out.shape == (*q.shape[:3], v.shape[-1])
    truth = dense_indexed_reference(q.double(), k.double(), v.double(), **dense_opts)
    ref_error = (dense_indexed_reference(q, k, v, **dense_opts).double() - truth).abs().max().item()
    error = (out.double() - truth).abs().max().item()
    tol = ERROR_FACTOR * max(ref_error, torch.finfo(q.dtype).eps)
    assert error <= tol, f"error {error:.3g} > {tol:.3g} (reference error {ref_error:.3g})"
    return stats


@pytest.mark.parametrize(
    ("alpha", "causal", "padded", "n", "block"),
    [
        (1.5, False, False, 45, 16),
        (1.5, True, True, 70, 16),
        (2.0, False, True, 70, 32),
        (2.0, True, False, 45, 16),
        (1.3, True, True, 45, 16),
        (2.5, False, True, 33, 16),  # α > 2: the bisection branch of the τ search
        (1.5, False, False, 1, 16),
        (2.0, True, True, 1, 16),
        (1.5, True, False, 17, 7),  # a requested block that is not a tile size
    ],
)
def test_certified_equals_dense(alpha, causal, padded, n, block):
    q, k, v, qi, ki = random_inputs(n, seed=n)
    valid = padding(2, n, seed=n) if padded else None
    check_matches_dense(q, k, v, qi, ki, alpha=alpha, causal=causal, key_valid=valid, block=block)


def test_cross_attention_other_value_width_and_strided_inputs():
    q, k, v, qi, ki = random_inputs(33, m=70, seed=4, d_v=5)
    q, k = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k))  # (b, n, h, d) storage
    assert not q.is_contiguous()
    check_matches_dense(q, k, v, qi, ki, key_valid=padding(2, 70, seed=4), block=16, scale=0.3)


@pytest.mark.parametrize(("alpha", "causal"), [(1.5, False), (2.0, True)])
def test_good_indexer_skips_most_blocks(alpha, causal):
    q, k, v, qi, ki = (x.to(DEVICE) for x in structured_inputs(1, 1, 192, 32, 8, seed=0))
    stats = check_matches_dense(q, k, v, qi, ki, alpha=alpha, causal=causal, block=16)
    assert stats["blocks_skipped"] > 0.6, stats
    assert stats["recomputed"] == 0 and stats["filled"] == 0, stats
    assert 0 < stats["predicted_mean"] < 4 * 16, stats
    assert {"indexer_s", "bounds_s", "sparse_s"} <= set(stats)


def test_nothing_skippable_when_every_key_is_in_the_support():
    """Equal scores (q = 0): every key has weight, so no block may be skipped."""
    _, k, v, qi, ki = random_inputs(40, seed=5)
    q = torch.zeros(2, 2, 40, 16, device=DEVICE)
    stats = check_matches_dense(q, k, v, qi, ki, causal=True, block=16)
    assert stats["blocks_skipped"] == 0


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_misleading_indexer_is_still_exact(alpha):
    """An indexer anti-correlated with the scores needs the wrong blocks: τ_S is low, the bounds keep the
    right blocks, and row groups are redone over them."""
    q, k, v, qi, ki = (x.to(DEVICE) for x in structured_inputs(1, 1, 128, 32, 8, seed=1))
    stats = check_matches_dense(q, k, v, -qi, ki, alpha=alpha, causal=True, block=16)
    assert stats["recomputed"] > 0.2, stats


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_exact_with_tight_bounds(alpha):
    """One valid key per block and d ≤ the bound's per-channel axes: each block's bound is its key's score
    (to round-off), so the skip test decides on its very margin. Local supports leave blocks to skip, and a
    misleading indexer makes τ_S < τ."""
    q, k, v, qi, ki = (x.to(DEVICE) for x in structured_inputs(2, 1, 128, 16, 4, seed=7))
    valid = torch.zeros(2, 128, dtype=torch.bool, device=DEVICE)
    valid[0, 5::16] = True
    valid[1, 11::16] = True
    for causal in (False, True):
        stats = check_matches_dense(
            q, k, v, 8 * qi, ki, alpha=alpha, causal=causal, key_valid=valid, block=16
        )
        assert stats["blocks_skipped"] > 0.2, stats


def test_rows_without_keys_give_zeros():
    q, k, v, qi, ki = random_inputs(20, seed=6)
    valid = torch.ones(2, 20, dtype=torch.bool, device=DEVICE)
    valid[0] = False  # no key at all in the first sequence
    valid[1, :5] = False  # causal: the first five queries of the second see no valid key
    out, _ = run_triton(q, k, v, qi, ki, causal=True, key_valid=valid, block=16)
    assert out[0].abs().max() == 0 and out[1, :, :5].abs().max() == 0
    check_matches_dense(q, k, v, qi, ki, causal=True, key_valid=valid, block=16)


def test_float16_inputs():
    q, k, v, qi, ki = (x.to(DEVICE, torch.float16) for x in structured_inputs(1, 2, 64, 32, 8, seed=2))
    check_matches_dense(q, k, v, qi, ki, causal=True, block=16)


@pytest.mark.parametrize("causal", [False, True])
def test_triton_equals_torch_backend(causal):
    q, k, v, qi, ki = (x.to(DEVICE) for x in structured_inputs(2, 1, 80, 32, 8, seed=3))
    qi = qi + 0.3 * torch.randn(qi.shape, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    valid = padding(2, 80, seed=3)
    options = dict(alpha=1.5, causal=causal, key_valid=valid, block=16)
    tri = indexed_attention(q, k, v, qi, ki, backend="triton", **options)
    ref = indexed_attention(q, k, v, qi, ki, backend="torch", **options)
    truth = dense_indexed_reference(
        q.double(), k.double(), v.double(), alpha=1.5, causal=causal, key_valid=valid
    )
    tol = 2 * ERROR_FACTOR * max((ref.double() - truth).abs().max().item(), torch.finfo(f32).eps)
    torch.testing.assert_close(tri, ref, atol=tol, rtol=0)


@pytest.mark.parametrize(("margin", "causal"), [(0.0, False), (0.3, True)])
def test_needed_blocks_hold_the_predicted_sets(margin, causal):
    """Pass 1's rule: every key block holding a member of Ŝ_i = {j : x′_ij ≥ τ′_i − margin} is needed by
    i's row group (L_i ≤ τ′_i), and LIVE marks exactly the queries with an allowed key."""
    _, _, _, qi, ki = random_inputs(45, seed=9)
    zeros = torch.zeros(2, 2, 45, 16, device=DEVICE)  # the exact scores play no part in pass 1
    valid = padding(2, 45, seed=9)
    options = dict(alpha=1.5, causal=causal, key_valid=valid, scale=0.7, margin=margin)
    passes = triton_kernel.certified_passes(zeros, zeros, zeros, qi, ki, block=16, **options)
    sets = predicted_sets(qi, ki, candidates=45, block=16, **options)  # (2, 2, 45, 45)
    B, nb = 16, passes.need.shape[1]
    padded = torch.nn.functional.pad(sets, (0, nb * B - 45, 0, nb * B - 45))
    holds = padded.view(4, nb, B, nb, B).any(-1).any(2).reshape(4 * nb, nb)
    assert not (holds & ~passes.need.bool()).any()
    live = valid[:, None, :].expand(2, 45, 45)
    if causal:
        live = live & torch.ones(45, 45, dtype=torch.bool, device=DEVICE).tril()
    live = live.any(-1).repeat_interleave(2, 0)  # (G, n)
    assert torch.equal(passes.live[:, :45].bool(), live)


# ----------------------------------------------------------------------------------------------- dispatch


def _args(dtype=torch.float32):
    return tuple(x.to(dtype) for x in random_inputs(8, seed=12))


@pytest.mark.parametrize(
    ("args", "options", "match"),
    [
        (_args(), {"backend": "cuda"}, "backend must be one of"),
        (_args(), {"backend": None}, "backend must be one of"),
        (_args(torch.float64), {"backend": "triton"}, "backend 'triton' takes float16"),
        (_args(), {"backend": "triton", "mode": "approximate"}, "runs mode 'certified' only"),
        (_args(), {"backend": "triton", "order": "clustered"}, "runs order 'position' only"),
    ],
)
def test_bad_backend_arguments_raise_one_line(args, options, match):
    with pytest.raises(ValueError, match=match) as err:
        indexed_attention(*args, **options)
    assert "\n" not in str(err.value)


def test_forced_triton_refuses_gradients_in_one_line():
    q, k, v, qi, ki = _args()
    q = q.requires_grad_()
    with pytest.raises(ValueError, match="forward-only") as err:
        indexed_attention(q, k, v, qi, ki, backend="triton")
    assert "\n" not in str(err.value)
    with torch.no_grad():  # inference with leaves that require gradients is fine
        indexed_attention(q, k, v, qi, ki, backend="triton")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors only")
def test_forced_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="needs CUDA tensors") as err:
        indexed_attention(*_args(), backend="triton")
    assert "\n" not in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors only")
def test_auto_never_runs_triton_on_cpu(monkeypatch):
    """On CPU tensors "auto" runs the scanned C++ kernel (or the PyTorch path), never the Triton forward; both
    CPU paths are exact, so they agree to round-off."""

    def refuse(*args, **kwargs):
        raise AssertionError("the Triton forward ran")

    monkeypatch.setattr(triton_kernel, "triton_indexed_attention", refuse)
    args = _args()
    torch.testing.assert_close(indexed_attention(*args), indexed_attention(*args, backend="torch"))


@pytest.mark.parametrize(
    ("mode", "order", "grads", "expected"),
    [
        ("certified", "position", False, "triton"),
        ("certified", "position", True, "torch"),
        ("approximate", "position", False, "torch"),
        ("certified", "clustered", False, "torch"),
    ],
)
def test_auto_chooses_triton_only_for_certified_inference(monkeypatch, mode, order, grads, expected):
    """On a device where "auto" would pick Triton (faked here), it falls back to torch for approximate mode,
    for the clustered order and when gradients are needed."""
    monkeypatch.setattr(indexed_module, "check_backend", lambda backend, q: "triton")
    q, k, v, _, _ = _args()
    q.requires_grad_(grads)
    assert indexed_module._resolve_backend("auto", q, k, v, mode, order) == expected
