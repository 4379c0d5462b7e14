"""The Sparsefinder baselines (window, BigBird, Longformer, Reformer, Routing) against their definitions."""

import math

import pytest
import torch

from attention_kernels.attended import pattern_pairs, valid_pairs
from pipeline.errors import UserError
from pipeline.predictors import (
    BigBirdPredictor,
    HeadInputs,
    LongformerPredictor,
    ReformerPredictor,
    RoutingPredictor,
    WindowPredictor,
    make_predictor,
    predicted_graph,
)
from pipeline.predictors.state import load_state, save_states

LENGTHS = [9, 5, 1, 0]  # real tokens per sentence, right-padded to 9


def make_inputs(causal=True, seed=0, lengths=LENGTHS, heads=2, rank=3, shared_qk=False):
    """Self-attention inputs with random teacher and projected vectors; padding holds huge values."""
    gen = torch.Generator().manual_seed(seed)
    b, n = len(lengths), max(lengths)
    valid = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (b, n)
    pad = ~valid[:, None, :, None]
    q, k = (torch.randn(b, heads, n, 4, generator=gen) for _ in range(2))
    q_proj, k_proj = (torch.randn(b, heads, n, rank, generator=gen).masked_fill(pad, 1e6) for _ in range(2))
    if shared_qk:
        k_proj = q_proj.clone()
    return HeadInputs(q, k, valid, valid, causal, q_proj, k_proj)


def graph_of(predictor, inputs, layer=0, window=0, global_tokens=0):
    prediction = predictor.predict(layer, inputs)
    return predicted_graph(
        prediction,
        inputs.q_valid,
        inputs.k_valid,
        causal=inputs.causal,
        window=window,
        global_tokens=global_tokens,
    )


# -- window ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [0, 1, 3, 7])
def test_window_predicts_nothing_but_the_pattern(causal, window):
    inputs = make_inputs(causal)
    mask = WindowPredictor().predict(0, inputs).mask
    assert mask.shape == (4, 1, 9, 9) and not mask.any()
    expected = pattern_pairs(9, 9, window=window) & valid_pairs(inputs.q_valid, inputs.k_valid, causal=causal)
    assert torch.equal(graph_of(WindowPredictor(), inputs, window=window), expected[:, None])


# -- BigBird ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("random_keys", [1, 3, 20])
def test_bigbird_draws_min_r_allowed_keys_per_query(causal, random_keys):
    inputs = make_inputs(causal)
    mask = BigBirdPredictor(random_keys=random_keys).predict(0, inputs).mask
    allowed = valid_pairs(inputs.q_valid, inputs.k_valid, causal=causal)[:, None]  # (b, 1, n, m)
    assert mask.shape == (4, 2, 9, 9)
    assert not (mask & ~allowed).any()
    assert torch.equal(mask.sum(-1), allowed.sum(-1).clamp(max=random_keys).expand(-1, 2, -1))


def test_bigbird_draws_uniformly_over_all_allowed_keys():
    # one query allowed 40 keys, 3 drawn, 4000 times: every key about 300 times, the far ones included
    inputs = make_inputs(causal=False, lengths=[40] * 2000, heads=2, rank=1)
    counts = BigBirdPredictor(random_keys=3).predict(0, inputs).mask[:, :, 0].sum((0, 1))  # (m,)
    assert counts.sum() == 3 * 4000
    assert ((counts - 300).abs() < 75).all()  # ±4.5 σ of a binomial(4000, 3/40)


def test_bigbird_seed_and_layer_change_the_draws_and_nothing_else_does():
    inputs = make_inputs()
    first = BigBirdPredictor(random_keys=2, seed=1).predict(0, inputs).mask
    assert torch.equal(first, BigBirdPredictor(random_keys=2, seed=1).predict(0, inputs).mask)
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(first, BigBirdPredictor(random_keys=2, seed=1).predict(0, inputs).mask)
    assert not torch.equal(first, BigBirdPredictor(random_keys=2, seed=2).predict(0, inputs).mask)
    assert not torch.equal(first, BigBirdPredictor(random_keys=2, seed=1).predict(1, inputs).mask)
    assert not torch.equal(first[:, 0], first[:, 1])  # heads draw independently


# -- Longformer ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("global_random", [1, 4, 20])
def test_longformer_makes_min_g_real_positions_global(causal, global_random):
    inputs = make_inputs(causal)
    mask = LongformerPredictor(global_random=global_random).predict(0, inputs).mask
    chosen = mask.diagonal(dim1=-2, dim2=-1)  # (b, h, n): (p, p) is set exactly when p is global
    lengths = torch.tensor(LENGTHS)[:, None]
    assert torch.equal(chosen.sum(-1), lengths.clamp(max=global_random).expand(-1, 2))
    assert not (chosen & ~inputs.q_valid[:, None]).any()
    assert torch.equal(mask, chosen[..., :, None] | chosen[..., None, :])
    graph = graph_of(LongformerPredictor(global_random=global_random), inputs)
    valid = valid_pairs(inputs.q_valid, inputs.k_valid, causal=causal)[:, None].expand_as(graph)
    rows = chosen[..., :, None].expand_as(graph)
    cols = chosen[..., None, :].expand_as(graph)
    assert torch.equal(graph[rows], valid[rows]) and torch.equal(graph[cols], valid[cols])
    assert not graph[~rows & ~cols].any()


