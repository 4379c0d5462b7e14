"""The section "Findings": sentences generated from the numbers (the best recall at each sparsity level,
which baselines' fronts a learned method dominates, and where the recall target is reached at what cost)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.evaluation.pareto import finite_number, front_dominates
from pipeline.evaluation.report.cells import difference
from pipeline.evaluation.report.points import (
    LEARNED,
    finite_points,
    highest_recall,
    label,
    quality_at,
    recall_at_sparsity,
    rows_by_method,
    sparsity_at_recall,
    teacher_quality,
)
from pipeline.evaluation.report.scores import Score, task_scores, units, verbs
from pipeline.evaluation.report.verdicts import judged


def findings(
    evaluation: dict, levels: Sequence[float], target: float, tolerances: Mapping[str, float] | None = None
) -> str:
    sentences = [
        _best_recall_sentence(evaluation["graphs"], levels),
        _dominance_sentence(evaluation["graphs"]),
        _operating_sentence(evaluation, target, tolerances),
    ]
    return " ".join(s for s in sentences if s)


def _best_recall_sentence(rows: Sequence[dict], levels: Sequence[float]) -> str:
    """Which method has the best recall at each sparsity level."""
    clauses = []
    for i, level in enumerate(levels):
        row = recall_at_sparsity(rows, level)
        if row is None:
            clauses.append(f"no setting reaches sparsity ≥ {level:g}")
            continue
        found = f"{row['method']}'s ({row['recall']:.3f}, {label(row)})"
        lead = f"The best recall at sparsity ≥ {level:g} is" if i == 0 else f"at sparsity ≥ {level:g} it is"
        clauses.append(f"{lead} {found}")
    text = "; ".join(clauses) + "."
    return text[0].upper() + text[1:]


def _dominance_sentence(rows: Sequence[dict]) -> str:
    """Which baselines' sparsity–recall fronts a learned method's front dominates ("" without both kinds)."""
    points = {m: finite_points(r, "sparsity", "recall")[0] for m, r in rows_by_method(rows).items()}
    points = {m: p for m, p in points.items() if p}
    learned = [m for m in points if m in LEARNED]
    baselines = [m for m in points if m not in LEARNED]
    if not learned or not baselines:
        return ""
    by = {b: [a for a in learned if front_dominates(points[a], points[b])] for b in baselines}
    beaten = [b for b in baselines if by[b]]
    standing = [b for b in baselines if not by[b]]
    if not beaten:
        return (
            f"No learned method's sparsity–recall front Pareto-dominates a baseline's "
            f"({', '.join(baselines)})."
        )
    detail = "; ".join(f"{b} by {', '.join(by[b])}" for b in beaten)
    if not standing:
        return f"Every baseline's sparsity–recall front is Pareto-dominated by a learned method ({detail})."
    return (
        f"The sparsity–recall fronts of {', '.join(beaten)} are Pareto-dominated by a learned method "
        f"({detail}); those of {', '.join(standing)} are not."
    )


def _operating_sentence(evaluation: dict, target: float, tolerances: Mapping[str, float] | None) -> str:
    """Where the best method reaches the recall target, and what decoding with that graph costs."""
    best = sparsity_at_recall(evaluation["graphs"], target)
    if best is None:
        top = highest_recall(evaluation["graphs"])
        if top is None:
            return f"No setting reaches recall ≥ {target:g}."
        return (
            f"No setting reaches recall ≥ {target:g}; the highest recall is {top['method']}'s "
            f"{top['recall']:.3f} at sparsity {top['sparsity']:.3f} ({label(top)})."
        )
    found = (
        f"At recall ≥ {target:g} the sparsest setting is {best['method']}'s: sparsity {best['sparsity']:.3f} "
        f"with {label(best)} (recall {best['recall']:.3f})"
    )
    scores = task_scores(evaluation)
    point = quality_at(evaluation, best)
    return f"{found}; {gap_clause(point, teacher_quality(evaluation), scores, tolerances)}."


def gap_clause(
    point: dict | None,
    teacher: dict,
    scores: Sequence[Score],
    tolerances: Mapping[str, float] | None = None,
) -> str:
    """The task's measures with a setting's graph (or of a student), and their gaps to the teacher's: with
    the row's evidence and ``tolerances``, each paired difference with its interval and verdict."""
    names = " and ".join(score.name for score in scores)
    gerund, participle = verbs(scores)
    if point is None:
        verb = "are" if len(scores) > 1 else "is"
        return f"it was not {participle} with its predicted graph, so its {names} {verb} not measured"
    evidence = point.get("evidence") or {}
    compared = evidence.get("vs_teacher") or {}
    if tolerances is not None and any(score.key in compared for score in scores):
        scored = units(evidence["sentences"], scores)
        clauses = [judged(compared[s.key], s.key, tolerances, scored) for s in scores if s.key in compared]
        return f"against the teacher it {_and(clauses)}"
    parts = []
    for score in scores:
        key, digits = score.key, score.digits
        value = finite_number(point.get(key))
        if value is None:
            continue
        gap = difference(value, teacher.get(key))
        versus = "" if gap is None else f" ({gap:+.{digits}f} vs the teacher's {teacher[key]:.{digits}f})"
        parts.append(f"{score.name} {value:.{digits}f}{versus}")
    if not parts:
        return f"{gerund} with it gave no {names}"
    return f"{gerund} with it gives " + " and ".join(parts)


def _and(clauses: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return clauses[0] if len(clauses) == 1 else f"{', '.join(clauses[:-1])} and {clauses[-1]}"
