"""Multi-query associative recall (MQAR), the recall task of the Zoology study, generated as its reference
generator defines it.

Reference: HazyResearch/zoology, ``zoology/data/associative_recall.py``, function ``multiquery_ar``, read
at commit a26015756872be10588449e4323a424da7d43c2f (the file is ``zoology/data/multiquery_ar.py`` from
dbcb60d2 on, which adds ``num_passes``, JRT-style repeats of the context; not reproduced here, the published
task is one pass). Arora, Eyuboglu et al., "Zoology: Measuring and improving recall in efficient language
models", ICLR 2024.

Definition. V = vocab_size, T = input_seq_len, P = num_kv_pairs, a = power_a, H = ⌊V/2⌋, C = 2P (the
context), S = (T − C)/2 (the query slots). Each example, independently of the others:

* keys k_0 … k_{P−1}: an ordered sample without replacement, uniform, from {1, …, H − 1}; values
  v_0 … v_{P−1} likewise, independently, from {H, …, V − 1}. Token 0 is the blank.
* context: x[2j] = k_j and x[2j + 1] = v_j for 0 ≤ j < P.
* slots s_0 … s_{P−1}: distinct elements of {0, …, S − 1} drawn one after another (successive sampling
  without replacement) with weights w(s) = (s + 1)^(a − 1)::

      Pr(s_j = s | s_0 … s_{j−1}) = w(s) / Σ_{s' ∉ {s_0 … s_{j−1}}} w(s')

  so s_0 alone has the power law p(s) = w(s) / Σ w (a = 1: uniform; the published a = 0.01: p(s) ≈ 1/(s+1)).
* query j: x[C + 2 s_j] = k_j, labelled y[C + 2 s_j] = v_j, the next-token target: the model reads the key
  again and must emit its value.
* every other position t ≥ C is filler: x[t] = 0, or with ``random_non_queries`` a token uniform on
  {0, …, V − 1}, independently.
* y[t] = −100 (no loss) at every position but the P queries.

The query of key j recalls the pair at 2j from g_j = C + 2 s_j − 2j = 2(P − j + s_j) positions later (the
distance between the key's two occurrences: :func:`query_gaps`).

What the reference leaves implicit or gets wrong:

* The power law is over the slot s, the offset after the context, not over the distance g_j back to the
  pair, which adds 2(P − j): its docstring motivates it by "the gap between repeated bigrams".
* Key j's slot is the j-th draw, and with a < 1 early draws favour small slots, so the keys first in the
  context tend to be queried first: the query order is not a uniform shuffle of the context's (T = 256,
  P = 64: the first query asks for the first key in about 21% of examples, not 1/64).
* The value never appears in the inputs: after its query comes filler. It is only the label.
* Filler is ``torch.randint`` from torch's global generator, not the ``seed`` argument (which seeds NumPy's
  global generator, a side effect), so with random non-queries an example is not determined by its seed.
  Filler is uniform over the whole vocabulary: it can repeat a context key or value, unlabelled, or be 0.
* It asserts V > T, which nothing needs (keys and values need only H − 1 ≥ P and V − H ≥ P), and its own
  docstring example (V = 12, T = 16) fails it; kept here so that every spec accepted here is one the
  reference accepts. T even and T ≥ 4P (so S ≥ P) are needed. An odd V gives values one token more than keys.
* Its weights a·(s + 1)^(a − 1) carry a factor a that cancels; a = 0 makes them all 0 (NaN probabilities).
* Train and test segments get seeds from disjoint halves of [0, 2^32) (``zoology.data.utils.prepare_data``);
  there is no validation split and no check that a test example does not also occur in training.

How this module differs, none of it changing the distribution of an example:

* Randomness: ``np.random.default_rng(seed)`` (PCG64), one spawned child per block of :data:`BLOCK`
  examples, instead of NumPy's legacy global generator; so arrays match the reference's in distribution,
  not bit for bit. Filler comes from the same seeded generator, so an example is a function of
  (spec, seed, index): a shorter run gives a prefix of a longer one.
* Keys and values are drawn rank by rank (each uniform among the ranks not yet taken) rather than as the head
  of a random permutation, and slots by an exponential race (slot s rings at rate w(s); the first P to ring,
  in order), which is successive sampling with weights w, as is the reference's ``np.random.choice(...,
  replace=False, p=p)``.
* The arrays are built at length T directly, not at T + 1 and shifted: the same arrays (:func:`layout`).
* Splits: three seeds, train, valid and test, from one (:func:`split_seeds`).
* :class:`MqarSpec` rejects a ≤ 0 (the reference fails at 0 and silently accepts a < 0).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from pipeline.errors import UserError

IGNORE = -100  # the label of a position with no loss
BLOCK = 1024  # examples per spawned generator, always drawn whole: example i depends on (spec, seed, i) only
SPLITS = ("train", "valid", "test")


def _integer(name: str, value: object, least: int, why: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise UserError(f"MQAR {name} = {value!r} must be an integer >= {least}{why}")
    return int(value)


@dataclass(frozen=True)
class MqarSpec:
    """One MQAR task: vocabulary V, sequence length T, P key–value pairs, power-law exponent a, filler."""

    vocab_size: int
    input_seq_len: int
    num_kv_pairs: int
    power_a: float = 0.01
    random_non_queries: bool = True

    def __post_init__(self) -> None:
        pairs = _integer("num_kv_pairs", self.num_kv_pairs, 1)
        length = _integer(
            "input_seq_len",
            self.input_seq_len,
            4 * pairs,
            f" = 4·num_kv_pairs (the context takes 2·{pairs} positions, and each key needs a query slot of "
            "its own among every other position after it)",
        )
        if length % 2:
            raise UserError(
                f"MQAR input_seq_len = {length} must be even (queries sit on every other position after "
                "the context)"
            )
        vocab = _integer("vocab_size", self.vocab_size, 1)
        if vocab <= length:
            raise UserError(
                f"MQAR vocab_size = {vocab} must exceed input_seq_len = {length} (as Zoology's generator "
                "asserts)"
            )
        a = self.power_a
        if isinstance(a, bool) or not isinstance(a, numbers.Real) or not math.isfinite(a) or a <= 0:
            raise UserError(
                f"MQAR power_a = {a!r} must be a finite number > 0 (the exponent a of p(s) ∝ (s+1)^(a−1): "
                "0.01 as published, 1 for uniform)"
            )
        if not isinstance(self.random_non_queries, bool):
            raise UserError(f"MQAR random_non_queries = {self.random_non_queries!r} must be true or false")
        for name, value in (
            ("vocab_size", vocab),
            ("input_seq_len", length),
            ("num_kv_pairs", pairs),
            ("power_a", float(a)),
        ):
            object.__setattr__(self, name, value)

    @property
    def context_len(self) -> int:
        """C = 2P: the positions holding the key–value pairs."""
        return 2 * self.num_kv_pairs

    @property
    def num_slots(self) -> int:
        """S = (T − C)/2: the positions a query can take, C, C + 2, …, T − 2."""
        return (self.input_seq_len - self.context_len) // 2

    def to_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (``mqar.json``)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MqarSpec:
        """The spec :meth:`to_json` wrote; one-line :class:`UserError` for a missing or unknown field."""
        if not isinstance(data, Mapping):
            raise UserError(f"an MQAR spec must be a JSON object; got {type(data).__name__}")
        allowed = [field.name for field in fields(cls)]
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise UserError(
                f"MQAR spec has unknown field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
            )
        missing = [name for name in ("vocab_size", "input_seq_len", "num_kv_pairs") if name not in data]
        if missing:
            raise UserError(f"MQAR spec lacks field(s) {', '.join(missing)}")
        return cls(**data)


def slot_probabilities(spec: MqarSpec) -> np.ndarray:
    """p(s) ∝ (s + 1)^(a − 1) over the S slots (float64, (S,)): the law of the first key's slot, the
    reference's ``p``."""
    weights = np.arange(1, spec.num_slots + 1, dtype=np.float64) ** (spec.power_a - 1)
    return weights / weights.sum()


