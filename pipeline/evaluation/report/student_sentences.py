"""The sentences closing the students section: the best student, what fine-tuning did, each sparse student
against the dense control, and each against the best predictor point at its sparsity."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pipeline.evaluation.control import dense_control
from pipeline.evaluation.pareto import best_at_least, finite_number
from pipeline.evaluation.report.cells import difference, num, signed
from pipeline.evaluation.report.findings import gap_clause
from pipeline.evaluation.report.points import label, student_rows
from pipeline.evaluation.report.scores import Score, units, verbs
from pipeline.evaluation.report.verdicts import judged, reversed_entry

# A student is compared with the predictor points at sparsity ≥ its own − STUDENT_SLACK.
STUDENT_SLACK = 0.05


def best_student_sentence(
    students: Sequence[dict],
    teacher: dict,
    scores: Sequence[Score],
    tolerances: Mapping[str, float] | None = None,
) -> str:
    """Which student has the best first measure (ties: the sparser), at what sparsity, against the teacher
    (with evidence and ``tolerances``: the paired differences and their verdicts)."""
    primary = scores[0]
    best = best_at_least(
        students, x="sparsity", y=primary.key, x_min=-math.inf, maximize_y=primary.higher_is_better
    )
    if best is None:
        return f"No student has a {primary.name} score."
    adjective = "highest" if primary.higher_is_better else "lowest"
    lead = "The only student" if len(students) == 1 else f"The student with the {adjective} {primary.name}"
    if tolerances is not None and len(students) > 1:  # students are not compared pairwise: a point ranking
        lead = f"The student with the {adjective} {primary.name} point estimate"
    return (
        f"{lead} is {best['student']} ({verbs(scores)[0]} sparsity {best['sparsity']:.3f}); "
        f"{gap_clause(best, teacher, scores, tolerances)}."
    )


def fine_tuning_sentence(
    students: Sequence[dict], scores: Sequence[Score], tolerances: Mapping[str, float] | None = None
) -> str:
    """What fine-tuning with its own predicted graph did to each student that has an untrained twin (with
    evidence and ``tolerances``: the paired difference of the student from its twin, and its verdict)."""
    primary, others = scores[0], scores[1:]
    if tolerances is not None:
        clauses = []
        for row in students:
            before = (row.get("untrained") or {}).get("evidence") or {}
            compared = before.get("vs_student") or {}
            if not compared:
                continue
            scored = units(before["sentences"], scores)
            found = [
                judged(reversed_entry(compared[s.key], s.key), s.key, tolerances, scored)
                for s in scores
                if s.key in compared
            ]
            clauses.append(f"{row['student']} {' and '.join(found)}")
        if not clauses:
            return ""
        return (
            "Against its untrained twin (the teacher with the same predictor, before fine-tuning): "
            f"{'; '.join(clauses)}."
        )
    clauses = []
    for row in students:
        before = row.get("untrained")
        if (
            not before
            or finite_number(before.get(primary.key)) is None
            or finite_number(row[primary.key]) is None
        ):
            continue
        digits = primary.digits
        moved = [
            f"{primary.name} {before[primary.key]:.{digits}f} to {row[primary.key]:.{digits}f} "
            f"({row[primary.key] - before[primary.key]:+.{digits}f})",
            *(
                f"{score.name} {num(before.get(score.key), score.digits)} to "
                f"{num(row.get(score.key), score.digits)}"
                for score in others
            ),
        ]
        sparsity = f"{verbs(scores)[0]} sparsity {num(row['sparsity'], 3)}"
        clauses.append(f"{row['student']} from {' and '.join(moved)} at {sparsity}")
    return f"Fine-tuning with its own predicted graph takes {'; '.join(clauses)}." if clauses else ""


def control_sentence(
    students: Sequence[dict], scores: Sequence[Score], tolerances: Mapping[str, float] | None = None
) -> str:
    """Each sparse student against the dense control (a student with the teacher's own α-entmax, trained the
    same way): the cost of the sparsity alone ("" without a control); with evidence and ``tolerances``, the
    paired differences and their verdicts."""
    control = dense_control(students)
    primary = scores[0]
    if control is None or finite_number(control[primary.key]) is None:
        return ""
    if tolerances is not None:
        clauses = []
        for row in students:
            evidence = row.get("evidence") or {}
            compared = evidence.get("vs_dense") or {}
            if row is control or not compared:
                continue
            scored = units(evidence["sentences"], scores)
            found = [judged(compared[s.key], s.key, tolerances, scored) for s in scores if s.key in compared]
            clauses.append(f"{row['student']} {' and '.join(found)}")
        if not clauses:
            return ""
        return (
            f"Against the dense control ({control['student']}: the teacher trained further the same way, "
            f"with its own dense α-entmax): {'; '.join(clauses)}."
        )
    clauses = [
        f"{row['student']} "
        + ", ".join(
            f"{signed(difference(row.get(s.key), control.get(s.key)), s.digits)} {s.name}" for s in scores
        )
        for row in students
        if row is not control and finite_number(row[primary.key]) is not None
    ]
    if not clauses:
        return ""
    own = ", ".join(f"{s.name} {num(control.get(s.key), s.digits)}" for s in scores)
    return (
        f"Against the dense control ({control['student']}: the teacher trained further the same way, with "
        f"its own dense α-entmax; {own}): {'; '.join(clauses)}."
    )


def student_predictor_sentence(evaluation: dict, scores: Sequence[Score]) -> str:
    """Each student that runs sparsely against the predictor point with the best first measure at sparsity
    ≥ its own − :data:`STUDENT_SLACK` ("" when no student has such a point). Students that run densely have
    no sparsity to match, so they are left out."""
    primary = scores[0]
    key, digits = primary.key, primary.digits
    clauses = []
    for row in student_rows(evaluation):
        sparsity, value = finite_number(row["sparsity"]), finite_number(row[key])
        if not sparsity or value is None:
            continue
        point = best_at_least(
            evaluation["quality"]["points"],
            x="sparsity",
            y=key,
            x_min=sparsity - STUDENT_SLACK,
            maximize_y=primary.higher_is_better,
        )
        if point is None:
            continue
        clauses.append(
            f"{row['student']}'s {primary.name} {value:.{digits}f} at sparsity {sparsity:.3f} vs "
            f"{point[key]:.{digits}f} with {label(point)} at {point['sparsity']:.3f} "
            f"({value - point[key]:+.{digits}f})"
        )
    if not clauses:
        return ""
    adjective = "highest" if primary.higher_is_better else "lowest"
    return (
        f"Against the teacher {verbs(scores)[0]}, without fine-tuning, with the best predicted graphs "
        f"({adjective} {primary.name} at sparsity ≥ the student's − {STUDENT_SLACK:g}): {'; '.join(clauses)}."
    )
