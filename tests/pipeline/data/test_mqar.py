"""MQAR generation: the definition's properties, its power law, and agreement with Zoology's generator.

Laws are checked by a chi-square test at fixed seeds; each has a wrong sampler beside it that the same test
rejects, so that a pass says something.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from scipy import stats

from pipeline.data import mqar
from pipeline.data.mqar import (
    IGNORE,
    MqarSpec,
    answer_positions,
    generate,
    layout,
    query_gaps,
    recalled_positions,
    slot_probabilities,
    split_seeds,
)
from pipeline.errors import UserError

SPEC = MqarSpec(vocab_size=64, input_seq_len=48, num_kv_pairs=6)
ODD = MqarSpec(vocab_size=61, input_seq_len=40, num_kv_pairs=8, power_a=0.5, random_non_queries=False)
ACCEPT = 1e-4  # a chi-square p-value below this rejects the law


def chi_square_p(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = probabilities * counts.sum()
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(statistic, len(probabilities) - 1))


def reference_draws(vocab_size, num_examples, input_seq_len, seed, power_a, num_kv_pairs):
    """Zoology's ``multiquery_ar`` (HazyResearch/zoology a2601575, zoology/data/associative_recall.py), its
    NumPy draws line for line, with a RandomState for the global generator its ``np.random.seed`` seeds: bit
    for bit the reference's keys, values and gaps (its slots)."""
    random = np.random.RandomState(seed)
    context_size = num_kv_pairs * 2
    key_vocab_size = vocab_size // 2
    key_choices = np.arange(1, key_vocab_size)
    value_choices = np.arange(key_vocab_size, vocab_size)
    keys_unshuffled = np.tile(key_choices, (num_examples, 1))
    keys = np.apply_along_axis(random.choice, 1, keys_unshuffled, replace=False, size=num_kv_pairs)
    values_unshuffled = np.tile(value_choices, (num_examples, 1))
    values = np.apply_along_axis(random.choice, 1, values_unshuffled, replace=False, size=num_kv_pairs)
    space = (input_seq_len - context_size) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    x = np.stack([np.arange(space, dtype=int)] * num_examples)
    gaps = np.apply_along_axis(random.choice, axis=1, arr=x, replace=False, p=p, size=num_kv_pairs)
    return keys, values, gaps


def reference_arrays(keys, values, gaps, input_seq_len, filler=None):
    """The reference's construction from its draws, line for line (NumPy for its final torch lines; its
    ``torch.randint`` filler is ``filler`` here)."""
    num_examples, num_kv_pairs = keys.shape
    context_size = num_kv_pairs * 2
    kvs = np.zeros((num_examples, context_size), dtype=np.int64)
    kvs[:, 0::2] = keys
    kvs[:, 1::2] = values
    queries = np.zeros((num_examples, input_seq_len - context_size + 1), dtype=np.int64)
    np.put_along_axis(queries, (gaps * 2), values=keys, axis=1)
    examples = np.concatenate([kvs, queries], axis=1)
    labels = np.full((num_examples, input_seq_len + 1), -100, dtype=np.int64)
    np.put_along_axis(labels, (gaps * 2) + context_size + 1, values=values, axis=1)
    inputs, labels = examples[:, :-1].copy(), labels[:, 1:]
    if filler is not None:
        inputs[inputs == 0] = filler[inputs == 0]
    return inputs, labels


