"""The evidence behind every quality number: each row's 95 % paired bootstrap intervals, its differences
from the teacher and from the dense control, and the outputs they were computed from.

Rows: the teacher, each predictor point (the teacher decoding with that point's predicted graphs), each
student, a ``sparsefinder`` student's untrained twin and an SSA student's self-ensembles, all measured on the
same test units with the same decoding. Every interval of an evaluation is computed on one shared set of
resamples of the units (:mod:`pipeline.evaluation.intervals`), so each difference is paired.

Written by the evaluate stage:

- ``quality.json``: ``{"units", "split_units", "resamples", "bootstrap_seed", "decoding", "signatures",
  "dense_control", "references", "rows": [{"name", "kind", "hypotheses", "sentences", "sparsity",
  "recall", "bleu": {"value", "ci95"}, "chrf", "perplexity", "kl", "agreement", "vs_teacher": {"bleu":
  {"diff", "ci95", "significant"}, …}, "vs_dense": {…}}]}`` (an untrained twin or a self-ensemble also
  ``student``, the student it belongs to, and ``vs_student``); perplexity differences are relative (0.01 =
  1 % higher). A student trained on several seeds is the mean over them: its row also has ``seeds`` (their
  folder names), each measure a ``spread`` (each seed's value and their standard deviation), and
  ``hypotheses`` is a list, one file per seed;
- ``hypotheses/references.txt`` (translation): the test split's references, one line each, in split order,
  and one file per row beside it with that row's outputs, line for line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.atomic import atomic_path, write_json
from pipeline.errors import UserError
from pipeline.evaluation.control import dense_control
from pipeline.evaluation.intervals import (
    DENSE,
    PERCENTILES,
    TEACHER,
    SystemScores,
    default_metrics,
    quality_rows,
)
from pipeline.evaluation.student_models import ensemble_name, untrained_name
from pipeline.params.evaluate import Quality

STUDENT = "student"
"""The comparison key of a student's untrained twin and self-ensembles against the student itself
(``vs_student``)."""

REFERENCES = "references.txt"
"""The references' file name inside the hypotheses folder."""


@dataclass(frozen=True)
class Evidence:
    """What the evaluate stage writes beside ``evaluate.json``: the ``quality.json`` document, and the
    lines of each file of the hypotheses folder by file name (none for the block tasks)."""

    document: dict[str, Any]
    files: dict[str, list[str]]


def file_name(name: str, taken: set[str]) -> str:
    """A file name for a row's outputs: its name with runs of other characters than letters, digits and
    ``.=-`` turned into ``_``, numbered when another row already has it."""
    stem = re.sub(r"[^A-Za-z0-9.=-]+", "_", name).strip("_") or "row"
    found, number = f"{stem}.txt", 2
    while found in taken or found == REFERENCES:
        found, number = f"{stem}_{number}.txt", number + 1
    taken.add(found)
    return found


def _check_names(evaluation: dict[str, Any]) -> None:
    """Every model has a row name of its own: a student named like the teacher or a predictor point (or
    like a twin or self-ensemble's name) would silently take that row's place."""
    taken = {TEACHER, *(point["label"] for point in evaluation["quality"]["points"])}
    for row in evaluation["students"]:
        name = row["student"]
        derived = {
            untrained_name(name),
            *(ensemble_name(name, e["samples"]) for e in row.get("ensembles", [])),
        }
        clash = ({name} | derived) & taken
        if clash:
            raise UserError(
                f"student.instances.{name}: its evidence row {sorted(clash)[0]!r} is already another "
                f"model's; allowed: a student name other than {TEACHER!r}, a predictor setting's label or "
                "another student's row"
            )
        taken |= {name} | derived


