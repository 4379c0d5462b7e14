"""The τ-indexer: its predicted set, its PCA and distilled fits, and its one-line errors."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15

from attention_kernels.entmax.threshold import threshold_from_probabilities
from attention_kernels.index_grid import on_grid
from pipeline.errors import UserError
from pipeline.graphs import GraphStore
from pipeline.predictors import IndexerPredictor, make_predictor
from pipeline.predictors.base import HeadInputs
from pipeline.predictors.indexer_fit import distill_maps, indexer_loss, low_rank, principal_basis
from pipeline.predictors.scoring import layer_inputs

HEADS, DIM = 3, 8


def random_inputs(seed: int, *, causal: bool, n: int = 9, batch: int = 3) -> HeadInputs:
    """Random queries and keys, the later sentences of the batch right-padded."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, HEADS, n, DIM, generator=g) * 2
    k = torch.randn(batch, HEADS, n, DIM, generator=g) * 2
    lengths = torch.tensor([n, n - 3, 1][:batch])
    valid = torch.arange(n)[None, :] < lengths[:, None]
    return HeadInputs(q, k, valid, valid, causal)


def bisection_threshold(z: torch.Tensor, alpha: float) -> float:
    """τ with Σ_j [(α − 1) z_j − τ]₊^{1/(α−1)} = 1, by bisection in float64: the definition, solved slowly."""
    x = (alpha - 1) * z.double()
    lo, hi = float(x.max()) - 1.0, float(x.max())
    for _ in range(200):
        tau = (lo + hi) / 2
        mass = float((x - tau).clamp_min(0).pow(1 / (alpha - 1)).sum())
        lo, hi = (tau, hi) if mass > 1 else (lo, tau)
    return (lo + hi) / 2


def fitted(predictor: IndexerPredictor, q_map: torch.Tensor, k_map: torch.Tensor | None = None):
    predictor.set_layer_state(0, {"q_map": q_map, "k_map": q_map if k_map is None else k_map})
    return predictor


@pytest.mark.parametrize("alpha", [1.5, 1.3, 2.0])
@pytest.mark.parametrize("causal", [False, True])
def test_predicted_set_is_the_entmax_rule_on_low_rank_scores(alpha, causal):
    inputs = random_inputs(0, causal=causal)
    g = torch.Generator().manual_seed(1)
    q_map, k_map = torch.randn(HEADS, 2, DIM, generator=g), torch.randn(HEADS, 2, DIM, generator=g)
    margin = 0.1
    predictor = fitted(IndexerPredictor(rank=2, margin=margin, alpha=alpha), q_map, k_map)
    mask = predictor.predict(0, inputs).mask  # (b, h, n, m)

    scale = DIM**-0.5
    q_low = on_grid(torch.einsum("bhnd,hrd->bhnr", inputs.q, q_map))  # each row on its 7-bit grid
    k_low = on_grid(torch.einsum("bhnd,hrd->bhnr", inputs.k, k_map))
    checked = 0
    for b, h, i in torch.cartesian_prod(*(torch.arange(s) for s in mask.shape[:3])).tolist():
        keys = [j for j in range(mask.shape[-1]) if inputs.k_valid[b, j] and (not causal or j <= i)]
        if not inputs.q_valid[b, i]:
            assert not mask[b, h, i].any()  # padding queries predict nothing
            continue
        z = torch.stack([scale * q_low[b, h, i] @ k_low[b, h, j] for j in keys])
        tau = bisection_threshold(z, alpha)
        expected = ((alpha - 1) * z.double() >= tau - margin).tolist()
        gap = ((alpha - 1) * z.double() - (tau - margin)).abs()
        for j, keep, distance in zip(keys, expected, gap.tolist(), strict=True):
            if distance > 1e-4:  # pairs on the threshold itself are a matter of round-off
                assert bool(mask[b, h, i, j]) == keep
                checked += 1
        assert mask[b, h, i].sum() == sum(expected)
        assert not mask[b, h, i, [j for j in range(mask.shape[-1]) if j not in keys]].any()
    assert checked > 100
    assert 0 < mask.float().mean() < 0.5  # a real selection, not everything


def test_threshold_reproduces_entmax():
    z = torch.randn(5, 11, generator=torch.Generator().manual_seed(3)) * 3
    z[0, 4:] = float("-inf")  # excluded keys
    tau = threshold_from_probabilities(z, 1.5)
    torch.testing.assert_close((z / 2 - tau).clamp_min(0).square(), entmax15(z, dim=-1))
    assert torch.isneginf(threshold_from_probabilities(torch.full((1, 4), float("-inf")), 1.5)).all()


