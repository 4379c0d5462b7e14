"""The report's associative-recall section: accuracy overall, near and far, each with its interval, and the
verdict on each model's paired difference from the teacher."""

from __future__ import annotations

from pipeline.evaluation.report.recall import recall_section

TOLERANCES = {"accuracy": 0.01}


def entry(value: float, low: float, high: float) -> dict:
    return {"value": value, "ci95": [low, high]}


def diff(value: float, low: float, high: float) -> dict:
    return {"diff": value, "ci95": [low, high], "significant": low > 0 or high < 0}


def row(name: str, kind: str, sparsity: float, overall: tuple, near: tuple, far: tuple, **versus) -> dict:
    found = {"name": name, "kind": kind, "sparsity": sparsity, "recall": 1.0, "sentences": 256}
    found |= {"accuracy": entry(*overall), "accuracy_near": entry(*near), "accuracy_far": entry(*far)}
    if versus:
        found["vs_teacher"] = {key: diff(*value) for key, value in versus.items()}
    return found


def evaluation(task: str = "mqar") -> dict:
    teacher = row("teacher", "teacher", 0.97, (0.99, 0.985, 0.995), (1.0, 1.0, 1.0), (0.98, 0.97, 0.99))
    local = row(
        "window() w=63 g=0",
        "point",
        0.9,
        (0.6, 0.55, 0.65),
        (0.99, 0.98, 1.0),
        (0.21, 0.15, 0.27),
        accuracy=(-0.39, -0.44, -0.34),
        accuracy_far=(-0.77, -0.83, -0.71),
    )
    exact = row(
        "indexer(rank=8) w=0 g=0",
        "point",
        0.96,
        (0.99, 0.985, 0.995),
        (1.0, 1.0, 1.0),
        (0.98, 0.97, 0.99),
        accuracy=(0.0, -0.002, 0.002),
        accuracy_far=(0.0, -0.004, 0.004),
    )
    return {"task": task, "far_gap": 57, "evidence": {"rows": [teacher, local, exact]}}


def test_each_model_has_its_accuracy_near_and_far_with_intervals_and_a_verdict() -> None:
    lines = recall_section(evaluation(), TOLERANCES).splitlines()
    assert "near (key ≤ 57 back)" in lines[0] and "far (key > 57 back)" in lines[0]
    teacher, local, exact = lines[2:5]
    assert "0.990 [0.985, 0.995]" in teacher and teacher.endswith("| — |")
    # a window that keeps nearby keys loses the far answers: significantly worse than the teacher
    assert "0.210 [0.150, 0.270]" in local and "−0.770 [−0.830, −0.710]" in local
    assert local.endswith("| worse |")
    assert exact.endswith("| keeps |")
    assert "256 test examples" in lines[-1] and "±0.01" in lines[-1]


def test_other_tasks_and_evaluations_without_evidence_have_no_such_section() -> None:
    assert recall_section(evaluation("lm"), TOLERANCES) is None
    assert recall_section({"task": "mqar", "far_gap": 3}, TOLERANCES) is None
