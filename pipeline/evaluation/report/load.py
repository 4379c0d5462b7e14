"""Reading the evaluate stage's JSON for the report: its keys and numbers checked, its wall times put back
in."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from pipeline.evaluation.pareto import finite_number
from pipeline.evaluation.report.scores import TASK_SCORES
from pipeline.timings import merge_timings, timings_path

REQUIRED_KEYS = ("kind", "store", "gold_sparsity", "graphs", "quality")
GRAPH_KEYS = ("method", "sparsity", "recall")
QUALITY_KEYS = ("teacher", "points")


def load_evaluation(path: str | os.PathLike, timings: str | os.PathLike | None = None) -> dict:
    """Read the evaluate stage's JSON, with the wall times of its ``timings`` file (by default
    :func:`~pipeline.timings.timings_path`) put back in; raise :class:`UserError`, one line naming file and
    key, if unusable. Without a timings file the speed columns show a dash."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: evaluation file not found (run the evaluate stage first)")
    try:
        evaluation = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
    _check_mapping(path, evaluation, "top level", REQUIRED_KEYS)
    task = evaluation.get("task", "translation")
    if task not in TASK_SCORES:
        raise UserError(f"{path}: task = {task!r} is not one of {', '.join(TASK_SCORES)}")
    scored = tuple(score.key for score in TASK_SCORES[task])
    graphs = evaluation["graphs"]
    if not isinstance(graphs, list) or not graphs:
        raise UserError(f"{path}: 'graphs' must be a non-empty list of graph settings")
    for i, row in enumerate(graphs):
        _check_row(path, row, f"graphs[{i}]", GRAPH_KEYS)
    quality = evaluation["quality"]
    _check_mapping(path, quality, "quality", QUALITY_KEYS)
    if not isinstance(quality["points"], list):
        raise UserError(f"{path}: 'quality.points' must be a list")
    for i, row in enumerate(quality["points"]):
        _check_row(path, row, f"quality.points[{i}]", ("method", "sparsity", *scored))
    if "students" in evaluation:
        _check_students(path, evaluation["students"], scored)
    timings = Path(timings or timings_path(path))
    if not timings.is_file():
        return evaluation
    try:
        return merge_timings(evaluation, json.loads(timings.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{timings}: not valid JSON ({err})") from None


def _check_mapping(path: Path, value: Any, where: str, keys: Sequence[str]) -> None:
    if not isinstance(value, dict):
        raise UserError(f"{path}: {where} must be a mapping, got {type(value).__name__}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise UserError(f"{path}: {where} lacks the key {missing[0]!r}")


def _check_row(path: Path, row: Any, where: str, keys: Sequence[str]) -> None:
    """A row has every key; its numbers are numbers or null (an undefined value)."""
    _check_mapping(path, row, where, keys)
    for key in keys[1:]:
        value = row[key]
        if value is not None and finite_number(value) is None:
            raise UserError(f"{path}: {where}.{key} = {value!r} is not a number")


def _check_students(path: Path, students: Any, scored: Sequence[str]) -> None:
    """Each student row has a name of its own and its quality numbers; its self-ensembles, if any, theirs."""
    if not isinstance(students, list):
        raise UserError(f"{path}: 'students' must be a list of student rows, got {type(students).__name__}")
    names: set[str] = set()
    for i, row in enumerate(students):
        where = f"students[{i}]"
        _check_row(path, row, where, ("student", "sparsity", *scored))
        name = row["student"]
        if not isinstance(name, str) or not name or name in names:
            raise UserError(f"{path}: {where}.student = {name!r} is not a name of its own")
        names.add(name)
        if "ensembles" not in row:
            continue
        if not isinstance(row["ensembles"], list):
            raise UserError(f"{path}: {where}.ensembles must be a list of self-ensemble rows")
        for j, ensemble in enumerate(row["ensembles"]):
            _check_row(path, ensemble, f"{where}.ensembles[{j}]", ("samples", *scored))
            samples = ensemble["samples"]
            if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
                raise UserError(
                    f"{path}: {where}.ensembles[{j}].samples = {samples!r} is not a positive integer"
                )
