"""Deterministic train/valid/test assignment by a hash of each pair's id.

A pair's split depends only on its id and the seed, never on the rest of the corpus, so adding or removing
data never moves a test pair into training.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Protocol, TypeVar

from pipeline.data.pair import Pair
from pipeline.errors import UserError

SPLITS = ("train", "valid", "test")


def id_hash(pair_id: str, seed: int, purpose: str = "split") -> float:
    """Map ``pair_id`` to a number uniform in [0, 1); ``purpose`` salts it so that uses stay independent."""
    digest = hashlib.sha256(f"{purpose}:{seed}:{pair_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def check_fractions(valid_fraction: float, test_fraction: float) -> None:
    """Raise :class:`UserError` unless both fractions are in [0, 1) and leave room for training data."""
    for key, value in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise UserError(f"{key} = {value} is outside [0, 1)")
    if valid_fraction + test_fraction >= 1.0:
        raise UserError(
            f"valid_fraction + test_fraction = {valid_fraction + test_fraction} leaves no training data; "
            "their sum must be below 1"
        )


def assign_split(pair_id: str, *, valid_fraction: float, test_fraction: float, seed: int) -> str:
    """The split of ``pair_id``: test below ``test_fraction``, then valid, then train."""
    u = id_hash(pair_id, seed)
    if u < test_fraction:
        return "test"
    if u < test_fraction + valid_fraction:
        return "valid"
    return "train"


def split_pairs(
    pairs: Iterable[Pair],
    *,
    valid_fraction: float,
    test_fraction: float,
    seed: int,
) -> dict[str, list[Pair]]:
    """Group ``pairs`` by split: a pair's own split when its source gave one, else its id hash's."""
    check_fractions(valid_fraction, test_fraction)
    splits: dict[str, list[Pair]] = {name: [] for name in SPLITS}
    for pair in pairs:
        if pair.split is not None:
            name = pair.split
        else:
            name = assign_split(
                pair.id, valid_fraction=valid_fraction, test_fraction=test_fraction, seed=seed
            )
        splits[name].append(pair)
    return splits


def source_key(text: str) -> str:
    """A source sentence as :func:`leave_out_seen` compares it: its words, single-spaced."""
    return " ".join(text.split())


def leave_out_seen(splits: dict[str, list[Pair]]) -> dict[str, int]:
    """Remove from the valid and test splits, in place, every pair that an id hash put there whose source
    sentence (:func:`source_key`) also appears in the training split, and return how many each lost.

    A corpus that repeats formulae (the Bible's "And God said", "Thus says the LORD") otherwise tests a model
    on sentences it was trained on, which measures memory, not translation. Pairs a dataset assigned to its
    own splits are kept as they are, so a published test set stays the published one.
    """
    seen = {source_key(pair.src) for pair in splits["train"]}
    removed = {}
    for name in ("valid", "test"):
        kept = [pair for pair in splits[name] if pair.split is not None or source_key(pair.src) not in seen]
        removed[name] = len(splits[name]) - len(kept)
        splits[name] = kept
    return removed


def check_cap(max_examples: int | None) -> None:
    """Raise :class:`UserError` unless ``max_examples`` is ``None`` (no cap) or at least 1."""
    if max_examples is not None and max_examples < 1:
        raise UserError(f"max_examples = {max_examples} must be at least 1 (or null for no cap)")


class Identified(Protocol):
    id: str


Example = TypeVar("Example", bound=Identified)


def cap_examples(examples: list[Example], max_examples: int | None, seed: int) -> list[Example]:
    """Keep at most ``max_examples`` examples (pairs, blocks): those first in an order fixed by their ids'
    hashes.

    The order is salted apart from the split hash, so a capped corpus still spreads over all splits.
    """
    check_cap(max_examples)
    if max_examples is None or len(examples) <= max_examples:
        return examples
    ranked = sorted(examples, key=lambda example: id_hash(example.id, seed, purpose="cap"))
    return ranked[:max_examples]