@pytest.mark.parametrize("causal", [False, True])
def test_a_margin_wider_than_any_gap_predicts_every_allowed_pair(causal):
    inputs = random_inputs(4, causal=causal)
    basis = torch.randn(HEADS, 1, DIM, generator=torch.Generator().manual_seed(5))
    mask = fitted(IndexerPredictor(rank=1, margin=1e9), basis).predict(0, inputs).mask
    assert torch.equal(mask, inputs.pairs().expand_as(mask))


def test_pca_fit_is_the_svd_of_the_stacked_queries_and_keys():
    batches = [random_inputs(seed, causal=True) for seed in (6, 7)]
    basis = principal_basis(batches, 3)  # (h, 3, d)
    for h in range(HEADS):
        stacked = torch.cat(
            [x.q[:, h][x.q_valid] for x in batches] + [x.k[:, h][x.k_valid] for x in batches]
        ).double()
        _, _, vh = torch.linalg.svd(stacked, full_matrices=False)
        top = vh[:3]  # (3, d) right-singular vectors, largest first
        # the same subspace, vector by vector up to sign
        torch.testing.assert_close(basis[h].double().abs(), top.abs(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(basis[h].double().T @ basis[h].double(), top.T @ top, rtol=1e-5, atol=1e-5)


def store_batches(micro_store, layer: int = 0) -> list[HeadInputs]:
    store = GraphStore(micro_store)
    return [inputs for inputs, _ in layer_inputs(store, "decoder_self", layer, range(len(store)))]


def test_distill_lowers_the_loss_on_a_micro_store(micro_store):
    batches = store_batches(micro_store)
    basis = principal_basis(batches, 2)
    q_map, k_map, losses = distill_maps(batches, basis, basis, alpha=1.5, epochs=30, lr=0.05, seed=0)
    before, after = indexer_loss(batches, basis, basis, 1.5), indexer_loss(batches, q_map, k_map, 1.5)
    assert after < 0.8 * before
    assert losses[-1] < losses[0]
    again = distill_maps(batches, basis, basis, alpha=1.5, epochs=30, lr=0.05, seed=0)
    assert torch.equal(again[0], q_map)  # deterministic given the seed


def test_fitted_state_at_full_rank_gives_exact_scores_and_nearly_the_gold_graph(micro_store):
    """At r = d the PCA basis is orthonormal, so z′ = z before the 7-bit grid; on the grid, margin 0 predicts
    the teacher's support up to the few pairs the grid's round-off moves across the threshold."""
    store = GraphStore(micro_store)
    predictor = IndexerPredictor(rank=store.head_dim)
    predictor.fit(0, store_batches(micro_store), seed=0)
    state = predictor.layer_state(0)
    hits = predicted = gold_edges = 0
    for inputs, gold in layer_inputs(store, "decoder_self", 0, range(len(store))):
        q_low, k_low = low_rank(inputs.q, state["q_map"]), low_rank(inputs.k, state["k_map"])
        exact = inputs.q.double() @ inputs.k.double().transpose(-1, -2)
        torch.testing.assert_close((q_low @ k_low.transpose(-1, -2)).double(), exact, atol=1e-4, rtol=1e-4)
        mask = predictor.predict(0, inputs).mask
        hits, predicted, gold_edges = (
            hits + int((mask & gold).sum()),
            predicted + int(mask.sum()),
            gold_edges + int(gold.sum()),
        )
    assert gold_edges > 100
    assert hits >= 0.98 * gold_edges and hits >= 0.98 * predicted


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"rank": 0}, "indexer.rank must be an integer >= 1"),
        ({"margin": -0.1}, "indexer.margin must be a number >= 0"),
        ({"alpha": 1.0}, "indexer.alpha must be a number > 1"),
        ({"fitting": "svd"}, "indexer.fitting must be one of pca, distill"),
    ],
)
def test_bad_knobs_fail_in_one_line(knobs, message):
    with pytest.raises(UserError, match=message):
        make_predictor("indexer", **knobs)


def test_a_rank_above_the_head_dimension_or_a_missing_layer_fails_in_one_line():
    with pytest.raises(UserError, match=r"indexer\.rank = 9 exceeds the head dimension 8"):
        IndexerPredictor(rank=9).fit(0, [random_inputs(0, causal=False)], seed=0)
    with pytest.raises(UserError, match="no fitted state for layer 1"):
        fitted(IndexerPredictor(rank=1), torch.ones(HEADS, 1, DIM)).predict(1, random_inputs(0, causal=False))
