"""k-means predictor against nearest-centroid search written as plain loops."""

import pytest
import torch

from attention_kernels.attended import shared_bucket_pairs
from pipeline.errors import UserError
from pipeline.predictors import HeadInputs, KMeansPredictor, make_predictor
from pipeline.predictors.kmeans import nearest_centroids


def loop_top_k(point, centroids, top_k):
    dists = [
        (sum((p - c) ** 2 for p, c in zip(point, cen, strict=True)), idx) for idx, cen in enumerate(centroids)
    ]
    return [idx for _, idx in sorted(dists)[:top_k]]


def make_inputs():
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-2, 3, (2, 2, 5, 2), generator=gen).float()  # integer grid: exact ties happen
    k = torch.randint(-2, 3, (2, 2, 6, 2), generator=gen).float()
    centroids = torch.tensor(
        [
            [[-1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, -1.0]],
            [[2.0, 2.0], [-2.0, -2.0], [0.0, 0.0], [2.0, -2.0]],
        ]
    )
    q_valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    k_valid = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    return q, k, centroids, q_valid, k_valid


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_top_k_matches_loops(top_k):
    q, _, centroids, q_valid, _ = make_inputs()
    ids = nearest_centroids(q, centroids, top_k, q_valid)
    assert ids.dtype == torch.int32 and ids.shape == (2, 2, 5, top_k)
    for b in range(2):
        for h in range(2):
            for i in range(5):
                expected = (
                    loop_top_k(q[b, h, i].tolist(), centroids[h].tolist(), top_k)
                    if q_valid[b, i]
                    else [-1] * top_k
                )
                assert ids[b, h, i].tolist() == expected


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_predicted_buckets_match_loops(top_k):
    q, k, centroids, q_valid, k_valid = make_inputs()
    predictor = KMeansPredictor(buckets=4, top_k=top_k)
    predictor.set_layer_state(0, {"centroids": centroids})
    inputs = HeadInputs(q, k, q_valid, k_valid, causal=False, q_proj=q, k_proj=k)
    prediction = predictor.predict(0, inputs)
    mask = shared_bucket_pairs(prediction.q_buckets, prediction.k_buckets)
    for b in range(2):
        for h in range(2):
            for i in range(5):
                for j in range(6):
                    shared = set(loop_top_k(q[b, h, i].tolist(), centroids[h].tolist(), top_k)) & set(
                        loop_top_k(k[b, h, j].tolist(), centroids[h].tolist(), top_k)
                    )
                    expected = bool(shared) and bool(q_valid[b, i]) and bool(k_valid[b, j])
                    assert mask[b, h, i, j].item() == expected


def test_every_valid_query_gets_a_cluster():
    q, _, centroids, q_valid, _ = make_inputs()
    ids = nearest_centroids(q, centroids, 1, q_valid)
    assert ((ids >= 0).squeeze(-1) == q_valid[:, None, :]).all()


def test_top_k_out_of_range_is_rejected():
    q, _, centroids, _, _ = make_inputs()
    with pytest.raises(ValueError, match="top_k"):
        nearest_centroids(q, centroids, 5)


@pytest.mark.parametrize("backend", ["faiss", "sklearn"])
def test_fit_per_head_without_padding(backend):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 5, 4, generator=gen)
    k = torch.randn(3, 2, 6, 4, generator=gen)
    q_valid = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0]], dtype=torch.bool)
    k_valid = torch.tensor([[1] * 6, [1] * 2 + [0] * 4, [1] * 5 + [0]], dtype=torch.bool)
    q = q.masked_fill(~q_valid[:, None, :, None], 1e6)  # padding far away: would dominate any mean
    k = k.masked_fill(~k_valid[:, None, :, None], 1e6)
    batches = [HeadInputs(q, k, q_valid, k_valid, causal=False, q_proj=q, k_proj=k)]
    one, three = KMeansPredictor(buckets=1, backend=backend), KMeansPredictor(buckets=3, backend=backend)
    one.fit(0, batches, seed=0)
    three.fit(0, batches, seed=0)
    assert one.layer_state(0)["centroids"].shape == (2, 1, 4)
    assert three.layer_state(0)["centroids"].shape == (2, 3, 4)
    for h in range(2):
        points = torch.cat([q[:, h][q_valid], k[:, h][k_valid]])
        assert torch.allclose(one.layer_state(0)["centroids"][h, 0], points.mean(0), atol=1e-5)
    assert (three.layer_state(0)["centroids"].abs() < 10).all()
    with pytest.raises(UserError, match="has no fitted state for layer 1"):
        three.predict(1, batches[0])


def test_top_k_shares_the_fitted_centroids():
    predictor = KMeansPredictor(buckets=4)
    predictor.set_layer_state(0, {"centroids": make_inputs()[2]})
    wider = predictor.with_knobs(top_k=2)
    assert wider.top_k == 2 and torch.equal(wider.layer_state(0)["centroids"], make_inputs()[2])
    assert predictor.with_knobs(buckets=6).state_layers == []  # other centroids: nothing to share


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"buckets": 0}, "kmeans.buckets must be an integer >= 1; got 0"),
        ({"buckets": 4, "top_k": 5}, "kmeans.top_k = 5 exceeds kmeans.buckets = 4"),
        ({"bucket": 4}, "predictor kmeans has no knob bucket"),
    ],
)
def test_bad_knobs_are_one_line_errors(knobs, message):
    with pytest.raises(UserError, match=message) as info:
        make_predictor("kmeans", **knobs)
    assert "\n" not in str(info.value)


def test_ties_go_to_the_lowest_centroid_index_for_every_top_k():
    """Points equidistant from several centroids: the nearest ids are the tied ones in index order, as the
    stable sort gives, for top-1 (a minimum) as for top-k."""
    centroids = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]])  # (1 head, 4, 2)
    points = torch.tensor([[[[0.0, 0.0], [1.0, 1.0], [-1.0, -1.0], [0.0, 2.0]]]])  # (1, 1, 4, 2)
    assert nearest_centroids(points, centroids, 1)[0, 0, :, 0].tolist() == [0, 0, 2, 1]
    assert nearest_centroids(points, centroids, 2)[0, 0].tolist() == [[0, 1], [0, 1], [2, 3], [1, 0]]


@pytest.mark.parametrize("top_k", [1, 3])
def test_nearest_centroids_rank_by_explicit_distances(top_k):
    """At the shapes a model uses (many tokens, 16 centroids, two batch rows), the ids are the explicit
    distances' stable ranking (float64: no near-tie is decided by rounding)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 257, 4, generator=gen, dtype=torch.float64)
    centroids = torch.randn(3, 16, 4, generator=gen, dtype=torch.float64)
    distances = (x[..., :, None, :] - centroids[None, :, None]).square().sum(-1)  # (2, 3, 257, 16)
    expected = distances.argsort(dim=-1, stable=True)[..., :top_k]
    assert torch.equal(nearest_centroids(x, centroids, top_k).long(), expected)


def test_nearest_centroids_of_points_that_carry_gradients():
    """Projections with trainable weights give points that require grad: the ids are computed all the same."""
    q, _, centroids, _, _ = make_inputs()
    ids = nearest_centroids(q.requires_grad_(), centroids.requires_grad_(), 2)
    assert torch.equal(ids, nearest_centroids(q.detach(), centroids.detach(), 2))
