"""The settings and selections every section reads: methods in their order, the rows of a method, a
setting's quality point, the teacher's and the students' rows, and the selected settings (recall at
sparsity, sparsity at recall, the operating point, the dense control)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

from pipeline.evaluation.pareto import best_at_least, finite_number

# Sparsefinder's predictors on the learned projections; every other method is a baseline.
LEARNED = ("distance", "quantization", "kmeans", "indexer")
# A stable order for tables, colours and markers; methods not listed follow, alphabetically.
METHOD_ORDER = (
    "window",
    "bigbird",
    "longformer",
    "reformer",
    "routing",
    "distance",
    "quantization",
    "kmeans",
    "indexer",
)


def method_order(methods: Iterable[str]) -> list[str]:
    """The distinct ``methods`` in :data:`METHOD_ORDER`, then the unknown ones alphabetically."""
    distinct = set(methods)
    known = [m for m in METHOD_ORDER if m in distinct]
    return known + sorted(distinct - set(METHOD_ORDER))


def rows_by_method(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """The rows grouped by ``method``, methods in :func:`method_order`, rows in their original order."""
    rows = list(rows)
    return {m: [row for row in rows if row["method"] == m] for m in method_order(r["method"] for r in rows)}


def finite_points(rows: Iterable[dict], x: str, y: str) -> tuple[list[tuple[float, float]], list[dict]]:
    """The (x, y) points of the rows where both are finite numbers, and those rows, in the same order."""
    kept = [
        row for row in rows if finite_number(row.get(x)) is not None and finite_number(row.get(y)) is not None
    ]
    return [(float(row[x]), float(row[y])) for row in kept], kept


def setting_key(row: dict) -> tuple[str, str, int, int]:
    """What identifies a setting: method, knobs, window size and global tokens."""
    knobs = json.dumps(row.get("knobs") or {}, sort_keys=True)
    return row["method"], knobs, int(row.get("window") or 0), int(row.get("global_tokens") or 0)


def quality_at(evaluation: dict, row: dict | None) -> dict | None:
    """The quality point decoded with exactly ``row``'s setting, or None when it was not decoded."""
    if row is None:
        return None
    key = setting_key(row)
    return next((p for p in evaluation["quality"]["points"] if setting_key(p) == key), None)


def teacher_quality(evaluation: dict) -> dict:
    """The teacher's own quality numbers (empty when the evaluation has none)."""
    return evaluation["quality"].get("teacher") or {}


def student_rows(evaluation: dict) -> list[dict]:
    """The students' quality rows, in the evaluation's order (none in an evaluation from before students)."""
    return evaluation.get("students") or []


def recall_at_sparsity(rows: Sequence[dict], level: float) -> dict | None:
    """The setting with the best recall among those with sparsity ≥ ``level`` (ties: the sparser)."""
    return best_at_least(rows, x="sparsity", y="recall", x_min=level)


def sparsity_at_recall(rows: Sequence[dict], target: float) -> dict | None:
    """The sparsest setting among those with recall ≥ ``target`` (ties: the higher recall)."""
    return best_at_least(rows, x="recall", y="sparsity", x_min=target)


def highest_recall(rows: Sequence[dict]) -> dict | None:
    """The setting with the highest recall (ties: the sparser)."""
    return best_at_least(rows, x="sparsity", y="recall", x_min=-math.inf)


def operating_point(evaluation: dict, recall_target: float) -> dict | None:
    """The setting the per-layer/head figure shows.

    The sparsest setting of a learned method (:data:`LEARNED`) with recall ≥ ``recall_target``; when none
    reaches it, the learned setting with the highest recall; without learned methods, the highest-recall
    setting of any method. None only when no setting has both a sparsity and a recall.
    """
    learned = [row for row in evaluation["graphs"] if row["method"] in LEARNED]
    return (
        sparsity_at_recall(learned, recall_target)
        or highest_recall(learned)
        or highest_recall(evaluation["graphs"])
    )


def field(row: dict | None, key: str) -> float | None:
    return None if row is None else finite_number(row.get(key))


def label(row: dict) -> str:
    return row.get("label") or row["method"]
