"""Paired bootstrap intervals on a deterministic synthetic test set.

The references are 300 sentences of 8–24 words drawn with a seeded RNG from a fixed 400-word list. "good"
is the references with small random edits (a word replaced in half the sentences), "rival" the same kind of
edits drawn independently, and "dropped" is good with every third word of each sentence removed.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import Result, _paired_bs_test, estimate_ci

from pipeline.evaluation.intervals import (
    RATIOS,
    SystemScores,
    difference_entry,
    metric_resampled,
    metric_score,
    metric_statistics,
    quality_rows,
    ratio_resampled,
    ratio_value,
    resample_weights,
    resamples,
    verdict,
    within,
)

SENTENCES = 300
RESAMPLES = 300
WORDS = [
    f"{stem}{suffix}" for stem in ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to") for suffix in range(50)
]


def _references() -> list[str]:
    rng = np.random.default_rng(7)
    return [" ".join(rng.choice(WORDS, size=rng.integers(8, 25))) for _ in range(SENTENCES)]


def _edited(references: list[str], seed: int) -> list[str]:
    """The references with one word replaced by a random one in about half the sentences."""
    rng = np.random.default_rng(seed)
    edited = []
    for reference in references:
        words = reference.split()
        if rng.random() < 0.5:
            words[rng.integers(len(words))] = str(rng.choice(WORDS))
        edited.append(" ".join(words))
    return edited


def _dropped(hypotheses: list[str]) -> list[str]:
    """Every third word of each hypothesis removed."""
    return [" ".join(w for i, w in enumerate(h.split()) if i % 3 != 2) for h in hypotheses]


REFERENCES = _references()
GOOD = _edited(REFERENCES, seed=11)
RIVAL = _edited(REFERENCES, seed=12)
DROPPED = _dropped(GOOD)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    systems = {
        "teacher": SystemScores(GOOD),
        "same": SystemScores(list(GOOD)),
        "dropped": SystemScores(DROPPED),
        "rival": SystemScores(RIVAL),
    }
    compared_with = {"teacher": "teacher", "dropped": "dropped"}  # any systems can be references
    return {
        row["name"]: row
        for row in quality_rows(systems, REFERENCES, compared_with=compared_with, count=RESAMPLES, seed=1)
    }


@pytest.mark.parametrize("metric", [BLEU(), CHRF()], ids=["bleu", "chrf"])
def test_full_sample_score_from_the_statistics_is_sacrebleus_corpus_score(metric):
    for hypotheses in (GOOD, DROPPED):
        statistics = metric_statistics(metric, hypotheses, REFERENCES)
        assert metric_score(metric, statistics.sum(0)) == metric.corpus_score(hypotheses, [REFERENCES]).score


@pytest.mark.parametrize("metric", [BLEU(), CHRF()], ids=["bleu", "chrf"])
def test_resampled_scores_are_those_of_sacrebleus_paired_bootstrap(metric):
    # sacreBLEU's own test, same seed and count: its estimate of the system's mean and half-width from the
    # resampled scores must match ours, so the draw and the scoring of each resample are the same (up to
    # its float32 statistics, whose precisions it then computes in float32)
    baseline = metric_statistics(metric, GOOD, REFERENCES)
    info = {"m": (baseline, Result(metric_score(metric, baseline.sum(0))))}
    _, results = _paired_bs_test(info, "dropped", DROPPED, [REFERENCES], {"m": metric}, RESAMPLES, seed=5)
    weights = resample_weights(resamples(SENTENCES, RESAMPLES, seed=5), SENTENCES)
    ours = metric_resampled(metric, metric_statistics(metric, DROPPED, REFERENCES), weights)
    mean, half_width = estimate_ci(ours)
    assert mean == pytest.approx(results["m"].mean, rel=1e-6)
    assert half_width == pytest.approx(results["m"].ci, rel=1e-4)


def test_weights_sum_exactly_what_the_drawn_indices_sum():
    draws = resamples(50, 40, seed=3)
    assert np.array_equal(draws, np.random.default_rng(3).choice(50, size=(40, 50), replace=True))
    values = np.random.default_rng(0).integers(0, 30, size=(50, 4)).astype(np.float64)
    assert np.array_equal(resample_weights(draws, 50) @ values, values[draws].sum(1))


def test_identical_hypotheses_give_a_zero_difference_that_keeps(rows):
    for measure in ("bleu", "chrf"):
        entry = rows["same"]["vs_teacher"][measure]
        low, high = entry["ci95"]
        assert entry["diff"] == 0.0
        assert low <= 0.0 <= high
        assert not entry["significant"]
        assert within(entry, 0.5)
        assert verdict(entry, 0.5, higher_is_better=True) == "keeps"


def test_dropping_every_third_word_is_significantly_worse(rows):
    for measure in ("bleu", "chrf"):
        entry = rows["dropped"]["vs_teacher"][measure]
        assert entry["diff"] < 0
        assert entry["significant"]
        assert entry["ci95"][1] < 0
        assert verdict(entry, 0.5, higher_is_better=True) == "worse"
    # seen from the other side the same pair is better
    assert verdict(rows["teacher"]["vs_dropped"]["bleu"], 0.5, higher_is_better=True) == "better"


def test_an_equally_good_rival_is_not_distinguishable_at_a_tight_tolerance(rows):
    entry = rows["rival"]["vs_teacher"]["bleu"]
    low, high = entry["ci95"]
    assert low < 0 < high and not entry["significant"]
    assert not within(entry, 0.1)
    assert verdict(entry, 0.1, higher_is_better=True) == "not distinguishable"


def test_row_value_is_sacrebleus_corpus_score_and_its_interval_contains_it(rows):
    for name, hypotheses in (("teacher", GOOD), ("dropped", DROPPED)):
        for measure, metric in (("bleu", BLEU()), ("chrf", CHRF())):
            entry = rows[name][measure]
            assert entry["value"] == metric.corpus_score(hypotheses, [REFERENCES]).score
            low, high = entry["ci95"]
            assert low <= entry["value"] <= high
            assert low < high


def test_same_seed_same_intervals_and_another_seed_other_intervals():
    systems = {"teacher": SystemScores(GOOD), "dropped": SystemScores(DROPPED)}
    first = quality_rows(systems, REFERENCES, count=200, seed=4)
    assert quality_rows(systems, REFERENCES, count=200, seed=4) == first
    other = quality_rows(systems, REFERENCES, count=200, seed=5)
    assert other[1]["bleu"]["value"] == first[1]["bleu"]["value"]
    assert other[1]["bleu"]["ci95"] != first[1]["bleu"]["ci95"]
    assert other[1]["vs_teacher"]["bleu"]["ci95"] != first[1]["vs_teacher"]["bleu"]["ci95"]


def test_perplexity_is_exp_of_the_token_weighted_mean_nll():
    nll = np.array([2.0, 3.0, 1.0])
    tokens = np.array([2.0, 4.0, 1.0])
    # token-weighted mean nll by hand: (2 + 3 + 1) / (2 + 4 + 1) = 6 / 7, not the mean of 1, 0.75 and 1
    assert ratio_value(RATIOS["perplexity"], nll, tokens) == pytest.approx(math.exp(6 / 7), rel=1e-15)
    [row] = quality_rows({"m": SystemScores(nll=nll, tokens=tokens)}, None, count=50, seed=0)
    assert row["perplexity"]["value"] == pytest.approx(math.exp(6 / 7), rel=1e-15)
    assert set(row) == {"name", "sentences", "perplexity"}


def test_a_resampled_ratio_is_the_ratio_over_the_drawn_sentences():
    rng = np.random.default_rng(2)
    kl, tokens = rng.random(40) * 5, rng.integers(1, 30, 40).astype(np.float64)
    draws = resamples(40, 25, seed=9)
    resampled = ratio_resampled(RATIOS["kl"], kl, tokens, resample_weights(draws, 40))
    by_hand = [kl[d].sum() / tokens[d].sum() for d in draws]
    np.testing.assert_allclose(resampled, by_hand, rtol=1e-12)


def test_perplexity_differences_are_relative():
    rng = np.random.default_rng(3)
    tokens = rng.integers(5, 30, 200).astype(np.float64)
    nll = tokens * rng.uniform(1.5, 2.5, 200)
    # every token costs log 1.1 more nats: perplexity is 1.1 × the reference's on every resample
    worse = SystemScores(nll=nll + math.log(1.1) * tokens, tokens=tokens)
    systems = {"teacher": SystemScores(nll=nll, tokens=tokens), "student": worse}
    student = quality_rows(systems, None, count=200, seed=0)[1]
    entry = student["vs_teacher"]["perplexity"]
    assert entry["diff"] == pytest.approx(0.1, rel=1e-9)
    np.testing.assert_allclose(entry["ci95"], [0.1, 0.1], rtol=1e-9)
    assert verdict(entry, 0.15, higher_is_better=False) == "keeps"
    assert verdict(entry, 0.05, higher_is_better=False) == "worse"


def test_verdict_rules():
    def entry(low: float, high: float) -> dict:
        return difference_entry(0.5 * (low + high), np.array([low, high]), 0.0, np.zeros(2))

    # with two resamples the percentile interval is a shade inside [low, high]; use wide margins
    assert verdict(entry(0.1, 0.3), 0.5, higher_is_better=True) == "keeps"  # significant, yet within
    assert verdict(entry(1.0, 3.0), 0.5, higher_is_better=True) == "better"
    assert verdict(entry(1.0, 3.0), 0.5, higher_is_better=False) == "worse"
    assert verdict(entry(-3.0, -1.0), 0.5, higher_is_better=False) == "better"
    assert verdict(entry(-0.8, 1.4), 0.5, higher_is_better=True) == "not distinguishable"
    hand = {"diff": 0.3, "ci95": [-0.8, 1.4], "significant": False}
    assert verdict(hand, 0.5, higher_is_better=False) == "not distinguishable"
    assert within({"diff": 0.0, "ci95": [-0.5, 0.5], "significant": False}, 0.5)


def test_rows_compare_only_what_both_sides_have():
    tokens = np.full(SENTENCES, 10.0)
    nll = np.linspace(10.0, 30.0, SENTENCES)
    systems = {
        "teacher": SystemScores(GOOD, nll=nll, tokens=tokens),
        "student": SystemScores(
            DROPPED, nll=nll + 1.0, tokens=tokens, kl=np.ones(SENTENCES), agree=tokens - 1
        ),
        "scorer": SystemScores(nll=nll * 1.01, tokens=tokens),
    }
    rows = {row["name"]: row for row in quality_rows(systems, REFERENCES, count=100, seed=0)}
    student = rows["student"]
    assert student["sentences"] == SENTENCES
    assert student["kl"]["value"] == pytest.approx(0.1)
    assert student["agreement"]["value"] == pytest.approx(0.9)
    assert set(student["vs_teacher"]) == {"bleu", "chrf", "perplexity"}  # the teacher has no kl/agreement
    assert "vs_dense" not in student  # no dense system among them
    assert "vs_teacher" not in rows["teacher"]  # nothing is compared with itself
    assert set(rows["scorer"]) == {"name", "sentences", "perplexity", "vs_teacher"}
    assert json.loads(json.dumps(list(rows.values()))) == list(rows.values())


def test_systems_must_share_the_sentences():
    with pytest.raises(ValueError, match="same test sentences"):
        quality_rows({"a": SystemScores(GOOD), "b": SystemScores(GOOD[:-1])}, REFERENCES, seed=0)
    with pytest.raises(ValueError, match="same test sentences"):
        quality_rows({"a": SystemScores(GOOD)}, REFERENCES[:-1], seed=0)
    with pytest.raises(ValueError, match="disagree"):
        SystemScores(GOOD, tokens=np.ones(3)).sentences()


def test_a_system_trained_on_several_seeds_is_their_mean_with_their_spread():
    """Two seeds of one student: the row is the mean of the seeds' values on the full sample and on every
    shared resample (so its difference from the teacher is paired too); each seed's value and their sample
    standard deviation lie beside it."""
    tokens = np.full(SENTENCES, 10.0)
    nll = np.linspace(10.0, 30.0, SENTENCES)
    teacher = SystemScores(GOOD, nll=nll, tokens=tokens)
    seeds = [
        SystemScores(RIVAL, nll=nll + 1.0, tokens=tokens),
        SystemScores(DROPPED, nll=nll + 3.0, tokens=tokens),
    ]
    systems = {"teacher": teacher, "student": seeds, "one": seeds[0], "two": seeds[1]}
    rows = {row["name"]: row for row in quality_rows(systems, REFERENCES, count=RESAMPLES, seed=3)}
    student, one, two = rows["student"], rows["one"], rows["two"]
    for measure in ("bleu", "chrf", "perplexity"):
        values = [one[measure]["value"], two[measure]["value"]]
        assert student[measure]["value"] == pytest.approx(sum(values) / 2, rel=1e-12)
        assert student[measure]["spread"] == {
            "seeds": values,
            "sd": pytest.approx(abs(values[0] - values[1]) / math.sqrt(2), rel=1e-12),
        }
        low, high = student[measure]["ci95"]
        assert low < student[measure]["value"] < high
    # its difference from the teacher is the mean of the seeds' differences
    difference = student["vs_teacher"]["bleu"]["diff"]
    assert difference == pytest.approx(
        (one["vs_teacher"]["bleu"]["diff"] + two["vs_teacher"]["bleu"]["diff"]) / 2, rel=1e-12
    )
    assert student["vs_teacher"]["bleu"]["significant"] and difference < 0
    assert "spread" not in one["bleu"] and "spread" not in rows["teacher"]["bleu"]