def _ordered_sample(rng: np.random.Generator, n: int, low: int, high: int, size: int) -> np.ndarray:
    """(n, size) int64: each row an ordered sample without replacement, uniform, from {low, …, high − 1}."""
    out = np.empty((n, size), dtype=np.int64)
    taken = np.empty((n, 0), dtype=np.int64)  # (n, j): the offsets drawn so far, ascending in each row
    for j in range(size):
        offset = rng.integers(0, high - low - j, size=n)  # (n,): a rank among the offsets not yet taken
        for column in range(j):  # the rank-th untaken offset: step over each taken one at or below it
            offset += taken[:, column] <= offset
        out[:, j] = offset
        taken = np.sort(np.concatenate([taken, offset[:, None]], axis=1), axis=1)
    return out + low


def _slots(rng: np.random.Generator, n: int, spec: MqarSpec) -> np.ndarray:
    """(n, P) int64: each row's slots s_0 … s_{P−1}, successive sampling with weights (s + 1)^(a − 1).

    An exponential race: slot s rings after an Exp(w(s)) time; the first to ring is s with probability
    w(s)/Σw and, the clocks being memoryless, each next one likewise among those left."""
    weights = np.arange(1, spec.num_slots + 1, dtype=np.float64) ** (spec.power_a - 1)  # (S,)
    rings = rng.standard_exponential(size=(n, spec.num_slots)) / weights  # (n, S)
    return np.argsort(rings, axis=1)[:, : spec.num_kv_pairs].astype(np.int64)


