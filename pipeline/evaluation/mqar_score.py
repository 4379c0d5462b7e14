"""A saved model's MQAR accuracy on freshly generated examples, from the ``mqar.json`` beside it.

The examples come from the card's spec with a seed of the caller's (never one of the card's own split
seeds, so none is a training, validation or test example by construction); accuracy is the share of the
answers whose most likely token is the value, overall and apart for the near and the far answers (key at
most, or more than, the examples' median distance back), each with a 95 % bootstrap percentile interval
over examples (:mod:`pipeline.evaluation.intervals`, the evaluate stage's own resampling).
"""

from __future__ import annotations

import os
from typing import Any

import datasets
from transformers import PreTrainedModel

from pipeline.data.mqar import generate
from pipeline.data.mqar_card import read_mqar_card
from pipeline.data.mqar_corpus import causal_labels
from pipeline.errors import UserError
from pipeline.evaluation.intervals import (
    DEFAULT_RESAMPLES,
    SystemScores,
    measure_estimates,
    resample_weights,
    resamples,
    row_entry,
)
from pipeline.metrics.teacher_forced import Scoring, median_gap, unit_sums

MEASURES = ("accuracy", "accuracy_near", "accuracy_far")


def fresh_examples(folder: str | os.PathLike, count: int, seed: int) -> datasets.Dataset:
    """``count`` examples of the task in ``folder``'s ``mqar.json`` from ``seed`` (columns ``input_ids`` and
    ``labels``, as a prepared corpus holds them); :class:`UserError` for a seed of one of its splits."""
    card = read_mqar_card(folder, "model")
    for name, split in card.splits.items():
        if split["seed"] == seed:
            raise UserError(f"--seed {seed} is the seed of the {name} split; allowed: any other seed")
    if count < 1:
        raise UserError(f"--examples {count}: allowed: at least 1")
    inputs, labels = generate(card.spec, count, seed)  # (n, T) each
    return datasets.Dataset.from_dict(
        {"input_ids": inputs.tolist(), "labels": causal_labels(labels).tolist()}
    )


def score_examples(
    model: PreTrainedModel, examples: datasets.Dataset, *, batch_size: int, bootstrap_seed: int = 0
) -> dict[str, Any]:
    """``model``'s accuracy on ``examples`` (overall, near, far; each ``{"value", "ci95"}``), the examples,
    answers and the distance that splits near from far."""
    far_gap = median_gap(examples)
    sums = unit_sums(model, examples, Scoring("mqar", batch_size, far_gap=far_gap))
    weights = resample_weights(
        resamples(len(examples), DEFAULT_RESAMPLES, seed=bootstrap_seed), len(examples)
    )
    measured = measure_estimates(SystemScores(**sums), None, {}, weights)
    found: dict[str, Any] = {
        "examples": len(examples),
        "answers": int(sums["tokens"].sum()),
        "far_gap": far_gap,
    }
    return found | {name: row_entry(*measured[name]) for name in MEASURES}
