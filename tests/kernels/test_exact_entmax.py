"""The C++ exact α-entmax against its PyTorch reference and against entmax itself, and how it is built."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from entmax import entmax15, sparsemax

from attention_kernels import native
from attention_kernels.bucketed import torch_path
from attention_kernels.bucketed.exact_entmax import exact_entmax
from attention_kernels.bucketed.planning import BlockMask
from attention_kernels.bucketed.torch_path import _MASKED, _exact_thresholds, _SpreadRows

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [1, 5, 16, 37, 64, 256])
def test_softmax_equals_softmax_over_each_querys_keys(dtype, width):
    """α = 1: per query, the probabilities written over its rows are torch's softmax of its keys (the
    kernel's own exponential in float32: a relative error of a few 1e-7), τ is log Σ e^{s − m}, and a query
    without keys gets zeros and τ = −inf."""
    queries = 40
    parts, owners = spread_parts(queries, width, seed=width, dtype=dtype)
    scores = [p.clone() for p in parts]
    shift, tau = exact_entmax(parts, owners, queries, 1.0, write=True)
    rtol = 2e-6 if dtype == torch.float32 else 1e-14
    for query in range(queries):
        s, p = keys_of(scores, owners, query), keys_of(parts, owners, query)
        on = s > 0.5 * _MASKED
        assert torch.equal(p[~on], torch.zeros_like(p[~on]))
        if not on.any():
            assert tau[query] == -torch.inf
            continue
        assert shift[query] == s[on].max()
        torch.testing.assert_close(p[on], torch.softmax(s[on], -1), rtol=rtol, atol=0)
        torch.testing.assert_close(shift[query] + tau[query], torch.logsumexp(s[on], -1), rtol=rtol, atol=0)


def test_softmax_exponential_over_float32_range():
    """The float32 exponential over arguments from −87 to 0 (a query's scores below its maximum): each
    probability within 3e-7 of torch's, relatively; below −87.3 (e^x under float's normal range) exactly 0."""
    x = torch.linspace(-87.0, 0.0, 20001)
    for row in (x, torch.cat([x, torch.tensor([-87.5, -100.0, -torch.inf])])):
        probs = row[None].clone()
        exact_entmax([probs], [torch.zeros(1, dtype=torch.int64)], 1, 1.0, write=True)
        expected = torch.softmax(row.double(), -1)
        kept = expected > 1e-38
        relative = (probs[0].double()[kept] - expected[kept]).abs() / expected[kept]
        assert relative.max() < 3e-7
    assert torch.equal(probs[0, -3:], torch.zeros(3))


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


def random_mask(blocks: int, rows: int, width: int, *, seed: int, low: bool, tags: bool) -> BlockMask:
    """A block mask of random positions and limits (a padding key and a padding row), with lower limits
    and two row tags against three column tags (ids in 0..4, −2 and −3 for none) when asked."""
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 30, (blocks, width), generator=gen).float()
    positions[:, -1] = 2.0**41  # a padding key, beyond every limit
    limits = torch.randint(0, 30, (blocks, rows), generator=gen).float()
    lows = (limits - torch.randint(0, 12, (blocks, rows), generator=gen)).float() if low else None
    limits[0, 0] = -1  # a padding row: no key, and no lower limit
    if lows is not None:
        lows[0, 0] = -1
    q_tags = k_tags = None
    if tags:
        q_tags = torch.randint(0, 5, (2, blocks, rows), generator=gen, dtype=torch.int32)
        k_tags = torch.randint(0, 5, (3, blocks, width), generator=gen, dtype=torch.int32)
        q_tags[q_tags == 4], k_tags[k_tags == 4] = -2, -3
    return BlockMask(positions, limits, lows, q_tags, k_tags)


@pytest.mark.parametrize("rule", ["limits", "band", "tags"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [7, 16, 40])
def test_masks_equal_masked_scores_bit_for_bit(dtype, width, rule):
    """Entries left out by the kernel through a block mask (limits as causal blocks carry them; lower limits
    as the window band's; tags as pairs another block holds) give exactly what scores masked by adding
    ``_MASKED`` give: the same m, τ and probabilities, 0 off the mask."""
    gen = torch.Generator().manual_seed(width)
    blocks, rows, queries = 6, 5, 13
    scores = torch.randn(blocks, rows, width, generator=gen, dtype=dtype)
    owners = torch.randint(0, queries, (blocks, rows), generator=gen)
    mask = random_mask(blocks, rows, width, seed=width, low=rule != "limits", tags=rule == "tags")
    off = mask.excluded()
    assert off.max() == 1 and off.min() == 0  # an indicator, even where two rules hold
    if rule == "tags":
        assert (mask.q_tags[0, :, :, None] == mask.k_tags[0, :, None, :]).any()
    masked = scores + off.to(dtype) * _MASKED
    by_mask = scores.clone()
    found = exact_entmax([by_mask], [owners], queries, 1.5, write=True, masks=[mask])
    expected = exact_entmax([masked], [owners], queries, 1.5, write=True)
    assert all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))
    assert torch.equal(by_mask, masked)
    assert (by_mask[off > 0] == 0).all() and (by_mask > 0).any()


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
        (torch.randn(2, 4), torch.tensor([0, 1]), 1.3, r"takes α = 1 \(softmax\), 1.5 or 2; got 1.3"),
    ],
)
def test_bad_arguments_are_refused(scores, owners, alpha, message):
    with pytest.raises(ValueError, match=message):
        exact_entmax([scores], [owners], 3, alpha, write=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"limit": torch.zeros(2, 4)}, r"limit must be \(2, 3\) torch.float32 for scores \(2, 3, 4\)"),
        ({"key_pos": torch.zeros(2, 4, dtype=torch.float64)}, r"key_pos must be \(2, 4\) torch.float32"),
        ({"low": torch.zeros(3, 3)}, r"low must be \(2, 3\)"),
        ({"q_tags": torch.zeros(1, 2, 3, dtype=torch.int32)}, "q_tags and k_tags go together"),
        (
            {"q_tags": torch.zeros(1, 2, 3), "k_tags": torch.zeros(1, 2, 4, dtype=torch.int32)},
            r"q_tags must be \(S, 2, 3\) torch.int32",
        ),
        (
            {
                "q_tags": torch.zeros(1, 2, 3, dtype=torch.int32),
                "k_tags": torch.zeros(2, 4, dtype=torch.int32),
            },
            r"k_tags must be \(S, 2, 4\) torch.int32",
        ),
    ],
)
def test_masks_that_do_not_fit_their_part_are_refused(change, message):
    scores, owners = torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.int64)
    mask = replace(BlockMask(torch.zeros(2, 4), torch.zeros(2, 3)), **change)
    with pytest.raises(ValueError, match=message):
        exact_entmax([scores], [owners], 1, 1.5, write=True, masks=[mask])


def test_the_bucketed_path_runs_its_reference_where_no_library_can_be_built(monkeypatch):
    """Without the C++ kernel the bucketed path's α-entmax is the same attention."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=gen) for _ in range(3))
    ids = torch.randint(0, 3, (1, 2, 300, 1), generator=gen, dtype=torch.int32)
    run = lambda: torch_path.torch_bucketed_attention(q, k, v, ids, ids, alpha=1.5, causal=True, radius=3)  # noqa: E731
    native_out = run()
    monkeypatch.setattr(torch_path, "exact_entmax", lambda *args, **kwargs: None)
    torch.testing.assert_close(run(), native_out, rtol=0, atol=1e-6)


def test_a_library_is_built_once_into_its_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEFINDER_NATIVE_CACHE", str(tmp_path))
    native.library.cache_clear()
    try:
        assert native.library("exact_entmax") is not None
        # the library and its record, no temporary file left beside them
        assert sorted(path.suffix for path in tmp_path.iterdir()) == [".json", ".so"]
        [built] = tmp_path.glob("*.so")
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
