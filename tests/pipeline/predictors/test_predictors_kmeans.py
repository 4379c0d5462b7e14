"""k-means predictor against nearest-centroid search written as plain loops."""

import pytest
import torch

from pipeline.predictors.buckets import buckets_to_mask
from pipeline.predictors.kmeans import kmeans_buckets, kmeans_mask, nearest_centroids


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
def test_mask_matches_loops_and_bucket_ids(top_k):
    q, k, centroids, q_valid, k_valid = make_inputs()
    mask = kmeans_mask(q, k, centroids, top_k, q_valid, k_valid)
    for b in range(2):
        for h in range(2):
            for i in range(5):
                for j in range(6):
                    shared = set(loop_top_k(q[b, h, i].tolist(), centroids[h].tolist(), top_k)) & set(
                        loop_top_k(k[b, h, j].tolist(), centroids[h].tolist(), top_k)
                    )
                    expected = bool(shared) and bool(q_valid[b, i]) and bool(k_valid[b, j])
                    assert mask[b, h, i, j].item() == expected
    assert torch.equal(buckets_to_mask(*kmeans_buckets(q, k, centroids, top_k, q_valid, k_valid)), mask)


def test_every_valid_query_gets_a_cluster():
    q, _, centroids, q_valid, _ = make_inputs()
    ids = nearest_centroids(q, centroids, 1, q_valid)
    assert ((ids >= 0).squeeze(-1) == q_valid[:, None, :]).all()


def test_top_k_out_of_range_is_rejected():
    q, _, centroids, _, _ = make_inputs()
    with pytest.raises(ValueError, match="top_k"):
        nearest_centroids(q, centroids, 5)
