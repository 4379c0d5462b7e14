"""95 % paired bootstrap intervals over test sentences, for systems scored on the same sentences.

One evaluation draws one set of resamples: B index vectors of length S (the test sentences), each drawn
uniformly with replacement, ``np.random.default_rng(seed).choice(S, size=(B, S), replace=True)`` — the draw
sacreBLEU's own paired bootstrap makes (``sacrebleu.significance._paired_bs_test``). Every system and every
measure of the evaluation is scored on these same resamples, so a difference between two systems is paired:
resample b gives d_b = m_sys(b) − m_ref(b) on exactly the same sentences.

Every measure is a function of sums over sentences, so a resample only needs the sums over its draw.
With w_b,s the number of times sentence s is drawn in resample b (the resample's *weights*, (B, S)), a
resample's sum of any per-sentence quantity x is Σ_s w_b,s x_s = (W x)_b — one matrix product for all
resamples, equal to summing x over the drawn indices.

* Corpus metrics (BLEU, chrF) are sacreBLEU's own: its per-sentence sufficient statistics
  (``metric._extract_corpus_statistics``), summed over a resample and scored with
  ``metric._compute_score_from_stats`` — exactly how ``_paired_bs_test`` scores its resamples, so nothing of
  BLEU or chrF is re-implemented here. The full-sample value is the same call on the sums over all
  sentences, which equals ``metric.corpus_score`` (pinned by a test, since these names are private).
  sacreBLEU keeps the statistics in float32, so its precisions are float32 arithmetic; here they are
  float64 (the integer sums exact), and a resample's score agrees with sacreBLEU's to about 1e-8.
* Teacher-forced measures are ratios of sums, value = f(Σ_s num_s / Σ_s den_s):
  perplexity = exp(Σ nll / Σ tokens), KL = Σ kl / Σ tokens, agreement = Σ agree / Σ tokens,
  (mlm, mqar) accuracy = Σ correct / Σ tokens; (mqar) accuracy near and far = the same over the answers
  whose key lies at most, or more than, the split's median distance back.

Intervals are percentile intervals: [q_2.5, q_97.5] of the B resampled values (numpy's default linear
interpolation between order statistics). A row's entry is ``{"value": v, "ci95": [lo, hi]}`` with v the
full-sample value; a difference's entry is ``{"diff": d, "ci95": [lo, hi], "significant": lo > 0 or hi < 0}``
with d the full-sample difference and [lo, hi] the percentile interval of the paired d_b.

Perplexity differences are relative: d = ppl_sys / ppl_ref − 1 (and d_b likewise per resample), so a
tolerance on it is a fraction (0.02 = 2 %). Percentile intervals follow monotone maps up to the
interpolation between order statistics, so this interval is, to that interpolation, exp(interval of
Δ log ppl) − 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric

DEFAULT_RESAMPLES = 1000
"""sacreBLEU's default number of paired bootstrap resamples."""

PERCENTILES = (2.5, 97.5)
"""The percentile interval's ends: a 95 % interval."""

HIGHER_IS_BETTER = {
    "bleu": True,
    "chrf": True,
    "perplexity": False,
    "kl": False,
    "agreement": True,
    "accuracy": True,
    "accuracy_near": True,
    "accuracy_far": True,
}
"""Per measure, whether a larger value is better (for :func:`verdict`)."""

TEACHER = "teacher"
"""The name of the teacher's row, the reference every other row is compared with."""

DENSE = "dense"
"""The name of the dense control's row (the teacher trained further the same way as the students)."""

RELATIVE = frozenset({"perplexity"})
"""Measures whose difference entries are relative (value_sys / value_ref − 1), not value_sys − value_ref."""

Verdict = Literal["keeps", "better", "worse", "not distinguishable"]


@dataclass(frozen=True)
class Ratio:
    """A measure f(Σ_s numerator_s / Σ_s denominator_s) of two per-sentence sums of :class:`SystemScores`."""

    numerator: str
    denominator: str
    exponentiate: bool = False  # f = exp (perplexity from nll); otherwise f is the identity


