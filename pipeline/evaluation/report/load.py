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
from pipeline.evaluation.report.verdicts import MEASURES
from pipeline.timings import merge_timings, timings_path

REQUIRED_KEYS = ("kind", "store", "gold_sparsity", "graphs", "quality")
GRAPH_KEYS = ("method", "sparsity", "recall")
QUALITY_KEYS = ("teacher", "points")


def load_evaluation(path: str | os.PathLike, timings: str | os.PathLike | None = None) -> dict:
    """Read the evaluate stage's JSON, with the wall times of its ``timings`` file (by default
    :func:`~pipeline.timings.timings_path`) put back in; raise :class:`UserError`, one line naming file and
    key, if unusable. Without a timings file the speed columns show a dash."""
    path = Path(path)
    evaluation = _read_json(path, "evaluation")
    _check_mapping(path, evaluation, "top level", REQUIRED_KEYS)
    task = evaluation.get("task", "translation")
    if task not in TASK_SCORES:
        raise UserError(f"{path}: task = {task!r} is not one of {', '.join(TASK_SCORES)}")
    scored = tuple(score.key for score in TASK_SCORES[task])
    if task == "mqar" and not (isinstance(evaluation.get("far_gap"), int) and evaluation["far_gap"] >= 1):
        raise UserError(f"{path}: an mqar evaluation needs 'far_gap' (an int >= 1); run evaluate again")
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
        # a point measured teacher-forced alone (``decoded`` false) has no BLEU
        measured = scored if row.get("decoded", True) else tuple(key for key in scored if key != "bleu")
        _check_row(path, row, f"quality.points[{i}]", ("method", "sparsity", *measured))
    if "students" in evaluation:
        _check_students(path, evaluation["students"], scored)
    timings = Path(timings or timings_path(path))
    if not timings.is_file():
        return evaluation
    try:
        return merge_timings(evaluation, json.loads(timings.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{timings}: not valid JSON ({err})") from None


def _read_json(path: Path, what: str) -> Any:
    """The JSON in ``path``, an output of the evaluate stage; one line naming the file otherwise."""
    if not path.is_file():
        raise UserError(f"{path}: {what} file not found (run the evaluate stage first)")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None


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


def load_evidence(path: str | os.PathLike) -> dict:
    """Read the evaluate stage's evidence (``quality.json``: every quality row with its intervals), checked:
    each row has a name of its own, a number of units, and entries ``{"value", "ci95"}`` and differences
    ``{"diff", "ci95", "significant"}`` made of numbers; one line naming file and key otherwise."""
    path = Path(path)
    evidence = _read_json(path, "evidence")
    _check_mapping(path, evidence, "top level", ("units", "resamples", "bootstrap_seed", "decoding", "rows"))
    rows = evidence["rows"]
    if (
        not isinstance(rows, list)
        or not rows
        or not isinstance(rows[0], dict)
        or rows[0].get("name") != "teacher"
    ):
        raise UserError(f"{path}: 'rows' must be a non-empty list of quality rows, the teacher's first")
    names: set[str] = set()
    for i, row in enumerate(evidence["rows"]):
        where = f"rows[{i}]"
        _check_mapping(path, row, where, ("name", "kind", "sentences"))
        if not isinstance(row["name"], str) or row["name"] in names:
            raise UserError(f"{path}: {where}.name = {row['name']!r} is not a name of its own")
        names.add(row["name"])
        for key, entry in row.items():
            if key in MEASURES:
                _check_interval(path, entry, f"{where}.{key}", "value")
            elif key.startswith("vs_"):
                _check_mapping(path, entry, f"{where}.{key}", ())
                for measure, difference in entry.items():
                    _check_interval(path, difference, f"{where}.{key}.{measure}", "diff")
                    low, high = difference["ci95"]
                    if difference.get("significant") is not (low > 0 or high < 0):
                        raise UserError(
                            f"{path}: {where}.{key}.{measure}.significant must say whether ci95 excludes 0"
                        )
        if row["sentences"] != rows[0]["sentences"]:
            raise UserError(
                f"{path}: {where}.sentences = {row['sentences']!r}, not the teacher's "
                f"{rows[0]['sentences']}; every row must be scored on the same units"
            )
    return evidence


def _check_interval(path: Path, entry: Any, where: str, key: str) -> None:
    """``{key: number, "ci95": [low, high]}`` with low ≤ high."""
    _check_mapping(path, entry, where, (key, "ci95"))
    ends = entry["ci95"]
    numbers = [finite_number(value) for value in (entry[key], *(ends if isinstance(ends, list) else []))]
    if not isinstance(ends, list) or len(ends) != 2 or None in numbers or ends[0] > ends[1]:
        raise UserError(f"{path}: {where} must hold a number and ci95 = [low, high]; got {entry!r}")


def attach_evidence(evaluation: dict, evidence: dict) -> dict:
    """``evaluation`` with ``evidence`` kept under its key and each quality row given its own evidence row
    (``row["evidence"]``): the teacher, each point by label, each student by name, its untrained twin and
    its self-ensembles."""
    scored = evaluation["quality"].get("sentences")
    if scored is not None and scored != evidence["rows"][0]["sentences"]:
        raise UserError(
            f"the evidence covers {evidence['rows'][0]['sentences']} {evidence['units']}, the evaluation "
            f"{scored}: they come from different runs (re-run the evaluate stage)"
        )
    rows = {row["name"]: row for row in evidence["rows"]}
    by_student = {(row.get("student"), row["kind"], row.get("samples")): row for row in evidence["rows"]}
    evaluation = {**evaluation, "evidence": evidence}
    quality = evaluation["quality"]
    if quality.get("teacher") and "teacher" in rows:
        quality["teacher"]["evidence"] = rows["teacher"]
    for point in quality["points"]:
        if point.get("label") in rows:
            point["evidence"] = rows[point["label"]]
    for student in evaluation.get("students") or []:
        name = student["student"]
        if name in rows:
            student["evidence"] = rows[name]
        if student.get("untrained") and (name, "untrained", None) in by_student:
            student["untrained"]["evidence"] = by_student[(name, "untrained", None)]
        for ensemble in student.get("ensembles") or []:
            found = by_student.get((name, "ensemble", ensemble["samples"]))
            if found:
                ensemble["evidence"] = found
    return evaluation
