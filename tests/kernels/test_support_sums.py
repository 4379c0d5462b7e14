"""The fused row sums of the α-entmax threshold search against their definition, compiled and eager."""

import pytest
import torch

from attention_kernels.entmax import support_sums as module
from attention_kernels.entmax.support_sums import support_sums


def by_definition(scores, shift, tau, candidate, scale):
    """s₁, s₂, k, k′ per row of x = scale·(s − shift), one row at a time in float64."""
    x = (scores.double() - shift.double()[..., None]) * scale
    rows = x.reshape(-1, x.shape[-1])
    out = []
    for row, t, c in zip(rows, tau.reshape(-1).tolist(), candidate.reshape(-1).tolist(), strict=True):
        above = row[row > t] - t
        out.append([above.sum(), above.square().sum(), float(len(above)), float((row > c).sum())])
    return torch.tensor(out).T.reshape(4, *x.shape[:-1])


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 9), (1, 1), (2, 1, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_sums_follow_their_definition(shape, dtype, scale):
    gen = torch.Generator().manual_seed(sum(shape))
    scores = torch.randn(shape, generator=gen, dtype=dtype)
    shift = scores.amax(-1)
    scores[..., 0] = -torch.inf  # masked entries
    tau = torch.rand(shape[:-1], generator=gen, dtype=dtype) - 1.0
    candidate = tau + 0.3
    got = torch.stack(support_sums(scores, shift, tau, candidate, scale))
    expected = by_definition(scores, shift, tau, candidate, scale)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)


def test_an_infinite_candidate_counts_nothing():
    scores = torch.randn(4, 6)
    tau, candidate = torch.full((4,), -9.0), torch.full((4,), torch.inf)
    *_, count = support_sums(scores, scores.amax(-1), tau, candidate, 0.5)
    assert count.tolist() == [0.0] * 4


def test_sums_run_eagerly_once_compiling_fails(monkeypatch):
    calls = []

    def failing(*args):
        calls.append(args)
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(module, "_compiled", lambda: failing)  # compiling fails at the first call
    monkeypatch.setattr(module, "_eager", False)
    scores, tau = torch.randn(3, 5), torch.full((3,), -0.5)
    args = (scores, scores.amax(-1), tau, tau, 0.5)
    with pytest.warns(UserWarning, match="run eagerly.*no C\\+\\+ compiler"):
        first = support_sums(*args)
    second = support_sums(*args)  # no second attempt, no second warning
    assert len(calls) == 1
    for a, b, c in zip(first, second, by_definition(*args), strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a.double(), c)


def test_one_compilation_per_dtype_whatever_the_shapes():
    """Ranks, sizes of 1 and views of other bases must not recompile: past eight compilations Dynamo runs
    the function eagerly for good, and the fused pass is lost."""
    from torch._dynamo.utils import counters

    before = counters["frames"]["ok"]
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for shape in [(5, 7), (3, 4, 9), (1, 6, 5), (6, 1, 4), (2, 3, 4, 5)]:
            base = torch.randn(shape, generator=gen, dtype=dtype)
            for scores in (base, base[..., 1:]):  # a tensor and a view of it
                tau = torch.full(scores.shape[:-1], -0.5, dtype=dtype)
                got = torch.stack(support_sums(scores, scores.amax(-1), tau, tau + 0.2, 0.5))
                expected = by_definition(scores, scores.amax(-1), tau, tau + 0.2, 0.5)
                torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    assert counters["frames"]["ok"] - before <= 2
    assert not module._eager