def slots_by_key(spec: MqarSpec, inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(n, P): the slot s_j of key j, read back from the arrays."""
    answers = answer_positions(labels)
    slots = np.empty_like(answers)
    np.put_along_axis(slots, recalled_positions(inputs, labels) // 2, (answers - spec.context_len) // 2, 1)
    return slots


def blank_mask(spec: MqarSpec, labels: np.ndarray) -> np.ndarray:
    """(n, T): the filler positions, after the context and not a query."""
    blank = np.ones(labels.shape, dtype=bool)
    blank[:, : spec.context_len] = False
    blank[labels != IGNORE] = False
    return blank


def test_worked_example():
    spec = MqarSpec(vocab_size=18, input_seq_len=16, num_kv_pairs=2, random_non_queries=False)
    keys, values, slots = np.array([[2, 4]]), np.array([[17, 12]]), np.array([[1, 4]])
    inputs, labels = layout(spec, keys, values, slots)
    x = [2, 17, 4, 12, 0, 0, 2, 0, 0, 0, 0, 0, 4, 0, 0, 0]
    y = [IGNORE] * 16
    y[6], y[12] = 17, 12
    assert inputs.tolist() == [x] and labels.tolist() == [y]
    assert answer_positions(labels).tolist() == [[6, 12]]
    assert recalled_positions(inputs, labels).tolist() == [[0, 2]]
    assert query_gaps(inputs, labels).tolist() == [[6, 10]]  # 2(P − j + s_j)


@pytest.mark.parametrize("random_non_queries", [False, True])
def test_layout_is_the_reference_construction(random_non_queries):
    spec = MqarSpec(vocab_size=40, input_seq_len=32, num_kv_pairs=5, random_non_queries=random_non_queries)
    keys, values, gaps = reference_draws(40, 50, 32, seed=3, power_a=0.01, num_kv_pairs=5)
    filler = np.random.default_rng(0).integers(0, 40, size=(50, 32)) if random_non_queries else None
    ours = layout(spec, keys, values, gaps, filler)
    theirs = reference_arrays(keys, values, gaps, 32, filler)
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


def test_slot_order_follows_successive_sampling_as_the_reference_does():
    """The ordered slots (s_0, s_1, s_2) of a tiny task, ours and the reference's, against their exact law
    Π_j w(s_j) / (Σw − Σ_{i<j} w(s_i)); the same slots shuffled within each row (a sampler that forgets which
    key was drawn first) fail it."""
    spec = MqarSpec(vocab_size=17, input_seq_len=16, num_kv_pairs=3, random_non_queries=False)
    slots_n, count = spec.num_slots, 6000
    weights = slot_probabilities(spec)
    tuples = list(itertools.permutations(range(slots_n), 3))
    exact = np.array(
        [np.prod([weights[s] / (1 - weights[list(t[:j])].sum()) for j, s in enumerate(t)]) for t in tuples]
    )
    assert exact.sum() == pytest.approx(1.0)

    def counts(slots):
        codes = (slots * np.array([slots_n**2, slots_n, 1])).sum(axis=1)
        return np.array([np.count_nonzero(codes == a * slots_n**2 + b * slots_n + c) for a, b, c in tuples])

    ours = slots_by_key(spec, *generate(spec, count, seed=5))
    theirs = reference_draws(17, count, 16, seed=5, power_a=0.01, num_kv_pairs=3)[2]
    shuffled = np.random.default_rng(1).permuted(ours, axis=1)
    assert chi_square_p(counts(ours), exact) > ACCEPT
    assert chi_square_p(counts(theirs), exact) > ACCEPT
    assert chi_square_p(counts(shuffled), exact) < ACCEPT


@pytest.mark.parametrize("spec", [SPEC, ODD], ids=["even-vocab", "odd-vocab"])
def test_tokens_lie_in_their_ranges_and_the_context_repeats_none(spec):
    inputs, _ = generate(spec, 300, seed=0)
    half, pairs = spec.vocab_size // 2, spec.num_kv_pairs
    keys, values = inputs[:, 0 : 2 * pairs : 2], inputs[:, 1 : 2 * pairs : 2]
    assert keys.min() >= 1 and keys.max() < half
    assert values.min() >= half and values.max() < spec.vocab_size
    assert inputs.min() >= 0 and inputs.max() < spec.vocab_size
    assert all(len(set(row)) == pairs for row in keys.tolist())
    assert all(len(set(row)) == pairs for row in values.tolist())


def test_keys_and_values_are_uniform_ordered_samples():
    """Keys from {1 … 6} and values from {7 … 13} (V = 14): each ordered triple equally likely."""
    spec = MqarSpec(vocab_size=14, input_seq_len=12, num_kv_pairs=3, random_non_queries=False)
    inputs, _ = generate(spec, 12_000, seed=2)
    for first, population in ((0, range(1, 7)), (1, range(7, 14))):
        tuples = list(itertools.permutations(population, 3))
        index = {t: i for i, t in enumerate(tuples)}
        counts = np.bincount(
            [index[tuple(row)] for row in inputs[:, first:6:2].tolist()], minlength=len(tuples)
        )
        assert chi_square_p(counts, np.full(len(tuples), 1 / len(tuples))) > ACCEPT


@pytest.mark.parametrize("spec", [SPEC, ODD], ids=["even-vocab", "odd-vocab"])
def test_every_key_is_queried_once_after_the_context(spec):
    inputs, labels = generate(spec, 300, seed=1)
    pairs, context = spec.num_kv_pairs, spec.context_len
    answers = answer_positions(labels)
    assert answers.shape == (300, pairs)
    assert answers.min() >= context and answers.max() <= spec.input_seq_len - 2
    assert ((answers - context) % 2 == 0).all()
    queried = np.sort(np.take_along_axis(inputs, answers, axis=1), axis=1)
    np.testing.assert_array_equal(queried, np.sort(inputs[:, 0:context:2], axis=1))


@pytest.mark.parametrize("spec", [SPEC, ODD], ids=["even-vocab", "odd-vocab"])
def test_labels_are_the_values_of_the_keys_read_there(spec):
    """−100 everywhere but P positions; there the input is a key and the label its value (the next token)."""
    inputs, labels = generate(spec, 200, seed=4)
    for x, y in zip(inputs.tolist(), labels.tolist(), strict=True):
        value_of = dict(zip(x[0 : spec.context_len : 2], x[1 : spec.context_len : 2], strict=True))
        answered = [t for t, label in enumerate(y) if label != IGNORE]
        assert len(answered) == spec.num_kv_pairs
        assert all(y[t] == value_of[x[t]] for t in answered)


def test_gaps_and_recalled_positions_agree_with_the_inputs():
    inputs, labels = generate(SPEC, 300, seed=6)
    answers, recalled = answer_positions(labels), recalled_positions(inputs, labels)
    assert recalled.min() >= 0 and recalled.max() < SPEC.context_len and (recalled % 2 == 0).all()
    np.testing.assert_array_equal(
        np.take_along_axis(inputs, recalled, axis=1), np.take_along_axis(inputs, answers, axis=1)
    )
    np.testing.assert_array_equal(query_gaps(inputs, labels), answers - recalled)
    pairs = SPEC.num_kv_pairs
    slots = (answers - SPEC.context_len) // 2
    np.testing.assert_array_equal(query_gaps(inputs, labels), 2 * (pairs - recalled // 2 + slots))


def test_slots_follow_the_power_law():
    """Key 0's slot has law p(s) ∝ (s+1)^(a−1) (the reference's p), key 1's Σ_{x≠s} p(x)·p(s)/(1 − p(x));
    a uniform sampler, and the generator at a = 1 or a = 0.5, fail the first."""
    spec = MqarSpec(vocab_size=256, input_seq_len=128, num_kv_pairs=4, power_a=0.01, random_non_queries=False)
    count, slots_n = 20_000, spec.num_slots
    p = slot_probabilities(spec)
    reference_p = 0.01 * np.arange(1, slots_n + 1) ** (0.01 - 1)
    np.testing.assert_allclose(p, reference_p / reference_p.sum(), rtol=1e-12)
    second = np.array(
        [sum(p[x] * p[s] / (1 - p[x]) for x in range(slots_n) if x != s) for s in range(slots_n)]
    )

    slots = slots_by_key(spec, *generate(spec, count, seed=8))
    assert chi_square_p(np.bincount(slots[:, 0], minlength=slots_n), p) > ACCEPT
    assert chi_square_p(np.bincount(slots[:, 1], minlength=slots_n), second) > ACCEPT

    uniform = np.random.default_rng(0).integers(0, slots_n, size=count)
    assert chi_square_p(np.bincount(uniform, minlength=slots_n), p) < ACCEPT
    for wrong in (1.0, 0.5):
        other = MqarSpec(256, 128, 4, power_a=wrong, random_non_queries=False)
        wrong_slots = slots_by_key(other, *generate(other, count, seed=8))
        assert chi_square_p(np.bincount(wrong_slots[:, 0], minlength=slots_n), p) < ACCEPT


def test_filler_follows_random_non_queries():
    """The flag changes the filler only: 0, or uniform over the whole vocabulary."""
    blanked = MqarSpec(vocab_size=64, input_seq_len=48, num_kv_pairs=6, random_non_queries=False)
    zeros, zero_labels = generate(blanked, 500, seed=9)
    randoms, random_labels = generate(SPEC, 500, seed=9)
    np.testing.assert_array_equal(zero_labels, random_labels)
    blank = blank_mask(SPEC, random_labels)
    np.testing.assert_array_equal(zeros[~blank], randoms[~blank])
    assert (zeros[blank] == 0).all()
    counts = np.bincount(randoms[blank], minlength=SPEC.vocab_size)
    assert chi_square_p(counts, np.full(SPEC.vocab_size, 1 / SPEC.vocab_size)) > ACCEPT


def test_same_seed_same_examples_and_a_shorter_run_is_a_prefix(monkeypatch):
    first = generate(SPEC, 40, seed=7)
    again = generate(SPEC, 40, seed=7)
    other = generate(SPEC, 40, seed=8)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0]) and not np.array_equal(first[1], other[1])
    monkeypatch.setattr(mqar, "BLOCK", 16)  # cross block boundaries, and cut one short, cheaply
    long, short = generate(SPEC, 40, seed=7), generate(SPEC, 21, seed=7)
    for a, b in zip(long, short, strict=True):
        np.testing.assert_array_equal(a[:21], b)
    assert generate(SPEC, 0, seed=7)[0].shape == (0, SPEC.input_seq_len)


def test_split_seeds_differ_and_give_different_examples():
    seeds = split_seeds(123)
    assert list(seeds) == ["train", "valid", "test"]
    assert len(set(seeds.values())) == 3 and split_seeds(123) == seeds
    assert set(split_seeds(124).values()).isdisjoint(seeds.values())
    spec = MqarSpec(vocab_size=8192, input_seq_len=64, num_kv_pairs=4)
    rows = {
        name: {tuple(row) for row in generate(spec, 200, seed)[0].tolist()} for name, seed in seeds.items()
    }
    assert all(len(rows[a] & rows[b]) == 0 for a, b in itertools.combinations(rows, 2))


def test_spec_round_trips_through_json():
    for spec in (SPEC, ODD):
        assert MqarSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    spec = MqarSpec.from_json({"vocab_size": 64, "input_seq_len": 48, "num_kv_pairs": 6, "power_a": 1})
    assert spec.power_a == 1.0 and isinstance(spec.power_a, float) and spec.random_non_queries is True


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vocab_size", 48),  # not above input_seq_len
        ("vocab_size", True),
        ("input_seq_len", 47),  # odd
        ("input_seq_len", 22),  # below 4·num_kv_pairs
        ("num_kv_pairs", 0),
        ("num_kv_pairs", 2.5),
        ("power_a", 0.0),
        ("power_a", -0.5),
        ("power_a", float("nan")),
        ("power_a", "0.01"),
        ("random_non_queries", "yes"),
    ],
)
def test_bad_spec_fields_are_one_line_user_errors(field, value):
    data = {**SPEC.to_json(), field: value}
    with pytest.raises(UserError, match=field) as caught:
        MqarSpec.from_json(data)
    assert "\n" not in str(caught.value) and "must" in str(caught.value)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({**SPEC.to_json(), "seed": 3}, "unknown field"),
        ({"vocab_size": 64, "input_seq_len": 48}, "lacks field"),
        ([64, 48, 6], "JSON object"),
    ],
)
def test_from_json_rejects_other_shapes(data, says):
    with pytest.raises(UserError, match=says):
        MqarSpec.from_json(data)


@pytest.mark.parametrize(("count", "seed", "says"), [(-1, 0, "count"), (2, -1, "seed"), (2, 1.5, "seed")])
def test_generate_rejects_bad_count_and_seed(count, seed, says):
    with pytest.raises(UserError, match=says):
        generate(SPEC, count, seed)


def test_ragged_labels_are_rejected():
    _, labels = generate(SPEC, 3, seed=0)
    labels[1, answer_positions(labels)[1, 0]] = IGNORE
    with pytest.raises(UserError, match="answers per row"):
        answer_positions(labels)