def test_longformer_on_cross_attention_draws_among_positions_real_on_either_side():
    gen = torch.Generator().manual_seed(0)
    q_valid = torch.tensor([[True] * 3 + [False] * 2])  # 3 queries
    k_valid = torch.tensor([[True] * 7 + [False]])  # 7 keys
    q, k = torch.randn(1, 2, 5, 4, generator=gen), torch.randn(1, 2, 8, 4, generator=gen)
    inputs = HeadInputs(q, k, q_valid, k_valid, causal=False)
    mask = LongformerPredictor(global_random=4).predict(0, inputs).mask
    assert mask.shape == (1, 2, 5, 8)
    chosen = mask.all(-2)  # (b, h, m): a full column is a global position (4 picks cannot fill 5 rows)
    assert torch.equal(chosen.sum(-1), torch.tensor([[4, 4]])) and not chosen[..., 7:].any()
    assert torch.equal(mask, chosen[..., :5, None] | chosen[..., None, :])


def test_longformer_is_seeded():
    inputs = make_inputs()
    first = LongformerPredictor(seed=5).predict(2, inputs).mask
    assert torch.equal(first, LongformerPredictor(seed=5).predict(2, inputs).mask)
    assert not torch.equal(first, LongformerPredictor(seed=6).predict(2, inputs).mask)


# -- Reformer --------------------------------------------------------------------------------------------
def fitted(predictor, layer=0, seed=0, **inputs_kw):
    predictor.fit(layer, [make_inputs(seed=seed, **inputs_kw)], seed=0)
    return predictor


@pytest.mark.parametrize("buckets", [2, 4, 12])
def test_reformer_buckets_are_argmax_of_the_shared_rotation(buckets):
    reformer = fitted(ReformerPredictor(buckets=buckets))
    rotations = reformer.layer_state(0)["rotations"]
    assert rotations.shape == (2, 3, buckets // 2)
    inputs = make_inputs(seed=1)
    prediction = reformer.predict(0, inputs)
    for ids, x, valid in [
        (prediction.q_buckets, inputs.q_proj, inputs.q_valid),
        (prediction.k_buckets, inputs.k_proj, inputs.k_valid),
    ]:
        assert ids.dtype == torch.int32 and ids.shape == (4, 2, 9, 1)
        assert torch.equal(ids[..., 0] == -1, ~valid[:, None].expand(-1, 2, -1))
        for b, h, i in valid[:, None].expand(-1, 2, -1).nonzero().tolist():
            projections = [float(x[b, h, i] @ rotations[h, :, c]) for c in range(buckets // 2)]
            scores = projections + [-p for p in projections]
            assert ids[b, h, i, 0] == scores.index(max(scores))
            assert 0 <= ids[b, h, i, 0] < buckets


def test_reformer_shares_buckets_between_queries_and_keys():
    reformer = fitted(ReformerPredictor(buckets=8))
    prediction = reformer.predict(0, make_inputs(seed=2, shared_qk=True))
    assert torch.equal(prediction.q_buckets, prediction.k_buckets)
    ids = prediction.q_buckets
    assert ids.max() == 7 and len(ids[ids >= 0].unique()) > 4  # the buckets are all in use


def test_reformer_rotations_follow_seed_and_layer_only():
    first = fitted(ReformerPredictor(seed=3)).layer_state(0)["rotations"]
    torch.manual_seed(99)
    assert torch.equal(first, fitted(ReformerPredictor(seed=3), seed=7).layer_state(0)["rotations"])
    assert not torch.equal(first, fitted(ReformerPredictor(seed=4)).layer_state(0)["rotations"])
    assert not torch.equal(first, fitted(ReformerPredictor(seed=3), layer=1).layer_state(1)["rotations"])


# -- Routing ---------------------------------------------------------------------------------------------
def routing_with(centroids, layer=0, **knobs):
    routing = RoutingPredictor(clusters=centroids.shape[1], **knobs)
    routing.set_layer_state(layer, {"centroids": centroids})
    return routing


def test_routing_leaves_a_query_without_bucket_and_keeps_every_pick():
    # centroids e1, e2; tokens e1, e2, (e1 + e2)/√2 (near both), −(e1 + e2) (near neither), then padding
    # lying on e1 (would win any ranking that did not exclude it); ⌈4/2⌉ = 2 tokens per centroid
    centroids = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # (h, c, r)
    x = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, -1.0], [9.0, 0.0], [9.0, 0.0]]]])
    valid = torch.tensor([[True] * 4 + [False] * 2])
    inputs = HeadInputs(x, x, valid, valid, causal=False, q_proj=x, k_proj=x.clone())
    prediction = routing_with(centroids).predict(0, inputs)
    expected = [[0, -1], [-1, 1], [0, 1], [-1, -1], [-1, -1], [-1, -1]]
    assert prediction.q_buckets.tolist() == [[expected]] and prediction.k_buckets.tolist() == [[expected]]
    graph = graph_of(routing_with(centroids), inputs)
    assert not graph[0, 0, 3].any() and graph[0, 0, 2].tolist() == [True] * 3 + [False] * 3


