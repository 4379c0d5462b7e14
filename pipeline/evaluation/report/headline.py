"""What the report declares as DVC metrics: the headline JSON (gold and teacher numbers, per-method
threshold values, the best setting and the students' quality) and the Results table's rows, one file each."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.evaluation.pareto import finite_number, operating_rows
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
from pipeline.evaluation.report.verdicts import difference_text, task_measures, value_text


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


def operating_points(evaluation: dict, recall_target: float) -> list[dict]:
    """Each method's decoded point at its operating point
    (:func:`~pipeline.evaluation.pareto.operating_rows`): the sparsest with graph recall ≥
    ``recall_target``, or its highest-recall one when none reaches it; in the evaluation's order, the
    recall-1 check (a window wider than any sentence, sparsity 0) and the points measured teacher-forced
    alone (``decoded`` false) left out."""
    candidates = [
        point
        for point in evaluation["quality"]["points"]
        if finite_number(point.get("graph_recall")) is not None
        and finite_number(point.get("graph_sparsity"))
        and point.get("decoded", True)
    ]
    return operating_rows(candidates, recall_target, sparsity="graph_sparsity", recall="graph_recall")


def headline_rows(evaluation: dict, recall_target: float) -> dict[str, dict]:
    """The Results table as one flat entry per row, keyed by the file name ``dvc metrics show`` lists it
    under (``00-teacher``, ``01-window``, …, ``07-student-ssa``), so that it prints one line per model.

    The rows are the teacher, each method's operating point (:func:`operating_points`) and each student;
    each entry holds the row's sparsity, graph recall (predicted graphs) and test units, and per measure
    the task's own measures, each with its 95 % interval, and their paired differences from the teacher with
    theirs (``d_bleu``; perplexity relative), and KL to the teacher, written as the report writes them; {}
    without evidence."""
    if not evaluation.get("evidence"):
        return {}
    rows = [
        ("teacher", evaluation["quality"]["teacher"]),
        *((point["method"], point) for point in operating_points(evaluation, recall_target)),
        *((f"student-{row['student']}", row) for row in student_rows(evaluation)),
    ]
    found: dict[str, dict] = {}
    for name, row in rows:
        own = row.get("evidence")
        if not own:
            continue
        entry: dict = {"sparsity": _rounded(own.get("sparsity")), "recall": _rounded(own.get("recall"))}
        entry[evaluation["evidence"]["units"]] = own["sentences"]
        compared = own.get("vs_teacher") or {}
        for key in task_measures(own):
            entry[key] = value_text(own[key], key)
            if key in compared:
                entry[f"d_{key}"] = difference_text(compared[key], key)
        if compared and "kl" in own:  # KL is to the teacher already: no difference, and none for itself
            entry["kl"] = value_text(own["kl"], "kl")
        found[f"{len(found):02d}-{name}"] = {k: v for k, v in entry.items() if v is not None}
    return found


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
