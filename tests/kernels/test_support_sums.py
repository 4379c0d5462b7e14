"""The fused row sums of the α-entmax threshold search against their definition, compiled and eager."""

import pytest
import torch

from kernels import support_sums as module
from kernels.support_sums import support_sums


def by_definition(x, tau, candidate):
    """s₁, s₂, k, k′ per row, one row at a time in float64."""
    rows = x.reshape(-1, x.shape[-1]).double()
    out = []
    for row, t, c in zip(rows, tau.reshape(-1).tolist(), candidate.reshape(-1).tolist(), strict=True):
        above = row[row > t] - t
        out.append([above.sum(), above.square().sum(), float(len(above)), float((row > c).sum())])
    return torch.tensor(out).T.reshape(4, *x.shape[:-1])


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 9), (1, 1), (2, 1, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sums_follow_their_definition(shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen, dtype=dtype)
    x[..., 0] = -torch.inf  # masked entries
    tau = torch.randn(shape[:-1], generator=gen, dtype=dtype) - 0.5
    candidate = tau + 0.3
    got = torch.stack(support_sums(x, tau, candidate))
    torch.testing.assert_close(got.double(), by_definition(x, tau, candidate), rtol=1e-6, atol=1e-6)


def test_an_infinite_candidate_counts_nothing():
    x = torch.randn(4, 6)
    *_, count = support_sums(x, torch.full((4,), -9.0), torch.full((4,), torch.inf))
    assert count.tolist() == [0.0] * 4


def test_sums_run_eagerly_once_compiling_fails(monkeypatch):
    calls = []

    def failing(*args):
        calls.append(args)
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(module, "_compiled", failing)
    monkeypatch.setattr(module, "_eager", False)
    x, tau = torch.randn(3, 5), torch.zeros(3)
    with pytest.warns(UserWarning, match="run eagerly.*no C\\+\\+ compiler"):
        first = support_sums(x, tau, tau)
    second = support_sums(x, tau, tau)  # no second attempt, no second warning
    assert len(calls) == 1
    for a, b, c in zip(first, second, by_definition(x, tau, tau), strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a.double(), c)
