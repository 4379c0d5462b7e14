"""Which setting of a method the speed table runs: the sparsest within a perplexity gap of the teacher, or
by recall."""

from __future__ import annotations

import pytest

from pipeline.evaluation.run import speed_setting
from pipeline.params.evaluate import Evaluate, Speed

TEACHER = {"perplexity": 60.0}


def graph(label: str, sparsity: float, recall: float, method: str = "kmeans") -> tuple[str, dict]:
    """A (setting, graph row) pair; the setting stands for itself by its label."""
    return label, {"method": method, "label": label, "sparsity": sparsity, "recall": recall}


ROWS = [
    graph("dense-ish", 0.30, 0.99),
    graph("middle", 0.70, 0.90),
    graph("sparse", 0.92, 0.55),
    graph("sparsest", 0.97, 0.20),
    graph("other method", 0.99, 0.99, method="indexer"),
]
POINTS = [  # the quality sweep's points (perplexity measured on the model attending each graph)
    {"method": "kmeans", "label": "middle", "perplexity": 60.5},
    {"method": "kmeans", "label": "sparse", "perplexity": 62.4},
    {"method": "kmeans", "label": "sparsest", "perplexity": 75.0},
    {"method": "indexer", "label": "other method", "perplexity": 60.1},
]


def params(**speed) -> Evaluate:
    return Evaluate(speed=Speed(contexts=[1024], **speed))


@pytest.mark.parametrize(
    ("gap", "expected"),
    [(0.05, "sparse"), (0.01, "middle"), (0.5, "sparsest"), (0.0, "dense-ish")],
)
def test_the_sparsest_point_within_the_perplexity_gap_runs(gap: float, expected: str) -> None:
    setting, row, reason = speed_setting(params(perplexity_gap=gap), ROWS, "kmeans", TEACHER, POINTS)
    assert setting == expected and row["label"] == expected
    # no point within 0 % of the teacher: the recall rule (sparsest with recall ≥ 0.95)
    assert reason == ("recall" if gap == 0.0 else "perplexity")


def test_without_a_gap_the_recall_target_decides() -> None:
    setting, _, reason = speed_setting(params(), ROWS, "kmeans", TEACHER, POINTS)
    assert (setting, reason) == ("dense-ish", "recall")
    setting, _, reason = speed_setting(params(recall_target=0.5), ROWS, "kmeans", TEACHER, POINTS)
    assert (setting, reason) == ("sparse", "recall")
    # no setting reaches the target: the method's highest-recall one
    setting, _, _ = speed_setting(params(recall_target=1.0), ROWS, "kmeans", TEACHER, POINTS)
    assert setting == "dense-ish"


def test_a_point_of_another_method_is_never_chosen() -> None:
    setting, _, reason = speed_setting(params(perplexity_gap=0.005), ROWS, "kmeans", TEACHER, POINTS)
    assert (setting, reason) == ("dense-ish", "recall")  # "other method" is within 0.5 % but is the indexer's
