"""Pareto fronts of two-objective points, and picking the best row above a threshold.

A point p *weakly dominates* q when p is at least as good as q in both coordinates; it *dominates* q when, in
addition, it is strictly better in at least one. "Better" means larger for a maximised coordinate and smaller
for a minimised one. The Pareto front is the set of points no other point dominates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def _oriented(point: tuple[float, float], maximize: tuple[bool, bool]) -> tuple[float, float]:
    """The point with minimised coordinates negated, so that larger is better in both."""
    return (point[0] if maximize[0] else -point[0], point[1] if maximize[1] else -point[1])


def pareto_front(
    points: Sequence[tuple[float, float]], *, maximize: tuple[bool, bool] = (True, True)
) -> list[int]:
    """Indices of the non-dominated points, sorted by the first coordinate ascending.

    Point i is on the front when no point j is at least as good in both coordinates and strictly better in
    one (``maximize`` says, per coordinate, whether larger is better). Identical points do not dominate one
    another; the front keeps only the first index of each. A point with a NaN coordinate is never on the
    front.
    """
    finite = [i for i, p in enumerate(points) if not (math.isnan(p[0]) or math.isnan(p[1]))]
    oriented = {i: _oriented(points[i], maximize) for i in finite}
    # Sweep from the best first coordinate down: a point is on the front exactly when its second coordinate
    # beats every point seen before it (all of which are at least as good in the first). The index breaks
    # ties so the first of identical points is seen first and its copies are dropped.
    order = sorted(finite, key=lambda i: (-oriented[i][0], -oriented[i][1], i))
    front: list[int] = []
    best_second = -math.inf
    for i in order:
        if oriented[i][1] > best_second:
            front.append(i)
            best_second = oriented[i][1]
    return sorted(front, key=lambda i: (points[i][0], i))


def front_dominates(
    a: Sequence[tuple[float, float]],
    b: Sequence[tuple[float, float]],
    *,
    maximize: tuple[bool, bool] = (True, True),
) -> bool:
    """Whether the front of ``a`` dominates the front of ``b``.

    It does when every point of b's Pareto front is weakly dominated by some point of a's front (at least as
    good in both coordinates). An empty ``b`` is dominated by anything; an empty ``a`` dominates only that.
    """
    front_a = [_oriented(a[i], maximize) for i in pareto_front(a, maximize=maximize)]
    front_b = [_oriented(b[i], maximize) for i in pareto_front(b, maximize=maximize)]
    return all(any(p[0] >= q[0] and p[1] >= q[1] for p in front_a) for q in front_b)


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is missing, null, not a number or not finite."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def best_at_least(
    rows: Sequence[Mapping[str, Any]], *, x: str, y: str, x_min: float, maximize_y: bool = True
) -> dict | None:
    """The row with the best ``row[y]`` among the rows with ``row[x] ≥ x_min``; None when there is none.

    Best is largest (``maximize_y``) or smallest y; among rows equally good in y the one with the larger x
    wins, then the earlier row. Rows whose x or y is missing, null or not finite are ignored.
    """
    best: dict | None = None
    best_key: tuple[float, float] | None = None
    for row in rows:
        x_value, y_value = finite_number(row.get(x)), finite_number(row.get(y))
        if x_value is None or y_value is None or x_value < x_min:
            continue
        key = (y_value if maximize_y else -y_value, x_value)
        if best_key is None or key > best_key:
            best, best_key = dict(row), key
    return best


def operating_rows(
    rows: Sequence[Mapping[str, Any]],
    recall_target: float,
    *,
    sparsity: str = "sparsity",
    recall: str = "recall",
) -> list[Mapping[str, Any]]:
    """Each method's operating row, in the order the methods first appear: its sparsest row with
    ``row[recall]`` ≥ ``recall_target``, or, when none reaches the target, its highest-recall one (ties: the
    sparser, then the earlier row)."""
    chosen: dict[str, tuple[tuple[bool, float, float], Mapping[str, Any]]] = {}
    for row in rows:
        s, r = row[sparsity], row[recall]
        key = (True, s, r) if r >= recall_target else (False, r, s)
        held = chosen.get(row["method"])
        if held is None or key > held[0]:
            chosen[row["method"]] = key, row
    return [row for _, row in chosen.values()]
