"""The evaluation grid: which predictors a grid names, and which of them are translated."""

from __future__ import annotations

import pytest
import torch

from pipeline.errors import UserError
from pipeline.evaluation.quality import choose_points
from pipeline.evaluation.sweep import grid_predictors, label, varying_knobs
from pipeline.predictors import (
    BigBirdPredictor,
    DistancePredictor,
    KMeansPredictor,
    QuantizationPredictor,
    WindowPredictor,
)
from pipeline.predictors.scoring import Setting


def stored_kmeans() -> list[KMeansPredictor]:
    """k-means states for B ∈ {2, 4} as the cluster stage stores them (iterations from its params)."""
    stored = []
    for buckets in (2, 4):
        predictor = KMeansPredictor(buckets=buckets, iterations=5, backend="sklearn")
        predictor.set_layer_state(0, {"centroids": torch.zeros(1, buckets, 2)})
        stored.append(predictor)
    return stored


def test_stateless_grids_are_the_product_of_their_knobs():
    predictors = grid_predictors("distance", {"threshold": [0.5, 1.0]}, [], "state.safetensors")
    assert [p.threshold for p in predictors] == [0.5, 1.0]
    assert grid_predictors("window", {}, [], "state.safetensors") == [WindowPredictor()]


def test_fitted_grids_choose_stored_states_and_multiply_the_other_knobs():
    predictors = grid_predictors("kmeans", {"top_k": [1, 2]}, stored_kmeans(), "state.safetensors")
    assert [(p.buckets, p.top_k, p.iterations) for p in predictors] == [
        (2, 1, 5),
        (2, 2, 5),
        (4, 1, 5),
        (4, 2, 5),
    ]
    # the top-k variants share the stored centroids
    assert predictors[1].layer_state(0)["centroids"].shape == (1, 2, 2)
    only_four = grid_predictors("kmeans", {"buckets": [4]}, stored_kmeans(), "state.safetensors")
    assert [p.buckets for p in only_four] == [4]


@pytest.mark.parametrize(
    ("method", "grid", "message"),
    [
        ("kmeans", {"buckets": [8]}, r"kmeans.buckets = 8: .* with buckets = 8 \(fitted: \[2, 4\]\)"),
        ("routing", {}, "holds no fitted routing state"),
        ("lsh", {}, "unknown predictor; allowed:"),
        ("distance", {"threshold": [-1]}, "distance.threshold must be a number >= 0"),
    ],
)  # fmt: skip
def test_grid_errors_name_the_params_key(method, grid, message):
    with pytest.raises(UserError, match=message):
        grid_predictors(method, grid, stored_kmeans(), "state.safetensors")


def test_labels_name_the_knobs_that_vary():
    predictors = grid_predictors("kmeans", {"top_k": [1, 2]}, stored_kmeans(), "state.safetensors")
    keys = varying_knobs(predictors)
    assert keys == ["buckets", "top_k"]
    assert label(predictors[3], keys, 3, 1) == "kmeans(buckets=4, top_k=2) w=3 g=1"


def row(predictor, sparsity: float, recall: float, window: int = 0) -> tuple[Setting, dict]:
    return Setting(predictor, window), {"method": predictor.name, "sparsity": sparsity, "recall": recall}


def test_quality_points_are_each_runnable_methods_front_above_the_sparsity_floor():
    d = [DistancePredictor(threshold=t) for t in (0.5, 1.0, 2.0, 3.0)]
    rows = [
        row(d[0], 0.95, 0.40),
        row(d[1], 0.90, 0.60),
        row(d[2], 0.85, 0.55),  # dominated by d[1]
        row(d[3], 0.60, 0.99),  # below the floor
        row(WindowPredictor(), 0.92, 0.50, window=3),
        row(BigBirdPredictor(random_keys=2), 0.95, 0.90),  # random by batch position: a decoder cannot run it
        row(QuantizationPredictor(bins=4), 0.95, 0.90),  # ranks over the sentence: neither
    ]
    chosen = choose_points(rows, "decoder_self", min_sparsity=0.8, per_method=5)
    assert [(s.predictor, r["sparsity"]) for s, r in chosen] == [
        (d[1], 0.90),
        (d[0], 0.95),
        (WindowPredictor(), 0.92),
    ]
    # quantization runs in the encoder, whose whole sentence is known at once
    encoder = choose_points(rows, "encoder_self", min_sparsity=0.8, per_method=5)
    assert "quantization" in [r["method"] for _, r in encoder]


def test_a_long_front_is_thinned_evenly_keeping_its_highest_recall_point():
    d = [DistancePredictor(threshold=t / 10) for t in range(1, 8)]
    rows = [row(p, 0.9 + i / 100, 0.8 - i / 10) for i, p in enumerate(d)]
    chosen = choose_points(rows, "decoder_self", min_sparsity=0.5, per_method=3)
    assert [r["recall"] for _, r in chosen] == pytest.approx([0.8, 0.5, 0.2])


def test_a_knob_that_replaces_another_gives_each_predictor_once():
    grid = {"bins": [2, 4], "tokens_per_bin": [None, 8]}
    predictors = grid_predictors("quantization", grid, [], "state.safetensors")
    assert [(p.bins, p.tokens_per_bin) for p in predictors] == [(2, None), (None, 8), (4, None)]


def test_a_recall_target_adds_each_methods_sparsest_setting_reaching_it():
    d = [DistancePredictor(threshold=t / 10) for t in range(1, 6)]
    rows = [row(p, 0.9 + i / 100, 0.999 - i / 200) for i, p in enumerate(d)]  # recall 0.999 … 0.979
    chosen = choose_points(rows, "decoder_self", min_sparsity=0.5, per_method=1, recall_targets=[0.99, 0.5])
    # the front's highest-recall point, the sparsest at recall ≥ 0.99, the sparsest of all (≥ 0.5)
    assert [r["sparsity"] for _, r in chosen] == pytest.approx([0.90, 0.91, 0.94])
    again = choose_points(rows, "decoder_self", min_sparsity=0.5, per_method=5, recall_targets=[0.99])
    assert len(again) == 5  # a target point already on the front is decoded once