RATIOS = {
    "perplexity": Ratio("nll", "tokens", exponentiate=True),
    "kl": Ratio("kl", "tokens"),
    "agreement": Ratio("agree", "tokens"),
    "accuracy": Ratio("correct", "tokens"),
    "accuracy_near": Ratio("correct_near", "tokens_near"),
    "accuracy_far": Ratio("correct_far", "tokens_far"),
}
"""The teacher-forced measures, each from the per-sentence sums it needs."""


@dataclass(frozen=True)
class SystemScores:
    """What one system produced on the test sentences, in the sentences' order; anything may be absent.

    ``hypotheses`` are its detokenized outputs (for BLEU/chrF). The arrays are per-sentence sums, each (S,):
    ``nll`` (Σ_t −log q_t(y_t)), ``tokens`` (target tokens scored), ``kl`` (Σ_t KL(p_t ‖ q_t) against the
    teacher), ``agree`` (Σ_t [argmax q_t = argmax p_t]) and ``correct`` (mlm: masked tokens predicted right;
    mqar: answers), and for mqar the same two counts over the near and the far answers alone.
    """

    hypotheses: Sequence[str] | None = None
    nll: np.ndarray | None = None
    tokens: np.ndarray | None = None
    kl: np.ndarray | None = None
    agree: np.ndarray | None = None
    correct: np.ndarray | None = None
    tokens_near: np.ndarray | None = None
    correct_near: np.ndarray | None = None
    tokens_far: np.ndarray | None = None
    correct_far: np.ndarray | None = None

    def sentences(self) -> int:
        """The number of sentences, checked to agree across everything present."""
        sizes = {name: len(value) for name in _FIELDS if (value := getattr(self, name)) is not None}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"system scores disagree on (or lack) the number of sentences: {sizes}")
        return next(iter(sizes.values()))


_FIELDS = tuple(field.name for field in fields(SystemScores))


def default_metrics() -> dict[str, Metric]:
    """sacreBLEU's BLEU and chrF with their default settings (as the pipeline reports them)."""
    return {"bleu": BLEU(), "chrf": CHRF()}


def resamples(sentences: int, count: int = DEFAULT_RESAMPLES, *, seed: int) -> np.ndarray:
    """(count, sentences) int indices: ``count`` draws of ``sentences`` sentences with replacement.

    The same call as ``sacrebleu.significance._paired_bs_test`` makes, so with the same seed the resamples
    are sacreBLEU's. One evaluation draws once and scores every system and measure on these indices.
    """
    rng = np.random.default_rng(seed)
    return rng.choice(sentences, size=(count, sentences), replace=True)


def resample_weights(draws: np.ndarray, sentences: int) -> np.ndarray:
    """(B, S) float64 w: w_b,s = how many times sentence s is in resample b (each row sums to S).

    Σ_s w_b,s x_s equals ``x[draws[b]].sum()`` for any per-sentence x, without the (B, S, k) gather.
    """
    count = draws.shape[0]
    flat = (draws + sentences * np.arange(count)[:, None]).ravel()  # (B·S,) position in the flattened (B, S)
    return np.bincount(flat, minlength=count * sentences).reshape(count, sentences).astype(np.float64)


