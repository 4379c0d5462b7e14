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
from pipeline.evaluation.report.verdicts import TASK_MEASURES


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
    if evaluation.get("evidence"):
        summary["evidence"] = evidence_headline(evaluation, recall_target)
    return summary


def operating_points(evaluation: dict, recall_target: float) -> list[dict]:
    """Each method's decoded point at its operating point: the sparsest with graph recall ≥
    ``recall_target``, or its highest-recall one when none reaches it; in the evaluation's order, the
    recall-1 check (a window wider than any sentence, sparsity 0) left out."""
    chosen: dict[str, dict] = {}
    for point in evaluation["quality"]["points"]:
        recall = finite_number(point.get("graph_recall"))
        sparsity = finite_number(point.get("graph_sparsity"))
        if recall is None or not sparsity:
            continue
        held = chosen.get(point["method"])
        if held is None or _operating_key(point, recall_target) > _operating_key(held, recall_target):
            chosen[point["method"]] = point
    return list(chosen.values())


def _operating_key(point: dict, recall_target: float) -> tuple[bool, float]:
    """Points reaching the target first, the sparsest of them; then the highest recall."""
    reaches = point["graph_recall"] >= recall_target
    return reaches, point["graph_sparsity"] if reaches else point["graph_recall"]


def evidence_headline(evaluation: dict, recall_target: float) -> dict:
    """The headline's evidence, flat so that ``dvc metrics show`` reads it as a table: per row (each
    method's operating point by method name, each student as ``student:NAME``), its sparsity and recall,
    and per measure its value and its paired difference from the teacher with the 95 % interval
    (``d_bleu``, ``d_bleu_lo``, ``d_bleu_hi``; perplexity relative) and whether that interval excludes 0;
    the number of test units beside them."""
    evidence = evaluation["evidence"]
    rows = [
        *((point["method"], point) for point in operating_points(evaluation, recall_target)),
        *((f"student:{row['student']}", row) for row in student_rows(evaluation)),
    ]
    found: dict[str, dict] = {}
    for name, row in rows:
        own = row.get("evidence")
        if not own:
            continue
        entry = {"sparsity": own.get("sparsity"), "recall": own.get("recall")}
        compared = own.get("vs_teacher") or {}
        for key in (*TASK_MEASURES, "kl"):
            if key not in own:
                continue
            entry[key] = round(own[key]["value"], 4)
            if key in compared and key != "kl":
                difference = compared[key]
                entry[f"d_{key}"] = round(difference["diff"], 4)
                entry[f"d_{key}_lo"], entry[f"d_{key}_hi"] = (round(end, 4) for end in difference["ci95"])
                entry[f"d_{key}_significant"] = difference["significant"]
        found[name] = entry
    return {"units": evidence["rows"][0]["sentences"], "rows": found}
