"""Pareto fronts and threshold picks on hand-made point sets."""

from __future__ import annotations

import math

from pipeline.evaluation.pareto import best_at_least, front_dominates, pareto_front


def test_dominated_points_are_dropped_and_the_front_is_sorted_by_x():
    #            0           1           2           3           4
    points = [(0.9, 0.5), (0.5, 0.9), (0.6, 0.6), (0.7, 0.8), (0.5, 0.5)]
    # 2 is dominated by 3 (0.7 ≥ 0.6, 0.8 ≥ 0.6); 4 by 1 and 2
    assert pareto_front(points) == [1, 3, 0]


def test_equal_in_one_coordinate_and_worse_in_the_other_is_dominated():
    points = [(0.8, 0.4), (0.8, 0.6), (0.3, 0.6)]
    assert pareto_front(points) == [1]


def test_duplicates_keep_the_first_index():
    points = [(0.2, 0.9), (0.7, 0.7), (0.2, 0.9), (0.7, 0.7)]
    assert pareto_front(points) == [0, 1]


def test_minimised_second_coordinate():
    # sparsity up, perplexity down: (0.9, 6.0) beats (0.8, 7.0); (0.5, 5.0) is best in perplexity
    points = [(0.8, 7.0), (0.9, 6.0), (0.5, 5.0), (0.4, 5.5)]
    assert pareto_front(points, maximize=(True, False)) == [2, 1]
    # maximising both instead keeps only the highest-perplexity corner that is not beaten in sparsity
    assert pareto_front(points, maximize=(True, True)) == [0, 1]


def test_minimised_both():
    points = [(1.0, 1.0), (2.0, 0.5), (2.0, 2.0), (0.5, 3.0)]
    assert pareto_front(points, maximize=(False, False)) == [3, 0, 1]


def test_single_point_empty_and_nan():
    assert pareto_front([(0.3, 0.4)]) == [0]
    assert pareto_front([]) == []
    assert pareto_front([(math.nan, 1.0), (0.5, 0.5)]) == [1]


def test_front_dominates():
    learned = [(0.8, 0.95), (0.9, 0.9), (0.95, 0.7)]
    baseline = [(0.8, 0.9), (0.9, 0.6), (0.5, 0.99)]
    assert not front_dominates(learned, baseline)  # nothing in learned reaches (0.5, 0.99)
    assert front_dominates(learned, baseline[:2])
    assert not front_dominates(baseline[:2], learned)
    assert front_dominates(learned, [])
    assert not front_dominates([], baseline)


ROWS = [
    {"label": "a", "sparsity": 0.70, "recall": 0.99},
    {"label": "b", "sparsity": 0.82, "recall": 0.90},
    {"label": "c", "sparsity": 0.85, "recall": 0.90},
    {"label": "d", "sparsity": 0.93, "recall": 0.60},
    {"label": "e", "sparsity": None, "recall": 1.00},
]


def test_best_at_least_picks_the_best_y_and_breaks_ties_by_larger_x():
    assert best_at_least(ROWS, x="sparsity", y="recall", x_min=0.8)["label"] == "c"
    assert best_at_least(ROWS, x="sparsity", y="recall", x_min=0.9)["label"] == "d"
    assert best_at_least(ROWS, x="sparsity", y="recall", x_min=0.95) is None
    # null sparsity is ignored even though its recall is the highest
    assert best_at_least(ROWS, x="sparsity", y="recall", x_min=0.0)["label"] == "a"


def test_best_at_least_with_roles_swapped_and_minimised():
    # the sparsest setting with recall ≥ 0.9
    assert best_at_least(ROWS, x="recall", y="sparsity", x_min=0.9)["label"] == "c"
    # the least sparse setting with recall ≥ 0.9
    assert best_at_least(ROWS, x="recall", y="sparsity", x_min=0.9, maximize_y=False)["label"] == "a"
    assert best_at_least([], x="recall", y="sparsity", x_min=0.0) is None
