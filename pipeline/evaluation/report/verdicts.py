"""What the evidence lets the report say: a difference with its 95 % interval, and the verdict it supports.

A difference entry (``quality.json``'s ``vs_teacher``, ``vs_dense``, ``vs_student``) is ``{"diff", "ci95",
"significant"}``; its verdict (:func:`pipeline.evaluation.intervals.verdict`) is "keeps" when the whole
interval lies within the measure's tolerance (report params), "better" or "worse" when it excludes 0, and
"not distinguishable" otherwise: the test units cannot tell the two models apart on that measure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.evaluation.intervals import HIGHER_IS_BETTER, RELATIVE, Verdict, verdict


@dataclass(frozen=True)
class Measure:
    """How the report names and writes one measure of the evidence."""

    key: str
    name: str
    digits: int


MEASURES = {
    "bleu": Measure("bleu", "BLEU", 2),
    "chrf": Measure("chrf", "chrF", 2),
    "perplexity": Measure("perplexity", "perplexity", 2),
    "kl": Measure("kl", "KL", 4),
    "agreement": Measure("agreement", "agreement", 3),
    "accuracy": Measure("accuracy", "accuracy", 3),
}
"""Every measure of the evidence, in the order the report lists them."""

TASK_MEASURES = ("bleu", "perplexity", "accuracy")
"""The measures a task is judged on, those its rows hold: BLEU and perplexity (translation), perplexity
(lm), perplexity and accuracy (mlm)."""


def task_measures(row: Mapping[str, Any]) -> list[str]:
    """The :data:`TASK_MEASURES` an evidence row holds, in that order."""
    return [key for key in TASK_MEASURES if key in row]


def shown_value(value: float, key: str) -> float:
    """A value as the report writes it: KL is never negative, though a float32 sum of a model against
    itself can land a hair below 0."""
    return max(value, 0.0) if key == "kl" else value


def tolerance_text(key: str, tolerances: Mapping[str, float]) -> str:
    """``±0.5``, or ``±1 %`` for a relative measure."""
    return f"±{100 * tolerances[key]:g} %" if key in RELATIVE else f"±{tolerances[key]:g}"


def _signed(value: float, digits: int) -> str:
    """``+0.53`` or ``−0.41``; a value that rounds to zero is ``+0.00``, whatever the sign of its float."""
    return f"{round(value, digits) + 0.0:+.{digits}f}".replace("-", "−")


def value_text(entry: Mapping[str, Any], key: str) -> str:
    """A row's value with its interval: ``17.12 [16.20, 18.05]``; for the mean over several training
    seeds, their standard deviation after it: ``17.12 [16.20, 18.05] sd 0.31``."""
    digits = MEASURES[key].digits
    value, low, high = (shown_value(number, key) for number in (entry["value"], *entry["ci95"]))
    shown = f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
    spread = entry.get("spread")
    if spread and len(spread["seeds"]) > 1:
        shown += f" sd {spread['sd']:.{digits}f}"
    return shown


def training_seeds(evidence: Mapping[str, Any]) -> int:
    """How many seeds each student was trained on (1 without students)."""
    return max((len(row.get("seeds") or [None]) for row in evidence["rows"]), default=1)


def seeds_text(evidence: Mapping[str, Any]) -> str:
    """``one training seed per student``, or ``3 training seeds per student (their mean; sd: their
    spread)``."""
    seeds = training_seeds(evidence)
    if seeds == 1:
        return "one training seed per student"
    return f"{seeds} training seeds per student (their mean; sd: their spread)"


def difference_text(entry: Mapping[str, Any], key: str) -> str:
    """A difference with its interval: ``+0.53 [−0.41, +1.50]``; relative ones in per cent, ``+3.1 % [+2.0,
    +4.2]``."""
    if key in RELATIVE:
        low, high = (100 * end for end in entry["ci95"])
        return f"{_signed(100 * entry['diff'], 1)} % [{_signed(low, 1)}, {_signed(high, 1)}]"
    digits = MEASURES[key].digits
    low, high = entry["ci95"]
    return f"{_signed(entry['diff'], digits)} [{_signed(low, digits)}, {_signed(high, digits)}]"


def judge(entry: Mapping[str, Any], key: str, tolerances: Mapping[str, float]) -> Verdict:
    """The verdict a difference of measure ``key`` supports under ``tolerances`` (by measure)."""
    return verdict(entry, tolerances[key], HIGHER_IS_BETTER[key])


def judged(entry: Mapping[str, Any], key: str, tolerances: Mapping[str, float], units: str) -> str:
    """A verb phrase whose subject is the model: ``is not distinguishable in BLEU on 516 sentences (+0.53
    [−0.41, +1.50])``, ``keeps perplexity (+0.2 % [−0.4, +0.8], within ±1 %)``, ``has worse BLEU (−1.20
    [−1.90, −0.50])``."""
    name = MEASURES[key].name
    found = judge(entry, key, tolerances)
    shown = difference_text(entry, key)
    if found == "keeps":
        return f"keeps {name} ({shown}, within {tolerance_text(key, tolerances)})"
    if found == "not distinguishable":
        return f"is not distinguishable in {name} on {units} ({shown})"
    return f"has {found} {name} ({shown})"


def reversed_entry(entry: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The difference the other way round (reference − model): a relative one d = a / b − 1 becomes
    b / a − 1 = 1 / (1 + d) − 1, a decreasing map, so its interval's ends swap."""
    low, high = entry["ci95"]

    def flip(d: float) -> float:
        return 1.0 / (1.0 + d) - 1.0 if key in RELATIVE else -d

    return {"diff": flip(entry["diff"]), "ci95": [flip(high), flip(low)], "significant": entry["significant"]}
