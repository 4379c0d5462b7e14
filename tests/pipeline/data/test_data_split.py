"""Hash-based splits: deterministic, stable when data is added, and roughly the requested sizes."""

from __future__ import annotations

import pytest

from pipeline.data.pair import Pair
from pipeline.data.split import assign_split, cap_examples, leave_out_seen, split_pairs
from pipeline.errors import UserError

FRACTIONS = {"valid_fraction": 0.05, "test_fraction": 0.1}


def _pairs(ids, split=None):
    return [Pair(pair_id, f"s {pair_id}", f"t {pair_id}", split) for pair_id in ids]


def _placement(splits):
    return {pair.id: name for name, pairs in splits.items() for pair in pairs}


def test_split_is_deterministic_and_roughly_sized():
    ids = [f"v{index}" for index in range(20_000)]
    first = _placement(split_pairs(_pairs(ids), seed=3, **FRACTIONS))
    assert first == _placement(split_pairs(_pairs(ids), seed=3, **FRACTIONS))
    sizes = {name: sum(value == name for value in first.values()) / len(ids) for name in ("valid", "test")}
    assert sizes["valid"] == pytest.approx(0.05, abs=0.01)
    assert sizes["test"] == pytest.approx(0.1, abs=0.01)
    assert first != _placement(split_pairs(_pairs(ids), seed=4, **FRACTIONS))


def test_adding_data_never_moves_a_pair():
    old = [f"Gen.1.{verse}" for verse in range(1, 2_000)]
    new = old + [f"Exod.{chapter}.1" for chapter in range(1, 3_000)]
    before = _placement(split_pairs(_pairs(old), seed=0, **FRACTIONS))
    after = _placement(split_pairs(_pairs(reversed(new)), seed=0, **FRACTIONS))
    assert all(after[pair_id] == split for pair_id, split in before.items())
    assert before["Gen.1.7"] == assign_split("Gen.1.7", seed=0, **FRACTIONS)


def test_source_splits_are_kept():
    pairs = _pairs(["a", "b"], split="test") + _pairs([f"x{index}" for index in range(50)])
    placement = _placement(split_pairs(pairs, seed=0, **FRACTIONS))
    assert placement["a"] == placement["b"] == "test"
    assert all(
        placement[f"x{index}"] == assign_split(f"x{index}", seed=0, **FRACTIONS) for index in range(50)
    )


@pytest.mark.parametrize(("valid", "test"), [(-0.1, 0.1), (0.5, 0.5), (0.1, 1.0)])
def test_bad_fractions_are_user_errors(valid, test):
    with pytest.raises(UserError, match="fraction"):
        split_pairs([], valid_fraction=valid, test_fraction=test, seed=0)


def test_cap_is_deterministic_and_spreads_over_splits():
    pairs = _pairs([f"v{index}" for index in range(5_000)])
    capped = cap_examples(pairs, 1_000, seed=0)
    assert [pair.id for pair in capped] == [
        pair.id for pair in cap_examples(list(reversed(pairs)), 1_000, seed=0)
    ]
    splits = split_pairs(capped, seed=0, **FRACTIONS)
    assert all(len(splits[name]) > 20 for name in ("train", "valid", "test"))
    assert cap_examples(pairs, None, seed=0) is pairs
    with pytest.raises(UserError, match="max_examples"):
        cap_examples(pairs, 0, seed=0)


def test_held_out_pairs_whose_source_was_seen_in_training_are_left_out():
    """A valid or test pair whose source sentence (whitespace aside) is also a training source goes; a pair a
    dataset put in its own test split stays, so a published test set is never changed."""
    splits = {
        "train": [Pair("t1", "And God said", "Y dijo Dios"), Pair("t2", "Amen.", "Amén.")],
        "valid": [Pair("v1", "Amen.", "Así sea."), Pair("v2", "Selah", "Selah")],
        "test": [
            Pair("x1", "And  God said ", "Dijo Dios"),
            Pair("x2", "Jesus wept.", "Jesús lloró."),
            Pair("x3", "Amen.", "Amén.", split="test"),
        ],
    }
    assert leave_out_seen(splits) == {"valid": 1, "test": 1}
    assert [pair.id for pair in splits["valid"]] == ["v2"]
    assert [pair.id for pair in splits["test"]] == ["x2", "x3"]
    assert [pair.id for pair in splits["train"]] == ["t1", "t2"]
