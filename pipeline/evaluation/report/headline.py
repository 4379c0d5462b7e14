"""The headline JSON declared as a DVC metric: gold and teacher numbers, per-method threshold values, the
best setting and the students' quality."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.evaluation.pareto import finite_number
from pipeline.evaluation.report.points import (
    field,
    label,
    quality_at,
    recall_at_sparsity,
    rows_by_method,
    sparsity_at_recall,
    student_rows,
    teacher_quality,
)
from pipeline.evaluation.report.scores import task_scores


def headline(evaluation: dict, *, sparsity_levels: Sequence[float], recall_target: float) -> dict:
    """The small metrics JSON: gold and teacher numbers, per-method threshold values, the best setting, and
    each student's quality when there are students.

    ``best`` is the sparsest setting of any method with recall ≥ ``recall_target`` (its fields are null when
    no setting reaches it), with the task's measures (:func:`task_scores`) of running with it when they
    were measured. ``students`` maps each student's name to its measures and sparsity; no wall times, so
    the headline stays a function of the inputs.
    """
    teacher = teacher_quality(evaluation)
    keys = [score.key for score in task_scores(evaluation)]
    methods = {}
    for method, rows in rows_by_method(evaluation["graphs"]).items():
        values = {
            f"recall_at_sparsity_{level:g}": field(recall_at_sparsity(rows, level), "recall")
            for level in sparsity_levels
        }
        values[f"sparsity_at_recall_{recall_target:g}"] = field(
            sparsity_at_recall(rows, recall_target), "sparsity"
        )
        methods[method] = values
    best = sparsity_at_recall(evaluation["graphs"], recall_target)
    point = quality_at(evaluation, best)
    summary = {
        "gold_sparsity": finite_number(evaluation["gold_sparsity"]),
        **{f"teacher_{key}": finite_number(teacher.get(key)) for key in keys},
        "methods": methods,
        "best": {
            "method": best["method"] if best else None,
            "label": label(best) if best else None,
            "sparsity": field(best, "sparsity"),
            "recall": field(best, "recall"),
            **{key: field(point, key) for key in keys},
        },
    }
    students = student_rows(evaluation)
    if students:
        summary["students"] = {
            row["student"]: {key: field(row, key) for key in (*keys, "sparsity")} for row in students
        }
    return summary