def metric_statistics(metric: Metric, hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """(S, k) float64: sacreBLEU's per-sentence sufficient statistics of ``metric`` (one reference each).

    BLEU: k = 2 + 2·4 (hypothesis length, reference length, matching and total n-grams for n = 1…4);
    chrF: k = 3 per character/word n-gram order (hypothesis, reference and matching n-grams).
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    statistics = metric._extract_corpus_statistics(list(hypotheses), [list(references)])
    return np.asarray(statistics, dtype=np.float64)


def metric_score(metric: Metric, totals: np.ndarray) -> float:
    """sacreBLEU's score of statistics already summed over sentences ((k,)), as its bootstrap scores them."""
    # a fresh list: BLEU's add-k smoothing adds to the counts it is given in place
    return float(metric._compute_score_from_stats(totals.tolist()).score)


def metric_resampled(metric: Metric, statistics: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(B,) the metric on every resample: each row of W · statistics ((B, k) sums) scored by sacreBLEU."""
    totals = weights @ statistics  # (B, S) @ (S, k) -> (B, k)
    return np.array([metric_score(metric, row) for row in totals])


def ratio_value(ratio: Ratio, numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray | float:
    """f(Σ numerator / Σ denominator) along the last axis: (…, S) sums -> (…) values."""
    value = numerator.sum(-1) / denominator.sum(-1)
    return np.exp(value) if ratio.exponentiate else value


def ratio_resampled(
    ratio: Ratio, numerator: np.ndarray, denominator: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """(B,) f(Σ_s w_b,s numerator_s / Σ_s w_b,s denominator_s) for every resample b."""
    value = (weights @ numerator) / (weights @ denominator)  # (B,)
    return np.exp(value) if ratio.exponentiate else value


def interval(resampled: np.ndarray) -> list[float]:
    """The 95 % percentile interval [q_2.5, q_97.5] of resampled values (linear interpolation)."""
    low, high = np.percentile(resampled, PERCENTILES)
    return [float(low), float(high)]


def row_entry(value: float, resampled: np.ndarray) -> dict[str, Any]:
    """``{"value": v, "ci95": [lo, hi]}``: the full-sample value, the percentile interval of its resamples."""
    return {"value": float(value), "ci95": interval(resampled)}


def difference_entry(
    value: float,
    resampled: np.ndarray,
    reference: float,
    reference_resampled: np.ndarray,
    *,
    relative: bool = False,
) -> dict[str, Any]:
    """``{"diff": d, "ci95": [lo, hi], "significant": bool}`` of a system against a reference, paired.

    d = value − reference (relative: value / reference − 1); [lo, hi] is the percentile interval of the same
    difference on each shared resample; significant when the interval excludes 0 (lo > 0 or hi < 0).
    """
    if relative:
        diff, resampled_diff = value / reference - 1, resampled / reference_resampled - 1
    else:
        diff, resampled_diff = value - reference, resampled - reference_resampled
    low, high = interval(resampled_diff)
    return {"diff": float(diff), "ci95": [low, high], "significant": bool(low > 0 or high < 0)}


def within(entry: Mapping[str, Any], tolerance: float) -> bool:
    """Whether a difference's whole interval lies inside [−tolerance, +tolerance]."""
    low, high = entry["ci95"]
    return -tolerance <= low and high <= tolerance


def verdict(entry: Mapping[str, Any], tolerance: float, higher_is_better: bool) -> Verdict:
    """What a difference entry (system − reference) supports, checked in this order:

    "keeps" when its interval lies inside ±tolerance (:func:`within`); otherwise "better" or "worse" when
    the interval excludes 0 (on the side ``higher_is_better`` calls better); otherwise "not distinguishable"
    (the interval holds 0 but reaches beyond the tolerance: the sentences cannot tell).
    """
    if within(entry, tolerance):
        return "keeps"
    if entry["significant"]:
        return "better" if (entry["ci95"][0] > 0) == higher_is_better else "worse"
    return "not distinguishable"


def measure_estimates(
    scores: SystemScores,
    references: Sequence[str] | None,
    metrics: Mapping[str, Metric],
    weights: np.ndarray,
) -> dict[str, tuple[float, np.ndarray]]:
    """Per measure the system has what it needs for: (full-sample value, (B,) resampled values)."""
    estimates: dict[str, tuple[float, np.ndarray]] = {}
    if scores.hypotheses is not None and references is not None:
        for name, metric in metrics.items():
            statistics = metric_statistics(metric, scores.hypotheses, references)  # (S, k)
            value = metric_score(metric, statistics.sum(0))
            estimates[name] = (value, metric_resampled(metric, statistics, weights))
    for name, ratio in RATIOS.items():
        numerator, denominator = getattr(scores, ratio.numerator), getattr(scores, ratio.denominator)
        if numerator is None or denominator is None:
            continue
        numerator, denominator = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
        estimates[name] = (
            float(ratio_value(ratio, numerator, denominator)),
            ratio_resampled(ratio, numerator, denominator, weights),
        )
    return estimates


def _seed_estimates(
    seeds: Sequence[SystemScores],
    references: Sequence[str] | None,
    metrics: Mapping[str, Metric],
    weights: np.ndarray,
) -> tuple[dict[str, tuple[float, np.ndarray]], dict[str, list[float]]]:
    """A system trained once per seed, as the mean of its seeds: per measure every seed has (mean of the
    seeds' full-sample values, (B,) mean of their values on each shared resample), and each seed's value.

    The interval of the mean is over test sentences, the seeds held fixed; their spread is beside it."""
    each = [measure_estimates(scores, references, metrics, weights) for scores in seeds]
    shared = [name for name in each[0] if all(name in own for own in each)]
    estimates = {
        name: (
            float(np.mean([own[name][0] for own in each])),
            np.mean([own[name][1] for own in each], axis=0),
        )
        for name in shared
    }
    return estimates, {name: [own[name][0] for own in each] for name in shared}


def seed_spread(values: Sequence[float]) -> dict[str, Any]:
    """``{"seeds": [v_1, …], "sd": s}``: each seed's value and their sample standard deviation (ddof 1; 0
    for one seed)."""
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return {"seeds": [float(value) for value in values], "sd": sd}


def quality_rows(
    systems: Mapping[str, SystemScores | Sequence[SystemScores]],
    references: Sequence[str] | None,
    *,
    compared_with: Mapping[str, str] | None = None,
    also: Mapping[str, Mapping[str, str]] | None = None,
    count: int = DEFAULT_RESAMPLES,
    seed: int,
    metrics: Mapping[str, Metric] | None = None,
) -> list[dict[str, Any]]:
    """One JSON-ready row per system, every interval on one shared set of resamples.

    A row has ``name``, ``sentences`` and, for each measure the system has what it needs for (``bleu`` and
    ``chrf`` from hypotheses and ``references``; ``perplexity``, ``kl``, ``agreement``, ``accuracy`` from
    per-sentence sums), ``{"value", "ci95"}``. For each ``key: name`` of ``compared_with`` (default
    ``{"teacher": "teacher", "dense": "dense"}``) whose name is one of ``systems`` (and not the row's own),
    ``vs_<key>`` holds a difference entry per measure both have (perplexity relative, see
    :data:`RELATIVE`); ``also`` adds comparisons of single rows the same way (``{"ssa S=4": {"student":
    "ssa"}}`` gives that row ``vs_student``). Every system must cover the same sentences, in one order.
    ``metrics`` are the corpus metrics by name (default: :func:`default_metrics`).

    A system given as a sequence of scores, one per training seed, is their mean (:func:`_seed_estimates`):
    each measure of its row also holds ``spread`` (:func:`seed_spread`), and its differences are those of
    the mean.
    """
    if not systems:
        return []
    sizes = {}
    for name, found in systems.items():
        if isinstance(found, SystemScores):
            sizes[name] = found.sentences()
        else:
            sizes |= {f"{name} (seed {i + 1})": scores.sentences() for i, scores in enumerate(found)}
    if references is not None:
        sizes["references"] = len(references)
    if len(set(sizes.values())) != 1:
        raise ValueError(f"systems and references must cover the same test sentences: {sizes}")
    sentences = next(iter(sizes.values()))
    weights = resample_weights(resamples(sentences, count, seed=seed), sentences)  # (B, S)
    corpus_metrics = default_metrics() if metrics is None else metrics
    estimates, spreads = {}, {}
    for name, found in systems.items():
        if isinstance(found, SystemScores):
            estimates[name] = measure_estimates(found, references, corpus_metrics, weights)
        else:
            estimates[name], spreads[name] = _seed_estimates(found, references, corpus_metrics, weights)
    rows = []
    for name, own in estimates.items():
        row: dict[str, Any] = {"name": name, "sentences": sentences}
        row |= {measure: row_entry(*estimate) for measure, estimate in own.items()}
        if name in spreads:
            for measure, values in spreads[name].items():
                row[measure]["spread"] = seed_spread(values)
        comparisons = {**(compared_with or {TEACHER: TEACHER, DENSE: DENSE}), **(also or {}).get(name, {})}
        for key, reference in comparisons.items():
            if reference == name or reference not in estimates:
                continue
            theirs = estimates[reference]
            row[f"vs_{key}"] = {
                measure: difference_entry(*own[measure], *theirs[measure], relative=measure in RELATIVE)
                for measure in own
                if measure in theirs
            }
        rows.append(row)
    return rows
