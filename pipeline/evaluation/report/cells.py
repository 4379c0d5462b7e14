"""How the report writes numbers and table cells: every table's rows, a number or a dash, signed
differences, ratios, a setting's cell and a point's measures. :func:`formatted` is the project's one way of
writing a number or a dash (:mod:`pipeline.evaluation.table_text`, where the benchmarks take it from)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.evaluation.pareto import finite_number
from pipeline.evaluation.report.points import label
from pipeline.evaluation.report.scores import Score, task_scores
from pipeline.evaluation.report.verdicts import difference_text
from pipeline.evaluation.table_text import DASH, cell, formatted


def num(value: Any, digits: int) -> str:
    return formatted(value, f".{digits}f")


def difference(value: Any, reference: Any) -> float | None:
    a, b = finite_number(value), finite_number(reference)
    return None if a is None or b is None else a - b


def signed(value: float | None, digits: int) -> str:
    return formatted(value, f"+.{digits}f")


def ratio(value: Any, reference: Any) -> str:
    a, b = finite_number(value), finite_number(reference)
    return DASH if a is None or b is None or b <= 0 else f"{a / b:.2f}×"


def setting_cell(row: dict | None, key: str) -> str:
    return DASH if row is None else f"{num(row[key], 3)} ({cell(label(row))})"


def quality_cell(evaluation: dict, point: dict | None) -> str:
    """The task's measures of ``point``, ``18.33 / 25.20``; a dash when it has none."""
    scores = task_scores(evaluation)
    if point is None or all(finite_number(point.get(score.key)) is None for score in scores):
        return DASH
    return " / ".join(num(point.get(score.key), score.digits) for score in scores)


def score_header(evaluation: dict) -> str:
    """``BLEU / ppl`` (translation), ``ppl`` (lm), ``ppl / acc`` (mlm)."""
    return " / ".join(score.short for score in task_scores(evaluation))


def score_columns(scores: Sequence[Score], suffix: str = "") -> list[str]:
    """Column names for :func:`versus`: each measure and its Δ."""
    return [name for score in scores for name in (score.name, f"Δ {score.short}{suffix}")]


def versus(
    row: dict,
    reference: dict,
    scores: Sequence[Score],
    *,
    deltas: int | None = None,
    against: str | None = None,
) -> list[str]:
    """Each measure of ``row`` and its difference to ``reference``'s, for the first ``deltas`` measures
    (all when None); the rest without their difference. With ``against`` (``teacher``, ``dense``,
    ``student``) and the row's evidence, the difference is the paired one with its 95 % interval
    (perplexity relative, in per cent)."""
    compared = (row.get("evidence") or {}).get(f"vs_{against}") or {}
    cells = []
    for i, score in enumerate(scores):
        cells.append(num(row.get(score.key), score.digits))
        if deltas is None or i < deltas:
            if score.key in compared:
                cells.append(difference_text(compared[score.key], score.key))
            else:
                cells.append(signed(difference(row.get(score.key), reference.get(score.key)), score.digits))
    return cells
