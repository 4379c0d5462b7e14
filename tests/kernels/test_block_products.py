"""The C++ block products (attention_kernels.bucketed.block_products) against gathered rows' bmm."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from attention_kernels.bucketed import block_products, torch_path
from attention_kernels.bucketed.block_products import block_outputs, block_scores, wide_kernel
from attention_kernels.bucketed.planning import take
from attention_kernels.native import call


def _has_compiler() -> bool:
    """The C++ compiler attention_kernels.native builds with: where every C++ kernel must exist."""
    return shutil.which(os.environ.get("CXX") or "c++") is not None


def _cpu_flags() -> set[str]:
    """The processor's feature flags (Linux; none elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return {flag for line in lines if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


_FLAGS = _cpu_flags()
needs_compiler = pytest.mark.skipif(not _has_compiler(), reason="no C++ compiler")
needs_wide = pytest.mark.skipif(
    not _has_compiler() or "avx512f" not in _FLAGS, reason="no C++ compiler, or no AVX-512"
)
"""Where the block products must run in C++."""
needs_vectors = pytest.mark.skipif(
    not _has_compiler() or not ("avx512f" in _FLAGS or {"avx2", "fma"} <= _FLAGS),
    reason="no C++ compiler, or neither AVX-512 nor AVX2 with FMA",
)
"""Where the predictor maps must run in C++."""


@needs_wide
def test_the_wide_kernel_is_built_where_it_can_run():
    """Else every test below would compare the batched matmul with itself."""
    assert wide_kernel() is not None


