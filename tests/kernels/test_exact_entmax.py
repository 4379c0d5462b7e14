"""The C++ exact α-entmax against its PyTorch reference and against entmax itself, and how it is built."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15, sparsemax

from kernels import native, torch_bucketed
from kernels.exact_entmax import exact_entmax
from kernels.torch_bucketed import _MASKED, _exact_thresholds, _SpreadRows

ENTMAX = {1.5: entmax15, 2.0: sparsemax}


def spread_parts(
    queries: int, width: int, *, seed: int, dtype: torch.dtype
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Three parts of rows (widths ``width``, ``width`` + 7 and 3; the first shaped (rows / 2, 2, width))
    owned in shuffled order by queries 1.. (query 0 has none), 1–4 rows each, some entries −inf, some
    ``_MASKED`` (as padding and causal masks leave them), queries 1 and 2 with no key at all, and ties."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 5, (queries,), generator=gen)
    counts[0] = 0
    owners = torch.repeat_interleave(torch.arange(queries), counts)
    owners = owners[torch.randperm(len(owners), generator=gen)]
    cuts = [len(owners) // 3 // 2 * 2, 2 * len(owners) // 3]
    owners = list(owners.tensor_split(cuts))
    owners[0] = owners[0].view(-1, 2)
    parts = []
    for owner, w in zip(owners, (width, width + 7, 3), strict=True):
        scores = (3 * torch.randn(*owner.shape, w, generator=gen)).to(dtype)
        scores[torch.rand(scores.shape, generator=gen) < 0.2] = -torch.inf
        scores[torch.rand(scores.shape, generator=gen) < 0.2] = _MASKED
        scores[owner == 1] = _MASKED  # a query with rows but no key
        scores[owner == 2] = -torch.inf
        scores[owner == 3, :2] = scores[owner == 3].amax(-1, keepdim=True)  # its maximum twice
        parts.append(scores)
    return parts, owners


def keys_of(parts: list[torch.Tensor], owners: list[torch.Tensor], query: int) -> torch.Tensor:
    return torch.cat([p[o == query].flatten() for p, o in zip(parts, owners, strict=True)])


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [1, 5, 16, 37, 64, 256])
def test_entmax_equals_the_reference_and_entmax_itself(alpha, dtype, width):
    queries = 40
    parts, owners = spread_parts(queries, width, seed=width, dtype=dtype)
    scores = [p.clone() for p in parts]
    shift, tau = exact_entmax(parts, owners, queries, alpha, write=True)
    ref_shift, ref_tau = _exact_thresholds(scores, alpha, _SpreadRows(owners, queries))
    assert torch.equal(shift, ref_shift)
    has_keys = torch.tensor(
        [bool((keys_of(scores, owners, i) > 0.5 * _MASKED).any()) for i in range(queries)]
    )
    assert not has_keys[:3].any() and has_keys.sum() > 30
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(tau[has_keys], ref_tau[has_keys], rtol=0, atol=16 * eps)  # τ of no key: any
    assert tau[0] == -1  # no rows
    for query in range(queries):  # the probabilities written over each query's scores are entmax of them
        s, p = keys_of(scores, owners, query), keys_of(parts, owners, query)
        on = s > 0.5 * _MASKED
        assert torch.equal(p[~on], torch.zeros_like(p[~on]))
        if on.any():
            torch.testing.assert_close(
                p[on].double(), ENTMAX[alpha](s[on].double(), dim=-1), rtol=0, atol=64 * eps
            )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [7, 16, 40])
def test_key_limits_equal_masked_scores_bit_for_bit(dtype, width):
    """Keys beyond a row's limit left out by the kernel (positions and limits, as causal blocks carry them)
    give exactly what scores masked by adding ``_MASKED`` give: the same m, τ and probabilities."""
    gen = torch.Generator().manual_seed(width)
    blocks, rows, queries = 6, 5, 13
    scores = torch.randn(blocks, rows, width, generator=gen, dtype=dtype)
    owners = torch.randint(0, queries, (blocks, rows), generator=gen)
    positions = torch.randint(0, 30, (blocks, width), generator=gen).float()
    positions[:, -1] = 2.0**41  # a padding key, beyond every limit
    limits = torch.randint(-1, 30, (blocks, rows), generator=gen).float()  # −1: a padding row
    beyond = (positions[:, None, :] - limits[..., None]).clamp(0, 1).to(dtype)
    masked = scores + beyond * _MASKED
    by_limits = scores.clone()
    found = exact_entmax([by_limits], [owners], queries, 1.5, write=True, limits=[(positions, limits)])
    expected = exact_entmax([masked], [owners], queries, 1.5, write=True)
    assert all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))
    assert torch.equal(by_limits, masked)
    assert (by_limits[beyond > 0] == 0).all() and (by_limits > 0).any()


def test_thresholds_alone_leave_the_scores_as_they_are():
    parts, owners = spread_parts(30, 20, seed=0, dtype=torch.float32)
    before = [p.clone() for p in parts]
    written = [p.clone() for p in parts]
    found = exact_entmax(parts, owners, 30, 1.5, write=False)
    assert all(torch.equal(a, b) for a, b in zip(parts, before, strict=True))
    again = exact_entmax(written, owners, 30, 1.5, write=True)
    assert all(torch.equal(a, b) for a, b in zip(found, again, strict=True))


def test_threads_change_nothing():
    parts, owners = spread_parts(3000, 48, seed=1, dtype=torch.float32)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            written = [p.clone() for p in parts]
            results.append([*exact_entmax(written, owners, 3000, 1.5, write=True), *written])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


@pytest.mark.parametrize(
    ("scores", "owners", "alpha", "message"),
    [
        (torch.randn(2, 4), torch.tensor([0, 3]), 1.5, r"owners must be queries in \[0, 3\); got \[0, 3\]"),
        (torch.randn(2, 4), torch.tensor([-1, 0]), 2.0, r"owners must be queries in \[0, 3\)"),
        (torch.randn(2, 4), torch.tensor([0, 1, 2]), 1.5, r"needs owners \(…\) of the same leading shape"),
        (torch.randn(4, 2).T, torch.tensor([0, 1]), 1.5, "must be contiguous"),
        (torch.randn(2, 4), torch.tensor([0, 1]), 1.3, "takes α = 1.5 or 2; got 1.3"),
    ],
)
def test_bad_arguments_are_refused(scores, owners, alpha, message):
    with pytest.raises(ValueError, match=message):
        exact_entmax([scores], [owners], 3, alpha, write=True)


def test_limits_of_the_wrong_shape_are_refused():
    scores, owners = torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"must be key positions \(blocks, W\) and row limits"):
        exact_entmax([scores], [owners], 1, 1.5, write=True, limits=[(torch.zeros(2, 3), torch.zeros(2, 3))])


def test_the_bucketed_path_runs_its_reference_where_no_library_can_be_built(monkeypatch):
    """Without the C++ kernel the bucketed path's α-entmax is the same attention."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=gen) for _ in range(3))
    ids = torch.randint(0, 3, (1, 2, 300, 1), generator=gen, dtype=torch.int32)
    run = lambda: torch_bucketed.torch_bucketed_attention(q, k, v, ids, ids, alpha=1.5, causal=True, radius=3)  # noqa: E731
    native_out = run()
    monkeypatch.setattr(torch_bucketed, "exact_entmax", lambda *args, **kwargs: None)
    torch.testing.assert_close(run(), native_out, rtol=0, atol=1e-6)


