"""SBM graph samplers: counter-based uniforms, Poisson inversion, dense vs fastRG, straight-through."""

from __future__ import annotations

import pytest
import torch

from pipeline.attention.sbm_sampling import (
    bernoulli_graph,
    counter_uniforms,
    fastrg_edges,
    poisson_inverse,
    straight_through,
)

DRAWS, N, M, K = 600, 24, 20, 3


def block_model() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed memberships (N, K), (M, K) and a block matrix (K, K) summing to 1."""
    g = torch.Generator().manual_seed(0)
    q_members = torch.rand(N, K, generator=g)
    k_members = torch.rand(M, K, generator=g)
    blocks = torch.softmax(3 * torch.randn(K * K, generator=g), 0).view(K, K)
    return q_members, k_members, blocks


def draws(limits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense graphs, fastRG graphs) (DRAWS, N, M) float64 over one key, and the edge probabilities (N, M)."""
    q_members, k_members, blocks = block_model()
    p = q_members @ blocks @ k_members.T  # (N, M)
    allowed = torch.arange(M) < limits[:, None]
    graphs = torch.arange(DRAWS)
    dense = bernoulli_graph(
        p.expand(DRAWS, N, M), 11, graphs[:, None, None], torch.arange(N)[:, None], torch.arange(M)
    )
    dense = (dense & allowed).double()
    g, i, j = fastrg_edges(
        q_members.expand(DRAWS, N, K),
        blocks[None],
        k_members.expand(DRAWS, M, K),
        limits,
        11,
        graphs,
        torch.arange(N),
    )
    sparse = torch.zeros(DRAWS, N, M, dtype=torch.float64)
    sparse[g, i, j] = 1.0
    assert int(sparse.sum()) == len(g)  # duplicates were collapsed
    return dense, sparse, -torch.expm1(-p.double()) * allowed


def test_counter_uniforms_depend_only_on_their_counters():
    rows, cols = torch.arange(50)[:, None], torch.arange(40)
    whole = counter_uniforms(5, 3, rows, cols)
    assert torch.equal(counter_uniforms(5, 3, rows[10:20], cols[7:9]), whole[10:20, 7:9])
    assert ((whole > 0) & (whole < 1)).all()
    assert abs(float(whole.mean()) - 0.5) < 4 * (1 / 12 / whole.numel()) ** 0.5
    assert len(whole.unique()) == whole.numel()
    assert not torch.equal(counter_uniforms(6, 3, rows, cols), whole)
    assert not torch.equal(counter_uniforms(5, 4, rows, cols), whole)


def test_poisson_inversion_returns_the_quantile():
    rates = torch.tensor([0.0, 0.01, 0.7, 3.0, 40.0, 2500.0], dtype=torch.float64).repeat(200)
    uniforms = counter_uniforms(1, torch.arange(rates.numel()))
    counts = poisson_inverse(rates, uniforms).double()

    def cdf(c):
        return torch.special.gammaincc(c + 1, rates)

    assert (cdf(counts) >= uniforms).all()
    below = torch.where(counts > 0, cdf(counts - 1), 0.0)  # P(X ≤ c − 1), 0 for c = 0
    assert (below < uniforms).all() and (counts[rates == 0] == 0).all()


@pytest.mark.parametrize("causal", [False, True], ids=["all-keys", "prefixes"])
def test_dense_and_fastrg_samplers_draw_the_same_graphs(causal):
    limits = torch.arange(N).clamp(max=M - 1) + 1 if causal else torch.full((N,), M)
    dense, sparse, probability = draws(limits)
    assert not (sparse * (probability == 0)).any()  # never past a row's limit
    # edge count per draw: mean Σ q, variance Σ q (1 − q) (independent pairs); 5 standard errors
    error = float((probability * (1 - probability)).sum() / DRAWS) ** 0.5
    for graphs in (dense, sparse):
        assert abs(float(graphs.sum((1, 2)).mean() - probability.sum())) < 5 * error
    assert abs(float(dense.sum() - sparse.sum())) / DRAWS < 5 * 2**0.5 * error
    # per block pair of 4 query groups × 4 key groups
    for rows in torch.arange(N).chunk(4):
        for cols in torch.arange(M).chunk(4):
            q = probability[rows][:, cols]
            error = float((q * (1 - q)).sum() / DRAWS) ** 0.5
            counts = [float(graphs[:, rows][:, :, cols].sum() / DRAWS) for graphs in (dense, sparse)]
            assert all(abs(count - float(q.sum())) < 5 * error + 1e-12 for count in counts)
            assert abs(counts[0] - counts[1]) < 5 * 2**0.5 * error + 1e-12


def test_a_fastrg_row_never_depends_on_keys_past_its_limit():
    q_members, k_members, blocks = block_model()
    limits = torch.arange(N).clamp(max=M - 1) + 1
    changed = k_members.clone()
    changed[10:] = torch.rand(M - 10, K, generator=torch.Generator().manual_seed(3))
    edges = [
        fastrg_edges(
            q_members[None], blocks[None], members[None], limits, 4, torch.zeros(1).long(), torch.arange(N)
        )
        for members in (k_members, changed)
    ]
    early = [torch.stack([i, j])[:, i < 10] for _, i, j in edges]  # rows 0 … 9 read keys 0 … 9 only
    assert torch.equal(*early) and early[0].shape[1] > 0


def test_straight_through_passes_probabilities_exactly_and_rates_get_hardtanh_of_the_graph_gradient():
    g = torch.Generator().manual_seed(1)
    probs = torch.rand(2, 3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    rates = torch.rand(2, 3, 4, 5, generator=g, dtype=torch.float64)
    graph = torch.rand(2, 3, 4, 5, generator=g) < 0.5
    assert torch.autograd.gradcheck(lambda x: straight_through(x, rates, graph), (probs,))

    rates.requires_grad_(True)
    out, edges = straight_through(probs, rates, graph)
    assert torch.equal(out, probs * graph) and torch.equal(edges, graph.double().sum((0, 2, 3)))
    grad_out = 3 * torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    grad_edges = torch.randn(3, generator=g, dtype=torch.float64)
    rates_grad, probs_grad = torch.autograd.grad((out, edges), (rates, probs), (grad_out, grad_edges))
    expected = (grad_out * probs + grad_edges.view(1, 3, 1, 1)).clamp(-1, 1) * graph
    torch.testing.assert_close(rates_grad, expected, rtol=0, atol=1e-12)
    assert (rates_grad[~graph] == 0).all() and (rates_grad.abs() <= 1).all()
    torch.testing.assert_close(probs_grad, grad_out * graph, rtol=0, atol=0)