@pytest.mark.parametrize("clusters", [2, 3, 5])
def test_each_centroid_picks_ceil_l_over_c_real_tokens(clusters):
    routing = fitted(RoutingPredictor(clusters=clusters), lengths=[9, 9, 9, 9])
    centroids = routing.layer_state(0)["centroids"]
    assert centroids.shape == (2, clusters, 3)
    assert torch.allclose(centroids.norm(dim=-1), torch.ones(2, clusters))
    inputs = make_inputs(seed=3)
    prediction = routing.predict(0, inputs)
    per_centroid = torch.tensor([math.ceil(n / clusters) for n in LENGTHS])[:, None, None]
    for ids, valid in [(prediction.q_buckets, inputs.q_valid), (prediction.k_buckets, inputs.k_valid)]:
        assert ids.shape == (4, 2, 9, clusters)
        picked = ids >= 0  # (b, h, n, c)
        assert torch.equal(ids[picked], torch.arange(clusters).expand_as(ids)[picked].int())
        assert torch.equal(picked.sum(-2), per_centroid.expand(-1, 2, clusters))
        assert not picked.transpose(1, 2)[~valid].any()


def test_routing_picks_by_cosine_similarity():
    routing = fitted(RoutingPredictor(clusters=3))
    inputs = make_inputs(seed=4, lengths=[9])
    ids = routing.predict(0, inputs).q_buckets
    centroids = routing.layer_state(0)["centroids"]
    for h in range(2):
        cosines = torch.nn.functional.cosine_similarity(inputs.q_proj[0, h, :, None], centroids[h], dim=-1)
        for c in range(3):
            top = set(cosines[:, c].topk(3).indices.tolist())
            assert {i for i in range(9) if ids[0, h, i, c] == c} == top


def test_fitted_state_round_trips(tmp_path):
    routing = fitted(RoutingPredictor(clusters=3, seed=2))
    reformer = fitted(ReformerPredictor(buckets=6, seed=2))
    path = tmp_path / "state.safetensors"
    save_states(path, [routing, reformer])
    inputs = make_inputs(seed=5)
    for original in (routing, reformer):
        loaded = load_state(path, type(original)(**original.knobs()))
        assert loaded.state_layers == [0]
        before, after = original.predict(0, inputs), loaded.predict(0, inputs)
        assert torch.equal(before.q_buckets, after.q_buckets)
        assert torch.equal(before.k_buckets, after.k_buckets)


def test_fitted_baselines_need_their_state():
    with pytest.raises(UserError, match="no fitted state for layer 0"):
        RoutingPredictor().predict(0, make_inputs())
    with pytest.raises(UserError, match="only 4 training tokens"):
        fitted(RoutingPredictor(clusters=5), lengths=[2])


# -- knobs -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "knobs", "message"),
    [
        ("window", {"bad_knob": 1}, "predictor window has no knob bad_knob"),
        ("bigbird", {"bad_knob": 1}, "predictor bigbird has no knob bad_knob"),
        ("bigbird", {"random_keys": 0}, "bigbird.random_keys must be an integer >= 1; got 0"),
        ("bigbird", {"random_keys": "4"}, "bigbird.random_keys must be an integer >= 1; got '4'"),
        ("bigbird", {"seed": -1}, "bigbird.seed must be an integer >= 0; got -1"),
        ("longformer", {"global_random": True}, "longformer.global_random must be an integer >= 1; got True"),
        ("longformer", {"seed": 1.5}, "longformer.seed must be an integer >= 0; got 1.5"),
        ("reformer", {"buckets": 3}, "reformer.buckets must be an even integer >= 2; got 3"),
        ("reformer", {"buckets": 0}, "reformer.buckets must be an even integer >= 2; got 0"),
        ("routing", {"clusters": 1}, "routing.clusters must be an integer >= 2; got 1"),
        ("routing", {"iterations": 0}, "routing.iterations must be an integer >= 1; got 0"),
    ],
)
def test_bad_knobs_give_one_line(name, knobs, message):
    with pytest.raises(UserError) as err:
        make_predictor(name, **knobs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_knob_free_baselines_need_no_projections():
    inputs = make_inputs()
    bare = HeadInputs(inputs.q, inputs.k, inputs.q_valid, inputs.k_valid, inputs.causal)
    for predictor in (WindowPredictor(), BigBirdPredictor(), LongformerPredictor()):
        assert not predictor.needs_projections
        predictor.predict(0, bare)
    with pytest.raises(UserError, match="projections"):
        fitted(ReformerPredictor()).predict(0, bare)
