"""Offline k-means: both backends seeded, no silent subsampling, padding excluded."""

import numpy as np
import pytest
import torch

from pipeline.clustering import fit_centroids, fit_layer_centroids, resolve_backend

BACKENDS = ["faiss", "sklearn"]
CENTRES = np.array([[0.0, 0.0, 0.0, 0.0], [5.0, 5.0, 0.0, 0.0], [0.0, 5.0, 5.0, 0.0]], dtype=np.float32)


def blobs(seed, per_blob=100):
    rng = np.random.default_rng(seed)
    points = np.concatenate([c + 0.1 * rng.standard_normal((per_blob, 4)) for c in CENTRES])
    return rng.permutation(points).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_centroids(backend):
    points = np.random.default_rng(0).standard_normal((300, 4)).astype(np.float32)
    a = fit_centroids(points, 6, seed=3, backend=backend)
    b = fit_centroids(points, 6, seed=3, backend=backend)
    assert a.shape == (6, 4) and a.dtype == np.float32
    assert np.array_equal(a, b)
    assert not np.array_equal(a, fit_centroids(points, 6, seed=4, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_separated_blobs_are_recovered(backend):
    centroids = fit_centroids(blobs(1), 3, seed=0, backend=backend, n_init=3)
    found = centroids[np.lexsort(centroids.T[::-1])]
    expected = CENTRES[np.lexsort(CENTRES.T[::-1])]
    assert np.allclose(found, expected, atol=0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_point_is_used(backend):
    # one centroid is the mean of the training points; faiss's default cap (256 per centroid) would
    # silently fit it on a subsample of these 2000 points instead
    points = np.random.default_rng(2).exponential(size=(2000, 4)).astype(np.float32)
    centroid = fit_centroids(points, 1, seed=0, backend=backend)
    assert np.allclose(centroid[0], points.mean(0), atol=1e-4)


def test_explicit_cap_subsamples_with_faiss():
    points = np.random.default_rng(2).exponential(size=(2000, 4)).astype(np.float32)
    centroid = fit_centroids(points, 1, seed=0, backend="faiss", max_points_per_centroid=50)
    assert not np.allclose(centroid[0], points.mean(0), atol=1e-4)


def test_too_few_points_and_unknown_backend_are_rejected():
    with pytest.raises(ValueError, match="cannot fit 4 centroids to 3 points"):
        fit_centroids(np.zeros((3, 2), dtype=np.float32), 4)
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("annoy")
    assert resolve_backend("auto") == "faiss"


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_centroids_per_head_without_padding(backend):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 5, 4, generator=gen)
    k = torch.randn(3, 2, 6, 4, generator=gen)
    q_valid = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0]], dtype=torch.bool)
    k_valid = torch.tensor([[1] * 6, [1] * 2 + [0] * 4, [1] * 5 + [0]], dtype=torch.bool)
    q = q.masked_fill(~q_valid[:, None, :, None], 1e6)  # padding far away: would dominate any mean
    k = k.masked_fill(~k_valid[:, None, :, None], 1e6)
    out = fit_layer_centroids(q, k, q_valid, k_valid, [1, 3], seed=0, backend=backend)
    assert sorted(out) == [1, 3]
    assert out[1].shape == (2, 1, 4) and out[3].shape == (2, 3, 4) and out[3].dtype == torch.float32
    for h in range(2):
        points = torch.cat([q[:, h][q_valid], k[:, h][k_valid]])
        assert torch.allclose(out[1][h, 0], points.mean(0), atol=1e-5)
    assert (out[3].abs() < 10).all()