def test_a_library_is_built_once_into_its_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEFINDER_NATIVE_CACHE", str(tmp_path))
    native.library.cache_clear()
    try:
        assert native.library("exact_entmax") is not None
        [built] = tmp_path.iterdir()  # no temporary file left beside it
        assert built.name.startswith("exact_entmax-") and built.suffix == ".so"
        stamp = built.stat().st_mtime_ns
        native.library.cache_clear()
        assert native.library("exact_entmax") is not None
        assert built.stat().st_mtime_ns == stamp  # loaded, not rebuilt
    finally:
        native.library.cache_clear()


@pytest.mark.parametrize(
    ("compiler", "message"),
    [
        ("no-such-compiler", "exact_entmax could not be built.*no C\\+\\+ compiler 'no-such-compiler'"),
        ("false", "exact_entmax could not be built.*false exited with status 1"),  # a compiler that fails
    ],
)
def test_a_missing_or_failing_compiler_warns_and_gives_no_library(monkeypatch, tmp_path, compiler, message):
    monkeypatch.setenv("SPARSEFINDER_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", compiler)
    native.library.cache_clear()
    try:
        with pytest.warns(UserWarning, match=message):
            assert native.library("exact_entmax") is None
        assert list(tmp_path.iterdir()) == []  # nothing half-written
    finally:
        native.library.cache_clear()
