"""The task's quality measures (BLEU and perplexity for translation; perplexity for lm; perplexity and
accuracy for mlm; accuracy, then perplexity, at the answers of mqar) and the words for how a model is run
to measure them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Score:
    """A quality measure of the evaluation's task: its key in the rows, its name, digits and direction."""

    key: str
    name: str
    short: str
    digits: int
    higher_is_better: bool


BLEU = Score("bleu", "BLEU", "BLEU", 2, True)
PERPLEXITY = Score("perplexity", "perplexity", "ppl", 2, False)
ACCURACY = Score("accuracy", "accuracy", "acc", 3, True)
# per task, its measures, the one that ranks first (an evaluation without a task is a translation one)
TASK_SCORES = {
    "translation": (BLEU, PERPLEXITY),
    "lm": (PERPLEXITY,),
    "mlm": (PERPLEXITY, ACCURACY),
    "mqar": (ACCURACY, PERPLEXITY),
}


def task_scores(evaluation: dict) -> tuple[Score, ...]:
    """The measures of the evaluation's task (:data:`TASK_SCORES`)."""
    return TASK_SCORES[evaluation.get("task", "translation")]


def units(count: int, scores: Sequence[Score]) -> str:
    """``516 sentences`` when BLEU is measured (translation), else ``4 blocks``."""
    return f"{count} {'sentences' if BLEU in scores else 'blocks'}"


def verbs(scores: Sequence[Score]) -> tuple[str, str]:
    """How a model is run for its measures: ("decoding", "decoded") by beam search when BLEU is measured,
    else ("running", "run"), a forward over the test blocks."""
    return ("decoding", "decoded") if BLEU in scores else ("running", "run")
