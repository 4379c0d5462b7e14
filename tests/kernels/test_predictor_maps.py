"""The C++ predictor maps (attention_kernels.predictor_maps) against their tensor references."""

from __future__ import annotations

import pytest
import torch

from attention_kernels import predictor_maps
from attention_kernels.native import call
from attention_kernels.predictor_maps import head_mlp, nearest_by_tensors, nearest_centroid_ids, wide_kernel
from pipeline.predictors.kmeans import nearest_centroids
from pipeline.projection.model import HeadProjections
from tests.kernels.test_block_products import needs_vectors

pytestmark = pytest.mark.usefixtures("one_thread")


@needs_vectors
def test_the_wide_kernel_is_built_where_it_can_run():
    """Else every comparison below would be the reference against itself."""
    assert wide_kernel() is not None


def _projections(hidden, d, rank, seed):
    """A shared projector of 3 heads and its queries (2, 3, ·, d) for a few sequence lengths."""
    gen = torch.Generator().manual_seed(seed)
    return HeadProjections(3, d, rank, shared=True, hidden=hidden, generator=gen), gen


MLPS = [(32, 64, 4), (8, 24, 3), (40, 64, 17), (32, 128, 8)]  # d 64 and 128 are compiled apart
LINEAR = [(None, d, rank) for d, rank in [(64, 4), (20, 5), (20, 1), (128, 2), (24, 8), (33, 16), (16, 17)]]


@needs_vectors
@pytest.mark.parametrize(("hidden", "d", "rank"), MLPS + LINEAR)
@pytest.mark.parametrize("n", [0, 1, 11, 12, 13, 47, 64, 130])
def test_the_projection_equals_the_tensor_reference(hidden, d, rank, n, monkeypatch):
    """Widths that are not whole vectors (hidden 8 and 40, d 20, 24 and 33), more outputs than a vector's
    lanes (rank 17), linear ranks that divide a vector's lanes (1, 2, 4, 8, 16: lane sums) and others (5, 17:
    the product with Wᵀ), sequences around the kernel's tile of 12 tokens, and none."""
    module, gen = _projections(hidden, d, rank, seed=n)
    q = torch.randn(2, 3, n, d, generator=gen) * 2
    with torch.no_grad():
        found = module.project_queries(q)
        monkeypatch.setattr(predictor_maps, "wide_kernel", lambda: None)
        expected = module.project_queries(q)
    assert found.shape == expected.shape == (2, 3, n, rank)
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=2e-6)


@needs_vectors
@pytest.mark.parametrize("hidden", [31, 32, 33])
def test_an_infinite_coordinate_gives_the_references_outputs(hidden):
    """Hidden widths padded to the kernel's slices of 32 units: the padding adds nothing, not 0 · ∞ = NaN."""
    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(1, 2, 14, 16, generator=gen)
    x[0, 1, 5, 3] = float("inf")
    hidden_weight = torch.rand(2, hidden, 16, generator=gen) + 0.1  # every unit of the token saturates
    maps = (torch.randn(2, 4, hidden, generator=gen), torch.randn(2, 4, generator=gen))
    found = head_mlp(x, *maps, hidden_weight, torch.zeros(2, hidden))
    expected = torch.tanh(x @ hidden_weight.mT) @ maps[0].mT + maps[1][:, None]
    assert torch.isfinite(found).all()
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=2e-6)


def test_with_gradients_or_in_float64_the_tensor_path_runs():
    """head_mlp declines (None), and the module's own layers give values and gradients."""
    module, gen = _projections(8, 16, 4, seed=1)
    q = torch.randn(1, 3, 9, 16, generator=gen, requires_grad=True)
    weights = (module.q_weight, module.q_bias, module.q_hidden_weight, module.q_hidden_bias)
    assert head_mlp(q, *weights) is None
    module.project_queries(q).square().sum().backward()
    assert q.grad is not None and module.q_hidden_weight.grad is not None
    with torch.no_grad():
        assert head_mlp(q.double(), *(w.double() for w in weights)) is None
        low = module.double().project_queries(q.double())
    assert low.dtype == torch.float64


def _points(heads, n, rank, count, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, heads, n, rank, generator=gen), torch.randn(heads, count, rank, generator=gen)


@needs_vectors
@pytest.mark.parametrize(("count", "top_k"), [(1, 1), (5, 2), (16, 1), (16, 2), (16, 16), (33, 3)])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 64, 300])
@pytest.mark.parametrize("rank", [1, 3, 4, 8, 16])  # powers of two unzipped, 3 gathered
def test_nearest_centroids_equal_the_tensor_reference(count, top_k, n, rank):
    points, centroids = _points(3, n, rank, count, seed=count * n + rank)
    found = nearest_centroid_ids(points, centroids, top_k)
    assert found is not None and found.dtype == torch.int32
    expected = nearest_by_tensors(points, centroids, top_k)
    # The two sum e_j in different orders: where two centroids' e_j are a rounding apart, either may come
    # first; the energies of the ids taken must still agree, rank by rank, to round-off.
    energy = centroids.double().square().sum(-1)[None, :, None] - 2 * points.double() @ centroids.double().mT
    taken, wanted = (energy.gather(-1, ids.long()) for ids in (found, expected))
    torch.testing.assert_close(taken, wanted, rtol=0, atol=1e-5 * float(energy.abs().max()))
    assert (found == expected).float().mean() > 0.99


