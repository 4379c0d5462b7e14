"""``mqar.json``: what MQAR task a folder's examples or model belong to, so anyone can generate more.

    {"vocab_size", "input_seq_len", "num_kv_pairs", "power_a", "random_non_queries"  (Zoology's names),
     "token_offset": 0, "seed": S, "splits": {"train" | "valid" | "test": {"seed", "examples"}}}

Written into a prepared mqar corpus, and carried by every model trained on one (the pretrain and teacher
folders), so a saved model says what task it solves and how its test examples were drawn.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.corpus_card import MQAR_CARD
from pipeline.data.mqar import SPLITS, MqarSpec, split_seeds
from pipeline.errors import UserError


def mqar_card(
    spec: MqarSpec, seed: int, counts: dict[str, int], mixture: list[dict[str, int]] | None = None
) -> dict[str, Any]:
    """``mqar.json``: the spec (Zoology's argument names), the id shift (none), and each split's seed and
    size (and a training mixture's parts), so anyone can generate more examples of the task, or the same
    ones again."""
    seeds = split_seeds(seed)
    splits: dict[str, dict[str, Any]] = {
        name: {"seed": seeds[name], "examples": counts[name]} for name in SPLITS
    }
    if mixture:
        splits["train"]["mixture"] = mixture
    return {**spec.to_json(), "token_offset": 0, "seed": seed, "splits": splits}


@dataclass(frozen=True)
class MqarCard:
    """``mqar.json`` as read back: the task, the id shift, the seed of the splits and each split's seed and
    size."""

    spec: MqarSpec
    token_offset: int
    seed: int
    splits: dict[str, dict[str, Any]]


def read_mqar_card(folder: str | os.PathLike, key: str) -> MqarCard:
    """The ``mqar.json`` of ``folder`` (a prepared mqar corpus or a model trained on one; params ``key``
    names it); a one-line :class:`UserError` when it is missing or malformed."""
    path = Path(folder) / MQAR_CARD
    if not path.is_file():
        raise UserError(
            f"{key} = {os.fspath(folder)!r}: no {MQAR_CARD} there; allowed: a folder of the mqar task"
        )
    try:
        card = json.loads(path.read_text())
        extra = {name: card.pop(name) for name in ("token_offset", "seed", "splits")}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"{key}: {path} is malformed ({err}); run prepare again") from None
    spec = MqarSpec.from_json(card)
    splits = extra["splits"]
    if extra["token_offset"] != 0 or not isinstance(splits, dict) or set(splits) != set(SPLITS):
        raise UserError(
            f"{key}: {path} is malformed (token_offset 0 and splits {', '.join(SPLITS)} expected)"
        )
    return MqarCard(spec, extra["token_offset"], extra["seed"], splits)


def mqar_card_text(corpus: str | os.PathLike) -> str:
    """The corpus's ``mqar.json``, checked, as text for a model trained on it to carry
    (:func:`~pipeline.checkpoint.save_checkpoint`'s ``extra_files``): the model folder says what task it
    solves, and anyone can generate fresh examples to score it on."""
    read_mqar_card(corpus, "data")
    return (Path(corpus) / MQAR_CARD).read_text()
