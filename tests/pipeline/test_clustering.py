"""Offline k-means: both backends seeded, no silent subsampling, padding excluded."""

import numpy as np
import pytest

from pipeline.clustering import fit_centroids, resolve_backend

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
def test_spherical_clusters_directions_not_magnitudes(backend):
    # three directions 53° apart, each at lengths from 0.5 to 20: plain k-means mixes near points of
    # neighbouring directions (its centroids land off the directions), spherical k-means does not
    directions = np.array([[1, 0, 0, 0], [0.6, 0.8, 0, 0], [0, 0.6, 0.8, 0]], dtype=np.float32)
    rng = np.random.default_rng(3)
    unit = np.concatenate([d + 0.02 * rng.standard_normal((100, 4)) for d in directions])
    points = (unit * rng.uniform(0.5, 20.0, (len(unit), 1))).astype(np.float32)
    centroids = fit_centroids(points, 3, seed=0, backend=backend, n_init=3, spherical=True)
    assert np.allclose(np.linalg.norm(centroids, axis=1), 1.0, atol=1e-5)
    cosines = directions @ centroids.T  # (direction, centroid)
    assert sorted(cosines.argmax(1)) == [0, 1, 2] and (cosines.max(1) > 0.999).all()
    again = fit_centroids(points, 3, seed=0, backend=backend, n_init=3, spherical=True)
    assert np.array_equal(centroids, again)