def layout(
    spec: MqarSpec,
    keys: np.ndarray,
    values: np.ndarray,
    slots: np.ndarray,
    filler: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels, (n, T) int64 each, of the examples with these draws: ``keys``, ``values`` and
    ``slots`` (n, P), ``filler`` (n, T) for the blank positions (None: leave them 0)."""
    n = keys.shape[0]
    context, length = spec.context_len, spec.input_seq_len
    rows = np.arange(n)[:, None]  # (n, 1)
    queries = context + 2 * np.asarray(slots, dtype=np.int64)  # (n, P)
    inputs = np.zeros((n, length), dtype=np.int64)
    inputs[:, 0:context:2] = keys
    inputs[:, 1:context:2] = values
    inputs[rows, queries] = keys
    labels = np.full((n, length), IGNORE, dtype=np.int64)
    labels[rows, queries] = values
    if filler is not None:
        blank = np.ones((n, length), dtype=bool)
        blank[:, :context] = False
        blank[rows, queries] = False
        inputs[blank] = filler[blank]
    return inputs, labels


def _block(spec: MqarSpec, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    half, vocab = spec.vocab_size // 2, spec.vocab_size
    keys = _ordered_sample(rng, n, 1, half, spec.num_kv_pairs)  # (n, P)
    values = _ordered_sample(rng, n, half, vocab, spec.num_kv_pairs)  # (n, P)
    slots = _slots(rng, n, spec)  # (n, P)
    filler = rng.integers(0, vocab, size=(n, spec.input_seq_len)) if spec.random_non_queries else None
    return layout(spec, keys, values, slots, filler)


def _seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise UserError(f"MQAR seed = {seed!r} must be an integer >= 0")
    return int(seed)


def generate(spec: MqarSpec, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` examples of ``spec``: inputs and labels, (count, T) int64 each, labels −100 but at the P
    queries of each row.

    Example i comes from child i // :data:`BLOCK` of ``np.random.default_rng(seed)``, which draws a whole
    block's keys, values, slots, then filler (when random), even where ``count`` cuts the block short; so
    the same (spec, seed) give the same examples whatever ``count``, and ``random_non_queries`` changes the
    filler only."""
    count = _integer("count", count, 0)
    rng = np.random.default_rng(_seed(seed))
    parts = [_block(spec, child, BLOCK) for child in rng.spawn(-(-count // BLOCK))]  # whole blocks, cut below
    if not parts:
        empty = np.empty((0, spec.input_seq_len), dtype=np.int64)
        return empty, empty.copy()
    return np.concatenate([p[0] for p in parts])[:count], np.concatenate([p[1] for p in parts])[:count]


def answer_positions(labels: np.ndarray) -> np.ndarray:
    """(n, P) int64: the positions of each row's labelled queries, ascending; rows must agree on P."""
    answered = labels != IGNORE  # (n, T)
    per_row = answered.sum(axis=1)  # (n,)
    if len(per_row) == 0:
        return np.empty((0, 0), dtype=np.int64)
    if (per_row != per_row[0]).any():
        raise UserError(
            f"MQAR labels hold {per_row.min()} to {per_row.max()} answers per row; every row must hold "
            "num_kv_pairs"
        )
    return np.nonzero(answered)[1].reshape(len(per_row), -1).astype(np.int64)


def recalled_positions(inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(n, P) int64: for each answer position (:func:`answer_positions`), the position 2j in the context
    of the key queried there."""
    answers = answer_positions(labels)  # (n, P)
    pairs = answers.shape[1]
    queried = np.take_along_axis(inputs, answers, axis=1)  # (n, P)
    keys = inputs[:, 0 : 2 * pairs : 2]  # (n, P)
    match = queried[:, :, None] == keys[:, None, :]  # (n, P answers, P keys)
    if (match.sum(axis=2) != 1).any():
        raise UserError("MQAR inputs query a token that is not exactly one of the context's keys")
    return 2 * match.argmax(axis=2).astype(np.int64)


def query_gaps(inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(n, P) int64: for each answer position, how far back the key's first occurrence is (g_j = 2(P − j +
    s_j) for key j in slot s_j)."""
    return answer_positions(labels) - recalled_positions(inputs, labels)


def split_seeds(seed: int) -> dict[str, int]:
    """Seeds of the train, valid and test examples: the first 64-bit word of the state of each of the first
    three children of ``np.random.SeedSequence(seed)``, so no two splits share a generator stream."""
    children = np.random.SeedSequence(_seed(seed)).spawn(len(SPLITS))
    seeds = {
        name: int(child.generate_state(1, np.uint64)[0]) for name, child in zip(SPLITS, children, strict=True)
    }
    if len(set(seeds.values())) != len(SPLITS):  # a 64-bit collision: never seen, but checked
        raise AssertionError(f"split seeds of {seed} collide: {seeds}")
    return seeds
