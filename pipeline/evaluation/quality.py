"""Quality with predicted graphs: BLEU (translation) and the teacher-forced measures (perplexity, KL to the
teacher, top-1 agreement with it; mlm: accuracy) on every unit of the test split; the sparsity of the graphs
actually used, and time.

One model serves every grid point: it is loaded once with ``attn_implementation="sparsefinder"``; without
predictor heads it is the α-entmax teacher itself, and each point attaches its heads (replacing the previous
ones) before running the same test sentences or blocks. The measures and their wall times run on the same
batches for the teacher and every point, one after another, so the times compare side by side.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.attention.counting import measure_sparsity
from pipeline.attention.sparsefinder import MODEL_SCOPES, attach_predictor
from pipeline.corpus_card import ACCURACY_TASKS, Task
from pipeline.evaluation.intervals import RATIOS, TEACHER, SystemScores, ratio_value
from pipeline.evaluation.pareto import operating_rows, pareto_front
from pipeline.metrics.language_model import token_loss
from pipeline.metrics.teacher_forced import Scoring, TeacherTargets, unit_sums
from pipeline.metrics.translation import corpus_bleu, perplexity, translate, translate_in_order
from pipeline.predictors.scoring import Setting
from pipeline.projection.model import HeadProjections


def runs_in_model(setting: Setting, kind: str) -> bool:
    """Whether a model can attend with ``setting`` in ``kind`` (a decoder needs token-scope predictors)."""
    return setting.predictor.scope in MODEL_SCOPES[kind]


def choose_points(
    rows: Sequence[tuple[Setting, dict[str, Any]]],
    kind: str,
    *,
    min_sparsity: float,
    per_method: int,
    recall_targets: Sequence[float] = (),
) -> list[tuple[Setting, dict[str, Any]]]:
    """Each method's sparsity–recall Pareto points at sparsity ≥ ``min_sparsity``, at most ``per_method``,
    and, for each of ``recall_targets``, its sparsest setting there with recall ≥ the target.

    Methods a model cannot run in ``kind`` are skipped. When a front is longer than ``per_method`` the points
    kept are spread evenly along it, the highest-recall point always among them. The recall-target points
    (on the front too) are those a report quotes as a method's operating point; each setting comes once.
    """
    chosen = []
    for method in dict.fromkeys(row["method"] for _, row in rows):
        candidates = [
            (s, r)
            for s, r in rows
            if r["method"] == method and r["sparsity"] >= min_sparsity and runs_in_model(s, kind)
        ]
        front = [candidates[i] for i in pareto_front([(r["sparsity"], r["recall"]) for _, r in candidates])]
        # the front is sorted by sparsity ascending, so its first point has the highest recall
        if len(front) > per_method:
            step = (len(front) - 1) / max(per_method - 1, 1)
            front = [front[round(i * step)] for i in range(per_method)]
        for target in recall_targets:
            reaching = [(s, r) for s, r in candidates if r["recall"] >= target]
            if reaching:
                front.append(max(reaching, key=lambda point: (point[1]["sparsity"], point[1]["recall"])))
        chosen += list({id(s): (s, r) for s, r in front}.values())
    return chosen


def operating_labels(points: Sequence[tuple[Setting, dict[str, Any]]], recall_target: float) -> set[str]:
    """The labels of each method's operating point among ``points`` (graph rows with ``sparsity`` and
    ``recall``; :func:`~pipeline.evaluation.pareto.operating_rows`): the points the report's headline
    quotes."""
    return {row["label"] for row in operating_rows([row for _, row in points], recall_target)}


Measured = tuple[dict[str, Any], SystemScores]
"""What measuring one model gives: its JSON row (point values), and what it produced on every test unit (for
the intervals of :mod:`pipeline.evaluation.intervals`)."""


def scores_of(sums: dict[str, np.ndarray], task: Task, hypotheses: list[str] | None = None) -> SystemScores:
    """The per-unit sums of :func:`~pipeline.metrics.teacher_forced.unit_sums` (and the hypotheses) as the
    intervals take them; top-1 accuracy is kept for the tasks it measures (mlm, mqar) alone."""
    kept = {name: value for name, value in sums.items() if name != "correct" or task in ACCURACY_TASKS}
    return SystemScores(hypotheses=hypotheses, **kept)


def point_values(scores: SystemScores) -> dict[str, float]:
    """The teacher-forced measures over the whole split (perplexity, and given their sums, KL to the
    teacher, top-1 agreement with it, mlm accuracy), rounded as a row shows them."""
    values = {}
    for name, ratio in RATIOS.items():
        numerator, denominator = getattr(scores, ratio.numerator), getattr(scores, ratio.denominator)
        if numerator is not None and denominator is not None:
            values[name] = round(float(ratio_value(ratio, numerator, denominator)), 4)
    return values


def translation_quality(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    test: Dataset,
    *,
    batch_size: int,
    scoring: Scoring,
    teacher: TeacherTargets | None,
    timed: int | None = None,
    decode: bool = True,
) -> Measured:
    """BLEU (the model's generation config: the same beams for every model), the teacher-forced measures
    against the ``teacher``'s targets (perplexity, KL, agreement), the sparsity of the graphs used while
    decoding (overall and per layer and head; None without predictor heads), and wall times.

    Times are taken on passes that count no sparsity and score nothing beyond the loss: ``forward_seconds``
    is a teacher-forced forward over the first ``timed`` test sentences (None: all), ``decode_seconds``
    decoding the first batch alone; every model is timed on the same sentences.
    Without ``decode`` the model is measured teacher-forced alone: no BLEU, no decoding time, and the
    sparsity is that of the graphs it attends while scoring the references (``"decoded": false``).
    """
    if not decode:
        with measure_sparsity(model) as measured:
            sums = unit_sums(model, test, scoring, teacher)
        hypotheses = None
    else:
        with measure_sparsity(model) as measured:
            hypotheses, references = translate_in_order(model, tokenizer, test, batch_size)
        sums = unit_sums(model, test, scoring, teacher)
    started = time.perf_counter()
    perplexity(model, test if timed is None else test.select(range(min(timed, len(test)))), batch_size)
    forward_seconds = time.perf_counter() - started
    scores = scores_of(sums, "translation", hypotheses)
    row = {
        **(corpus_bleu(hypotheses, references) if decode else {"decoded": False}),
        **point_values(scores),
        "sparsity": measured.get("sparsity"),
        "sparsity_per_layer_head": measured.get("per_layer_head"),
        "forward_seconds": round(forward_seconds, 3),
    }
    if decode:
        started = time.perf_counter()
        translate(model, tokenizer, test.select(range(min(batch_size, len(test)))), batch_size)
        row["decode_seconds"] = round(time.perf_counter() - started, 3)
        row["examples"] = hypotheses[:2]
    return row, scores


def language_quality(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    test: Dataset,
    *,
    batch_size: int,
    scoring: Scoring,
    teacher: TeacherTargets | None,
) -> Measured:
    """The teacher-forced measures over the test blocks (perplexity, KL, agreement; mlm: accuracy), the
    sparsity of the graphs used (overall and per layer and head; None without predictor heads), and the wall
    time of a forward pass over them that counts nothing (``forward_seconds``, and ``tokens_per_second``
    from it)."""
    with measure_sparsity(model) as measured:
        sums = unit_sums(model, test, scoring, teacher)
    started = time.perf_counter()
    token_loss(model, task, test, batch_size, mask_id=tokenizer.mask_token_id)
    forward_seconds = time.perf_counter() - started
    tokens = sum(len(ids) for ids in test["input_ids"])
    scores = scores_of(sums, task)
    row = {
        "loss": round(float(sums["nll"].sum() / sums["tokens"].sum()), 4),
        **point_values(scores),
        "sparsity": measured.get("sparsity"),
        "sparsity_per_layer_head": measured.get("per_layer_head"),
        "forward_seconds": round(forward_seconds, 3),
        "tokens_per_second": round(tokens / forward_seconds, 1),
    }
    return row, scores


def attach_setting(
    model: PreTrainedModel,
    setting: Setting,
    *,
    kind: str,
    projections: Mapping[int, HeadProjections],
    certified: bool = False,
) -> None:
    """Give ``model`` (loaded as ``sparsefinder``) the heads of one grid setting, replacing any it has;
    ``certified``: exact attention, the setting's τ-indexer deciding what is skipped."""
    attach_predictor(
        model,
        setting.predictor,
        kind=kind,
        window=setting.window,
        global_tokens=setting.global_tokens,
        projections=projections,
        certified=certified,
    )


def quality_sweep(
    model: PreTrainedModel,
    points: Sequence[tuple[Setting, dict[str, Any]]],
    *,
    measure: Callable[..., Measured],
    kind: str,
    projections: Mapping[int, HeadProjections],
    decoded: Collection[str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, SystemScores]]:
    """(teacher quality, one quality row per point, what each produced: ``teacher`` and each point's label),
    each ``measure(model)`` (:func:`translation_quality` or :func:`language_quality` with their data bound);
    ``model`` must have been loaded as ``sparsefinder`` with no heads attached (it is the teacher until the
    first point attaches its own). With ``decoded`` (labels), the other points are measured
    ``measure(model, decode=False)``: teacher-forced alone."""
    teacher, teacher_scores = measure(model)
    scores = {TEACHER: teacher_scores}
    rows = []
    for setting, graph_row in points:
        attach_setting(model, setting, kind=kind, projections=projections)
        if decoded is None or graph_row["label"] in decoded:
            quality, scores[graph_row["label"]] = measure(model)
        else:
            quality, scores[graph_row["label"]] = measure(model, decode=False)
        identity = {k: graph_row[k] for k in ("method", "knobs", "window", "global_tokens", "label")}
        rows.append(
            {
                **identity,
                "graph_sparsity": graph_row["sparsity"],
                "graph_recall": graph_row["recall"],
                # mqar: the recall over the answer rows alone
                **({"answer_recall": graph_row["answer_recall"]} if "answer_recall" in graph_row else {}),
                **quality,
            }
        )
    return teacher, rows, scores
