"""The C++ threshold search against its PyTorch reference and against entmax itself, and how it is built."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15, sparsemax

from kernels import native, torch_bucketed
from kernels.entmax_threshold import query_thresholds
from kernels.torch_bucketed import _MASKED, _SpreadRows, _support_threshold

ENTMAX = {1.5: entmax15, 2.0: sparsemax}


def spread_pieces(
    queries: int, width: int, *, seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pieces (P, width) owned in shuffled order by queries 1.. (query 0 has none), 1–4 pieces each, some
    entries −inf, some ``_MASKED`` (as padding and causal masks leave them), a few queries with no key at
    all, and ties."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 5, (queries,), generator=gen)
    counts[0] = 0
    owners = torch.repeat_interleave(torch.arange(queries), counts)
    owners = owners[torch.randperm(len(owners), generator=gen)]
    pieces = (3 * torch.randn(len(owners), width, generator=gen)).to(dtype)
    pieces[torch.rand(pieces.shape, generator=gen) < 0.2] = -torch.inf
    pieces[torch.rand(pieces.shape, generator=gen) < 0.2] = _MASKED
    pieces[owners == 1] = _MASKED  # a query with pieces but no key
    pieces[owners == 2] = -torch.inf
    pieces[owners == 3, :2] = pieces[owners == 3].amax(-1, keepdim=True)  # its maximum twice
    return pieces, owners


def reference(pieces: torch.Tensor, owners: torch.Tensor, queries: int, alpha: float):
    """m and τ per query by the PyTorch search (a query without keys: m = 0)."""
    rows = _SpreadRows([owners], queries)
    top = torch.full((queries,), _MASKED, dtype=pieces.dtype).scatter_reduce(
        0, owners, pieces.amax(-1), "amax"
    )
    shift = top.masked_fill(top <= 0.5 * _MASKED, 0.0)
    start = torch.full_like(shift, -1.0)
    return shift, _support_threshold([pieces], shift, alpha, rows, start, check_first=False)


@pytest.mark.parametrize("alpha", [1.5, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [1, 5, 16, 37, 64, 256])
def test_thresholds_equal_the_reference_and_make_entmax(alpha, dtype, width):
    queries = 40
    pieces, owners = spread_pieces(queries, width, seed=width, dtype=dtype)
    shift, tau = query_thresholds(pieces, owners, queries, alpha)
    ref_shift, ref_tau = reference(pieces, owners, queries, alpha)
    assert torch.equal(shift, ref_shift)
    with_keys = owners[(pieces > 0.5 * _MASKED).any(-1)]
    has_keys = torch.zeros(queries, dtype=torch.bool).index_fill_(0, with_keys, True)
    assert not has_keys[:3].any() and has_keys.sum() > 30
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(tau[has_keys], ref_tau[has_keys], rtol=0, atol=16 * eps)  # τ of no key: any
    assert tau[0] == -1  # no pieces
    scale = alpha - 1.0
    for query in range(queries):  # p over each query's keys is entmax of its scores
        scores = pieces[owners == query].flatten()
        keys = scores[scores > 0.5 * _MASKED]
        if len(keys) == 0:
            continue
        p = (scale * (keys - shift[query]) - tau[query]).clamp_min(0) ** (1 / scale)
        torch.testing.assert_close(p.double(), ENTMAX[alpha](keys.double(), dim=-1), rtol=0, atol=64 * eps)


def test_threads_change_nothing():
    pieces, owners = spread_pieces(3000, 48, seed=1, dtype=torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = query_thresholds(pieces, owners, 3000, 1.5)
        torch.set_num_threads(2)
        two = query_thresholds(pieces, owners, 3000, 1.5)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


@pytest.mark.parametrize(
    ("owners", "alpha", "message"),
    [
        (torch.tensor([0, 3]), 1.5, r"owners must be queries in \[0, 3\); got \[0, 3\]"),
        (torch.tensor([-1, 0]), 2.0, r"owners must be queries in \[0, 3\)"),
        (torch.tensor([0, 1, 2]), 1.5, r"pieces must be \(P, W\) and owners \(P,\)"),
        (torch.tensor([0, 1]), 1.3, "takes α = 1.5 or 2; got 1.3"),
    ],
)
def test_bad_arguments_are_refused(owners, alpha, message):
    with pytest.raises(ValueError, match=message):
        query_thresholds(torch.randn(2, 4), owners, 3, alpha)


def test_the_bucketed_path_runs_its_reference_where_no_library_can_be_built(monkeypatch):
    """Without the C++ kernel the bucketed path's α-entmax is the same attention."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=gen) for _ in range(3))
    ids = torch.randint(0, 3, (1, 2, 300, 1), generator=gen, dtype=torch.int32)
    run = lambda: torch_bucketed.torch_bucketed_attention(q, k, v, ids, ids, alpha=1.5, causal=True, radius=3)  # noqa: E731
    native_out = run()
    monkeypatch.setattr(torch_bucketed, "query_thresholds", lambda *args: None)
    torch.testing.assert_close(run(), native_out, rtol=0, atol=1e-6)


def test_a_library_is_built_once_into_its_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEFINDER_NATIVE_CACHE", str(tmp_path))
    native.library.cache_clear()
    try:
        assert native.library("entmax_threshold") is not None
        [built] = tmp_path.iterdir()  # no temporary file left beside it
        assert built.name.startswith("entmax_threshold-") and built.suffix == ".so"
        stamp = built.stat().st_mtime_ns
        native.library.cache_clear()
        assert native.library("entmax_threshold") is not None
        assert built.stat().st_mtime_ns == stamp  # loaded, not rebuilt
    finally:
        native.library.cache_clear()


def test_a_missing_compiler_warns_and_gives_no_library(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEFINDER_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler")
    native.library.cache_clear()
    try:
        with pytest.warns(UserWarning, match="entmax_threshold could not be built.*no-such-compiler"):
            assert native.library("entmax_threshold") is None
        assert list(tmp_path.iterdir()) == []
    finally:
        native.library.cache_clear()