def _inputs(blocks: int, rows: int, cols: int, depth: int, dtype: torch.dtype, seed: int):
    """x (40, depth), y (50, depth), row and column indices with repeats, probabilities (blocks, rows, cols)
    with zeros, as the forward leaves them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(40, depth, generator=gen, dtype=dtype)
    y = torch.randn(50, depth, generator=gen, dtype=dtype)
    row_index = torch.randint(0, 40, (blocks, rows), generator=gen)
    col_index = torch.randint(0, 50, (blocks, cols), generator=gen)
    probs = torch.rand(blocks, rows, cols, generator=gen, dtype=dtype)
    probs[probs < 0.4] = 0
    return x, y, row_index, col_index, probs


def _products(x, y, row_index, col_index, probs) -> list[torch.Tensor]:
    """Scores x·yᵀ, outputs p·y and pᵀ·x of the blocks."""
    scores = torch.full((*row_index.shape, col_index.shape[1]), torch.nan, dtype=x.dtype)
    return [
        block_scores(x, y, row_index, col_index, scores),
        block_outputs(probs, y, col_index),
        block_outputs(probs, x, row_index, transpose=True),
    ]


def _reference(x, y, row_index, col_index, probs) -> list[torch.Tensor]:
    """The same by batched matmuls of the gathered rows."""
    return [
        torch.bmm(take(x, row_index), take(y, col_index).mT),
        torch.bmm(probs, take(y, col_index)),
        torch.bmm(probs.mT, take(x, row_index)),
    ]


# around the kernel's tiles: rows in tiles of 6, columns in strips of 4 vectors of 16 floats (8 doubles)
SHAPES = [
    (0, 3, 5, 8),
    (1, 1, 1, 1),
    (3, 5, 3, 7),
    (2, 6, 16, 16),
    (2, 7, 17, 33),
    (4, 13, 40, 64),
    (2, 64, 72, 64),
]


@needs_wide
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("blocks, rows, cols, depth", SHAPES)
def test_scores_and_outputs_equal_the_batched_matmul(dtype, blocks, rows, cols, depth):
    x, y, row_index, col_index, probs = _inputs(blocks, rows, cols, depth, dtype, seed=rows * cols + depth)
    tol = dict(rtol=0, atol=64 * torch.finfo(dtype).eps * max(depth, cols, rows) ** 0.5)
    found = _products(x, y, row_index, col_index, probs)
    assert [t.shape for t in found] == [(blocks, rows, cols), (blocks, rows, depth), (blocks, cols, depth)]
    for got, want in zip(found, _reference(x, y, row_index, col_index, probs), strict=True):
        torch.testing.assert_close(got, want, **tol)


@needs_wide
def test_results_do_not_depend_on_the_number_of_threads():
    inputs = _inputs(9, 20, 70, 64, torch.float32, seed=1)
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            results.append(_products(*inputs))
    finally:
        torch.set_num_threads(threads)
    for one, three in zip(*results, strict=True):
        assert torch.equal(one, three)


def test_without_the_kernel_the_batched_matmul_runs(monkeypatch):
    """No compiler (or tensors the kernel does not take: here non-contiguous ones): the reference, bit for
    bit."""
    x, y, row_index, col_index, probs = _inputs(3, 7, 17, 33, torch.float32, seed=2)
    expected = _reference(x, y, row_index, col_index, probs)
    strided = [t.mT.contiguous().mT for t in (x, y, probs)]
    assert not any(t.is_contiguous() for t in strided)
    for got, want in zip(_products(*strided[:2], row_index, col_index, strided[2]), expected, strict=True):
        assert torch.equal(got, want)
    monkeypatch.setattr(block_products, "library", lambda name: None)
    for got, want in zip(_products(x, y, row_index, col_index, probs), expected, strict=True):
        assert torch.equal(got, want)


@needs_wide
def test_indices_outside_their_tensor_or_not_integers_are_refused():
    """The kernel reads through the indices unchecked: the wrapper checks them."""
    x, y, row_index, col_index, probs = _inputs(2, 3, 4, 8, torch.float32, seed=3)
    col_index[1, 2] = 50
    with pytest.raises(ValueError, match=r"cols must index rows in \[0, 50\); got \[\d+, 50\]"):
        block_scores(x, y, row_index, col_index, torch.empty(2, 3, 4))
    with pytest.raises(ValueError, match=r"index must index rows in \[0, 50\)"):
        block_outputs(probs, y, col_index)
    row_index[0, 0] = -1
    with pytest.raises(ValueError, match=r"index must index rows in \[0, 40\); got \[-1, "):
        block_outputs(probs, x, row_index, transpose=True)
    with pytest.raises(ValueError, match=r"rows must hold integer row numbers; got torch\.float32"):
        block_scores(x, y, row_index.float(), col_index, torch.empty(2, 3, 4))
    with pytest.raises(ValueError, match="index must be on the CPU, as the tensors it indexes; got meta"):
        block_outputs(probs, y, col_index.to("meta"))


def test_shapes_that_do_not_fit_are_refused():
    x, y, row_index, col_index, probs = _inputs(2, 3, 4, 8, torch.float32, seed=4)
    with pytest.raises(ValueError, match=r"out \(blocks, L, M\) contiguous; got .*out \(2, 4, 3\)"):
        block_scores(x, y, row_index, col_index, torch.empty(2, 4, 3))
    with pytest.raises(ValueError, match=r"got .*rows \(2, 3\), cols \(1, 4\)"):  # fewer blocks of keys
        block_scores(x, y, row_index, col_index[:1], torch.empty(2, 3, 4))
    with pytest.raises(ValueError, match=r"got x \(40, 8, 1\)"):
        block_scores(x[..., None], y, row_index, col_index, torch.empty(2, 3, 4))
    with pytest.raises(ValueError, match=r"index \(blocks, L\); got .*index \(2, 4\)"):
        block_outputs(probs, x, col_index, transpose=True)


@needs_wide
def test_running_out_of_memory_is_a_memory_error():
    """Inside the kernel's threads (where an exception may not leave): a MemoryError in Python, not an abort.
    No block, so nothing is read; a tile of 2⁴⁴ rows asks for more row pointers than any machine has."""
    x, y, row_index, col_index, _ = _inputs(0, 1, 1, 8, torch.float32, seed=6)
    out = torch.empty(0)
    with pytest.raises(MemoryError, match="block_scores_float ran out of memory"):
        call(wide_kernel(), "block_scores_float", x, y, row_index, col_index, 0, 2**44, 1, 8, out)


@pytest.mark.parametrize(
    ("alpha", "pattern"), [(1.0, {}), (1.5, {"causal": True, "radius": 2, "global_tokens": 1})]
)
def test_attention_through_the_batched_matmul_is_the_same(alpha, pattern, monkeypatch):
    """Where the wide kernel cannot run (no AVX-512: the C++ normaliser still runs), attention forward and
    backward through the batched matmul agree with attention through the kernel, and with float64."""
    from tests.kernels.test_torch_bucketed import _grads, dense64, make_inputs

    q, k, v, qb, kb = make_inputs(70, 32, 2, seed=11)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(12))

    def attend(q, k, v, qb, kb):
        return torch_path.torch_bucketed_attention(q, k, v, qb, kb, alpha=alpha, **pattern)

    def run() -> list[torch.Tensor]:
        with torch.no_grad():
            out = attend(q, k, v, qb, kb)
        return [out, *_grads(attend, q, k, v, qb, kb, {}, grad_out)]

    wide = run()
    for module in (block_products, torch_path):
        monkeypatch.setattr(module, "wide_kernel", lambda: None)
    narrow = run()
    for got, want in zip(narrow, wide, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    window = 2 * pattern["radius"] + 1 if pattern else 0
    opts = dict(causal=bool(pattern), window=window, global_tokens=pattern.get("global_tokens", 0))
    torch.testing.assert_close(
        narrow[0].double(), dense64(q, k, v, qb, kb, alpha=alpha, **opts), rtol=1e-4, atol=1e-5
    )