@needs_vectors
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 8, 16])
def test_ties_among_whole_number_points_match_the_reference_exactly(rank, top_k):
    """Small whole numbers make every e_j exact on both paths and ties frequent: the ids agree one for one,
    ties to the lower index, through full chunks of 64 points and a partial one."""
    gen = torch.Generator().manual_seed(rank * 10 + top_k)
    points = torch.randint(-2, 3, (2, 3, 130, rank), generator=gen).float()
    centroids = torch.randint(-2, 3, (3, 7, rank), generator=gen).float()
    assert torch.equal(
        nearest_centroid_ids(points, centroids, top_k), nearest_by_tensors(points, centroids, top_k)
    )


@needs_vectors
@pytest.mark.parametrize("seed", range(4))
def test_infinite_points_beside_finite_ones_give_the_references_ids(seed):
    """A chunk holding points with infinite or NaN coordinates reads ±∞ and NaN energies as the reference
    does (and repeats no id); the finite points beside it, and in the chunks around it, keep their ids."""
    gen = torch.Generator().manual_seed(seed)
    points, centroids = _points(2, 200, 4, 16, seed=9 + seed)
    centroids[0, 3, 1] = 0.0  # ∞ · 0: a NaN energy among infinite ones
    hit = torch.rand(points.shape, generator=gen) < 0.02
    special = torch.tensor([float("inf"), -float("inf"), float("nan")])[
        torch.randint(0, 3, points.shape, generator=gen)
    ]
    points = torch.where(hit, special, points)
    for top_k in (1, 2, 3, 16):
        found = nearest_centroid_ids(points, centroids, top_k)
        assert torch.equal(found, nearest_by_tensors(points, centroids, top_k))
        assert (found.sort(-1).values.diff(dim=-1) > 0).all()


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_vectors), False])
def test_ties_go_to_the_lower_index_and_nan_points_to_the_first(native, monkeypatch):
    """Centroids 1 and 3 are one point: a point nearest it takes 1, then 3. A NaN point takes 0, 1, ..."""
    if not native:
        monkeypatch.setattr(predictor_maps, "wide_kernel", lambda: None)
    centroids = torch.tensor([[[5.0, 5.0], [1.0, 0.0], [-3.0, 0.0], [1.0, 0.0]]])  # (1, 4, 2)
    points = torch.tensor([[[[1.1, 0.0], [float("nan"), 0.0], [-2.0, 0.0]]]])  # (1, 1, 3, 2)
    ids = nearest_centroids(points, centroids, 3, torch.tensor([[True, True, False]]))
    assert ids.tolist() == [[[[1, 3, 2], [0, 1, 2], [-1, -1, -1]]]]


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_vectors), False])
def test_a_later_pass_tells_apart_energies_that_a_difference_would_round_together(native, monkeypatch):
    """e = (−1e8, −9999.75, −10001.75): after the nearest, −10001.75 is the next, though the differences
    from −1e8 of the two round to one float."""
    if not native:
        monkeypatch.setattr(predictor_maps, "wide_kernel", lambda: None)
    points, centroids = (
        torch.tensor([1e4]).view(1, 1, 1, 1),
        torch.tensor([[1e4], [0.5], [0.5001]]).view(1, 3, 1),
    )
    assert nearest_centroids(points, centroids, 2).tolist() == [[[[0, 2]]]]


@needs_vectors
def test_a_nan_centroid_gives_the_references_ids_and_no_repeats():
    """A NaN centroid's every e_j is NaN, read as 0 on both paths: the ids agree, and no token holds one
    twice (the planner's contract), though fewer finite centroids are left than top_k."""
    points, centroids = _points(2, 40, 4, 3, seed=7)
    centroids[1, 0] = float("nan")
    found = nearest_centroid_ids(points, centroids, 3)
    assert torch.equal(found, nearest_by_tensors(points, centroids, 3))
    assert (found.sort(-1).values.diff(dim=-1) > 0).all()


def test_top_k_outside_the_centroids_is_refused():
    points, centroids = _points(1, 4, 4, 2, seed=8)
    for top_k in (0, 3):
        with pytest.raises(ValueError, match=rf"top_k must be in \[1, 2\], got {top_k}"):
            nearest_centroids(points, centroids, top_k)


@needs_vectors
def test_results_do_not_depend_on_the_number_of_threads():
    module, gen = _projections(32, 64, 4, seed=5)
    q = torch.randn(2, 3, 200, 64, generator=gen)
    centroids = torch.randn(3, 16, 4, generator=gen)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.no_grad():
            low = module.project_queries(q)
        results.append((low, nearest_centroid_ids(low, centroids, 2)))
    torch.set_num_threads(1)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@needs_vectors
def test_running_out_of_memory_is_a_memory_error():
    """The layout of 2⁵² centroids cannot be allocated: a MemoryError, not an abort. Nothing is read."""
    points, centroids = _points(1, 0, 4, 1, seed=0)
    ids = torch.empty(0, dtype=torch.int32)
    with pytest.raises(MemoryError, match="nearest_centroids_float ran out of memory"):
        call(wide_kernel(), "nearest_centroids_float", points, centroids, 1, 1, 0, 4, 2**52, 1, ids)
