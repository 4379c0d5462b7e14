"""``corpus.json``: what a prepared corpus folder holds, read by every stage that loads one.

    {"task": "translation" | "lm" | "mlm" | "mqar", "context": null | tokens per block}

A translation corpus holds sentence pairs (``input_ids`` source, ``labels`` target); an lm/mlm corpus
holds blocks of exactly ``context`` tokens (``input_ids``); an mqar corpus holds examples of exactly
``context`` tokens (``input_ids``) with the answers to predict (``labels``, causal-LM convention, −100
elsewhere: :mod:`pipeline.data.mqar_corpus`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.atomic import write_json
from pipeline.errors import UserError

CARD = "corpus.json"
# an mqar corpus's task card (:mod:`pipeline.data.mqar_card`), carried by every model trained on it or
# configured from one
MQAR_CARD = "mqar.json"
TASKS = ("translation", "lm", "mlm", "mqar")
Task = Literal["translation", "lm", "mlm", "mqar"]
# the tasks a decoder-only model reads left to right, logit t scored against labels[t + 1]
CAUSAL_TASKS = ("lm", "mqar")
# the tasks scored by top-1 accuracy too: a masked token, an associative-recall answer
ACCURACY_TASKS = ("mlm", "mqar")


@dataclass(frozen=True)
class CorpusCard:
    task: Task
    context: int | None = None


def write_corpus_card(folder: str | os.PathLike, *, task: Task, context: int | None = None) -> None:
    """Write ``folder/corpus.json``."""
    write_json(Path(folder) / CARD, {"task": task, "context": context})


def read_corpus_card(folder: str | os.PathLike, key: str) -> CorpusCard:
    """The card of the corpus ``folder`` (named by params ``key``); :class:`UserError` when it is missing or
    malformed."""
    path = Path(folder) / CARD
    if not path.is_file():
        raise UserError(
            f"{key} = {os.fspath(folder)!r}: no {CARD} there; allowed: a folder written by prepare"
        )
    try:
        card = json.loads(path.read_text())
        task, context = card["task"], card["context"]
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"{key}: {path} is malformed ({err}); run prepare again") from None
    if task not in TASKS:
        raise UserError(f"{key}: {path} names task {task!r}; allowed: {', '.join(TASKS)}")
    if task != "translation" and not (isinstance(context, int) and context >= 2):
        raise UserError(f"{key}: {path} gives context {context!r} for task {task!r}; allowed: an int >= 2")
    return CorpusCard(task, context)
