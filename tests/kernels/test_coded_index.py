"""The approximate indexer's 7-bit grid (:mod:`attention_kernels.index_grid`) and the scanned kernel's
integer scores on its codes (``attention_kernels/native/coded_product.h``): in float32 the coded scan finds
the same predicted sets as the scan over the grid's floats, and both are entmax over ``predicted_sets``."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from attention_kernels import native
from attention_kernels.index_grid import LEVELS, on_grid
from attention_kernels.indexed.attention import dense_indexed_reference, predicted_sets
from attention_kernels.indexed.scanned import scanned_attention, scanned_kernel

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(
        scanned_kernel(1.5, torch.zeros(1)) is None, reason="no C++ compiler or vectors narrower than AVX2"
    ),
]


def test_each_row_lies_on_its_own_grid():
    """Per row: step = max|x|/63, x/step an integer in [−63, 63] (the largest entry exactly ±63), every entry
    within half a step of the input; a zero row stays zero; coding a coded row finds the same codes."""
    x = (
        torch.randn(3, 50, 24, generator=torch.Generator().manual_seed(1))
        * torch.logspace(-3, 3, 50)[:, None]
    )
    x[1, 7] = 0.0
    grid = on_grid(x)
    step = x.abs().amax(-1, keepdim=True) / LEVELS
    step = torch.where(step > 0, step, torch.ones_like(step))
    codes = grid / step
    torch.testing.assert_close(codes, codes.round(), atol=1e-4, rtol=0)
    assert codes.abs().round().amax(-1).eq(LEVELS).sum() == 3 * 50 - 1  # all but the zero row reach ±63
    assert ((grid - x).abs() <= step / 2 * (1 + 1e-6)).all()
    assert grid[1, 7].eq(0).all()
    again = on_grid(grid)
    assert torch.equal((again / step).round(), codes.round())
    torch.testing.assert_close(again, grid, atol=0, rtol=1e-6)


def low_rank_problem(n: int, *, seed: int, rank: int, signs: bool = False):
    """q, k, v (2, 3, n, 32) float32, a noisy rank-``rank`` index of them, and key_valid (2, n) with padding.
    ``signs``: every index entry ±(its row's largest), so every code is ±63 (the 16-bit sums' extremes)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (2 * torch.randn(2, 3, n, 32, generator=gen) for _ in range(3))
    basis = torch.randn(32, rank, generator=gen) / 4
    qi = q @ basis + 0.3 * torch.randn(2, 3, n, rank, generator=gen)
    ki = k @ basis
    if signs:
        qi, ki = qi.sign() * qi.abs().amax(-1, keepdim=True), ki.sign() * 0.3
    valid = torch.rand(2, n, generator=gen) > 0.2
    valid[1, n // 2 :] = False
    return (q, k, v), (qi, ki), valid


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("rank", "margin", "signs"), [(24, 0.0, False), (6, 0.3, False), (13, 0.1, True)])
def test_coded_scores_find_the_sets_of_the_grids_floats(alpha, causal, rank, margin, signs):
    """Outputs, gradients and |Ŝ| of the coded scan equal the float scan's on the same grid (float32; ranks
    a whole pair of quads, a padded one and an odd one; tiles and chunks with ragged edges)."""
    (q, k, v), index, valid = low_rank_problem(203, seed=rank, rank=rank, signs=signs)
    options = dict(alpha=alpha, causal=causal, key_valid=valid, scale=32**-0.5, index=index, margin=margin)
    results = []
    for coded in (True, False):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, counts = scanned_attention(*leaves, candidates=64, coded=coded, **options)
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, 32)).sum(), leaves)
        results.append((out, counts, grads))
    (out, counts, grads), (float_out, float_counts, float_grads) = results
    assert counts["kept_mean"] == float_counts["kept_mean"] and counts["filled"] == float_counts["filled"]
    torch.testing.assert_close(out, float_out, atol=1e-6, rtol=1e-5)
    for name, g, fg in zip("qkv", grads, float_grads, strict=True):
        torch.testing.assert_close(g, fg, atol=1e-5, rtol=1e-4, msg=f"gradient of {name}")


@pytest.mark.parametrize("causal", [False, True])
def test_coded_scan_is_entmax_over_the_predicted_sets(causal):
    """The float32 coded kernel against dense entmax (float64) over ``predicted_sets`` of the same index."""
    (q, k, v), (qi, ki), valid = low_rank_problem(150, seed=4, rank=12)
    options = dict(alpha=1.5, causal=causal, key_valid=valid, scale=32**-0.5)
    out, counts = scanned_attention(q, k, v, index=(qi, ki), margin=0.2, candidates=64, **options)
    sets = predicted_sets(qi.double(), ki.double(), margin=0.2, candidates=64, block=16, **options)
    ref = dense_indexed_reference(q.double(), k.double(), v.double(), allowed=sets, **options)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
    live = sets.any(-1)
    assert counts["kept_mean"] == pytest.approx(float(sets.sum(-1)[live].double().mean()))


def _defines_vnni(compiler: str) -> bool:
    """Whether ``compiler`` with the kernels' -march=native defines __AVX512VNNI__ (False where it fails)."""
    try:
        macros = subprocess.run(
            [compiler, "-march=native", "-dM", "-E", "-x", "c++", "/dev/null"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return "__AVX512VNNI__" in macros


def test_vnni_and_avx2_tiles_give_the_same_scores_bit_for_bit(monkeypatch, tmp_path):
    """The coded product's VNNI tile (vpdpbusd, 32-bit sums) and its AVX2 tile (vpmaddubsw, 16-bit pair sums
    widened) sum the same exact integers: built once as the machine allows and once with VNNI switched off,
    the approximate scan gives the same outputs, |Ŝ| and gradients, bit for bit (codes at ±63 included)."""
    compiler = os.environ.get("CXX") or "c++"
    if not _defines_vnni(compiler):
        pytest.skip("the compiler defines no __AVX512VNNI__ for this processor")
    without = tmp_path / "c++-without-vnni"
    without.write_text(f'#!/bin/sh\nexec {compiler} "$@" -mno-avx512vnni\n')
    without.chmod(0o755)
    assert not _defines_vnni(str(without))
    (q, k, v), index, valid = low_rank_problem(203, seed=2, rank=13, signs=True)
    options = dict(alpha=1.5, causal=True, key_valid=valid, scale=32**-0.5, index=index, margin=0.1)

    def scan() -> tuple[torch.Tensor, dict[str, float], tuple[torch.Tensor, ...]]:
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, counts = scanned_attention(*leaves, candidates=64, **options)
        return out, counts, torch.autograd.grad((out * torch.linspace(-1, 1, 32)).sum(), leaves)

    monkeypatch.setenv("SPARSEFINDER_NATIVE_CACHE", str(tmp_path / "cache"))
    native.library.cache_clear()
    try:
        vnni = scan()
        monkeypatch.setenv("CXX", str(without))
        native.library.cache_clear()
        avx2 = scan()
    finally:
        native.library.cache_clear()
    assert len(list((tmp_path / "cache").glob("scanned_entmax-*.so"))) == 2  # two builds, not one reused
    assert torch.equal(vnni[0], avx2[0]) and vnni[1] == avx2[1]
    for name, g, g_avx2 in zip("qkv", vnni[2], avx2[2], strict=True):
        assert torch.equal(g, g_avx2), f"gradient of {name}"