def row_facts(evaluation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per evidence name, what the row is: its ``kind`` (teacher, point, student, untrained, ensemble), the
    sparsity of the graphs it ran with and, where one was scored, their recall of the teacher's."""
    quality = evaluation["quality"]
    facts = {TEACHER: {"kind": "teacher", "sparsity": quality["teacher"]["sparsity"], "recall": 1.0}}
    for point in quality["points"]:
        sparsity = point["sparsity"]
        facts[point["label"]] = {
            "kind": "point",
            "method": point["method"],
            "sparsity": point["graph_sparsity"] if sparsity is None else sparsity,
            "recall": point["graph_recall"],
        }
        if "answer_recall" in point:  # mqar
            facts[point["label"]]["answer_recall"] = point["answer_recall"]
    for row in evaluation["students"]:
        name = row["student"]
        facts[name] = {"kind": "student", "sparsity": row["sparsity"], "recall": None}
        if "seeds" in row:
            facts[name]["seeds"] = list(row["seeds"])
        if "untrained" in row:
            sparsity = row["untrained"].get("sparsity")
            facts[untrained_name(name)] = {
                "kind": "untrained",
                "student": name,
                "sparsity": sparsity,
                "recall": None,
            }
        for ensemble in row.get("ensembles", []):
            facts[ensemble_name(name, ensemble["samples"])] = {
                "kind": "ensemble",
                "student": name,
                "samples": ensemble["samples"],
                "sparsity": row["sparsity"],
                "recall": None,
            }
    return facts


def gather_evidence(
    evaluation: dict[str, Any],
    scores: dict[str, SystemScores | list[SystemScores]],
    references: list[str] | None,
    *,
    quality: Quality,
    split_units: int,
) -> Evidence:
    """The evidence of an evaluation (``evaluate.json``'s content) from what each of its models produced
    (``scores`` by evidence name, the teacher's named ``teacher``; a student trained on several seeds, one
    per seed, in the order of its row's ``seeds``) on the test units, against
    ``references`` (translation; None for the block tasks); ``split_units`` is the size of the whole test
    split the units were taken from (more than the units when ``evaluate.quality.examples`` caps them)."""
    _check_names(evaluation)
    control = dense_control(evaluation["students"])
    compared_with = {TEACHER: TEACHER, **({DENSE: control["student"]} if control else {})}
    metrics = default_metrics()
    facts = row_facts(evaluation)
    rows = quality_rows(
        scores,
        references,
        compared_with=compared_with,
        also={name: {STUDENT: fact["student"]} for name, fact in facts.items() if "student" in fact},
        count=quality.resamples,
        seed=quality.bootstrap_seed,
        metrics=metrics,
    )
    taken: set[str] = set()
    files = {} if references is None else {REFERENCES: [_line(text) for text in references]}
    document_rows = []
    for row in rows:
        name = row["name"]
        found = {"name": name, **facts[name], "hypotheses": None}
        produced = scores[name]
        if isinstance(produced, SystemScores):
            if produced.hypotheses is not None:
                found["hypotheses"] = file_name(name, taken)
                files[found["hypotheses"]] = [_line(text) for text in produced.hypotheses]
        elif produced[0].hypotheses is not None:  # one file per seed, in the seeds' order
            found["hypotheses"] = [file_name(f"{name} {seed}", taken) for seed in facts[name]["seeds"]]
            for file, seed_scores in zip(found["hypotheses"], produced, strict=True):
                files[file] = [_line(text) for text in seed_scores.hypotheses]
        document_rows.append({**found, **{key: value for key, value in row.items() if key != "name"}})
    document = {
        "units": "sentences" if references is not None else "blocks",
        "split_units": split_units,
        "confidence": (PERCENTILES[1] - PERCENTILES[0]) / 100,
        "resamples": quality.resamples,
        "bootstrap_seed": quality.bootstrap_seed,
        "decoding": {
            "beams": quality.beams,
            "max_new_tokens": quality.max_new_tokens,
            "decoded": quality.decode,
        }
        if references is not None
        else None,
        "signatures": {name: str(metric.get_signature()) for name, metric in metrics.items()}
        if references is not None
        else {},
        "dense_control": control["student"] if control else None,
        "references": REFERENCES if references is not None else None,
        "rows": document_rows,
    }
    return Evidence(document, files)


def _line(text: str) -> str:
    """One sentence on one line (a line break inside it would shift every later line)."""
    return " ".join(text.splitlines())


def write_evidence(evidence: Evidence, document: str | Path, folder: str | Path) -> None:
    """``quality.json`` at ``document`` and the hypotheses folder at ``folder`` (each write atomic)."""
    write_json(document, evidence.document)
    with atomic_path(folder, directory=True) as tmp:
        for name, lines in evidence.files.items():
            (tmp / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
