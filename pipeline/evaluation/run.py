"""The ``evaluate`` stage's work, end to end: every predictor and baseline on the held-out graph store, then
quality with predicted graphs at each method's best points, the students, and the speed table.

1. Graphs: every setting of ``evaluate.methods`` × ``windows`` × ``global_tokens`` (or a method's own
   lists) is scored (sparsity, recall, precision, exact-query fraction, per layer and head) on the
   test-split store, never on sentences the projections or predictor states were fitted on; so is the
   teacher's own gold sparsity.
2. Quality: the teacher, each method's sparsity–recall Pareto points at sparsity ≥ gold − margin that a
   decoder can run (and its sparsest setting there reaching each recall target), and a window wider than
   any sentence (recall 1, which must reproduce the teacher) are translated on the test split, every model
   with the same decoding: BLEU, the teacher-forced measures against the teacher (perplexity, KL, top-1
   agreement), the sparsity of the graphs actually used while decoding, and wall times side by side.
3. Students: every declared student, on the same sentences, with its attention computed per layer, its
   training step time next to the teacher's, and its self-ensembles (SSA).
4. Evidence: every quality row's 95 % paired bootstrap intervals, and its differences from the teacher and
   from the dense control, over one shared set of resamples of the test sentences; and the outputs behind
   them (:mod:`pipeline.evaluation.evidence`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.attention import ENTMAX, load_model
from pipeline.attention.sparsefinder import SPARSEFINDER
from pipeline.checkpoint import load_auto_tokenizer, loading
from pipeline.checks.evaluate import EvaluateInputs
from pipeline.corpus_card import TASKS, Task
from pipeline.data.mqar import IGNORE
from pipeline.errors import UserError
from pipeline.evaluation.evidence import Evidence, gather_evidence
from pipeline.evaluation.intervals import SystemScores
from pipeline.evaluation.quality import (
    attach_setting,
    choose_points,
    language_quality,
    operating_labels,
    quality_sweep,
    translation_quality,
)
from pipeline.evaluation.speed import speed_table
from pipeline.evaluation.student_models import (
    language_ensemble_quality,
    load_student,
    seed_means,
    self_ensemble_quality,
    student_quality,
    timing_batches,
    untrained_twin,
)
from pipeline.evaluation.sweep import gold_sparsity, method_settings, sweep_graphs
from pipeline.graphs.store import GraphStore
from pipeline.metrics.teacher_forced import Scoring, generator_labels, median_gap, teacher_targets
from pipeline.params.evaluate import Evaluate, Quality
from pipeline.predictors.indexer import IndexerPredictor
from pipeline.predictors.scoring import Setting
from pipeline.predictors.window import WindowPredictor
from pipeline.training.run import data_for_model, prepared_corpus


def answer_rows(store: GraphStore, split: Dataset) -> dict[int, np.ndarray]:
    """mqar: each stored sentence's answer positions (by store index), (n,) bool: the query rows whose next
    label is an answer, read from the ``split`` row the sentence came from."""
    rows = {}
    for index, row in enumerate(store.sentence_ids().tolist()):
        if not 0 <= row < len(split):
            raise UserError(
                f"evaluate.graphs: stored sentence {index} came from row {row}, beyond the {len(split)} "
                f"rows of the {store.split} split; extract the store from this corpus again"
            )
        labels = generator_labels(np.asarray(split[row]["labels"])[None])[0]  # (n,): at the query itself
        rows[index] = labels != IGNORE
    return rows


def graph_rows(
    params: Evaluate,
    inputs: EvaluateInputs,
    indices: range,
    full_window: int,
    answers: dict[int, np.ndarray] | None = None,
) -> tuple[list, tuple]:
    """(scored rows of the grid, the recall-1 row) on the held-out store; ``full_window`` is a band wider
    than any sentence, which attends every valid pair (the sparse-consistency check). With ``answers``
    (mqar: :func:`answer_rows`) each row also has ``answer_recall``, the recall over the answer rows
    alone: whether the key an answer needs is kept."""
    kind, projections = inputs.projections
    settings = [
        *(
            setting
            for method, grid in params.methods.items()
            for setting in method_settings(
                method,
                grid,
                inputs.stored,
                params.state,
                windows=params.windows,
                global_tokens=params.global_tokens,
            )
        ),
        Setting(WindowPredictor(), full_window),
    ]
    *rows, full = sweep_graphs(
        inputs.store, kind, settings, projections, indices, batch_size=params.batch_size
    )
    if answers is not None:
        at_answers = sweep_graphs(
            inputs.store,
            kind,
            settings,
            projections,
            indices,
            batch_size=params.batch_size,
            query_rows=answers,
        )
        for (_, row), (_, answered) in zip([*rows, full], at_answers, strict=True):
            row["answer_recall"] = answered["recall"]
    return rows, full


GRAPH_FIELDS = ("graph_sparsity", "graph_recall", "perplexity")
"""What a speed row says of the graph its model attends."""


def speed_setting(
    params: Evaluate, rows: list, method: str, teacher_quality: dict, points: list[dict]
) -> tuple[Setting, dict, str]:
    """(setting, graph row, what chose it) the speed table runs ``method``'s predicted graph with.

    With ``speed.perplexity_gap``, its sparsest quality point whose perplexity is at most (1 + gap) times
    the teacher's ("perplexity"); otherwise, or when no point is that close, its sparsest setting with recall
    ≥ ``speed.recall_target``, or its highest-recall one when none reaches it ("recall")."""
    found = [(s, r) for s, r in rows if r["method"] == method]
    gap = params.speed.perplexity_gap
    if gap is not None:
        limit = (1.0 + gap) * teacher_quality["perplexity"]
        close = {p["label"] for p in points if p["method"] == method and p["perplexity"] <= limit}
        within = [(s, r) for s, r in found if r["label"] in close]
        if within:
            return (*max(within, key=_sparsest), "perplexity")
    reaching = [(s, r) for s, r in found if r["recall"] >= params.speed.recall_target]
    if reaching:
        return (*max(reaching, key=_sparsest), "recall")
    return (*max(found, key=lambda point: (point[1]["recall"], point[1]["sparsity"])), "recall")


def _sparsest(point: tuple[Setting, dict]) -> tuple[float, float]:
    """Sort key of (setting, graph row) points: sparsity first, recall between equally sparse ones."""
    return point[1]["sparsity"], point[1]["recall"]


def speed_rows(
    params: Evaluate,
    teacher: str,
    kind: str,
    projections: dict,
    rows: list,
    gold: float,
    quality: tuple[dict, list[dict]],
    test: Dataset,
) -> list[dict]:
    """The speed table (:func:`~pipeline.evaluation.speed.speed_table`) of softmax SDPA, the dense α-entmax
    teacher and the teacher on each ``speed.methods`` predicted graph at :func:`speed_setting` (the
    τ-indexer also certified when ``speed.certified``), each row with the sparsity and recall of the graph
    its attention weights live on, the perplexity measured on it where the quality sweep measured one
    (``quality`` = the teacher's and the points'), and for predicted graphs what chose the setting; [] without
    contexts."""
    settings = params.speed
    if not settings.contexts:
        return []
    teacher_quality, points = quality
    measured_perplexity = {p["label"]: p["perplexity"] for p in points}
    # (sparsity, recall, perplexity) of the graph each model's attention weights live on: the dense ones on
    # every valid pair (sparsity 0; softmax's perplexity is not measured), certified attention on the
    # teacher's own support
    exact = teacher_quality["perplexity"]
    graphs = {"softmax (sdpa)": (0.0, 1.0, None), "entmax (dense)": (0.0, 1.0, exact)}
    chosen_by = {}
    variants = []  # (label, setting, certified) of each predicted-graph model
    for method in settings.methods:
        setting, row, reason = speed_setting(params, rows, method, teacher_quality, points)
        label = row["label"]
        variants.append((label, setting, False))
        graphs[label] = (row["sparsity"], row["recall"], measured_perplexity.get(label))
        chosen_by[label] = reason
        if settings.certified and isinstance(setting.predictor, IndexerPredictor):
            variants.append((f"{label} certified", setting, True))
            graphs[f"{label} certified"] = (gold, 1.0, exact)
            chosen_by[f"{label} certified"] = reason
    with loading(teacher, "evaluate.teacher"):
        models = {
            "softmax (sdpa)": load_model(teacher, attn_implementation="sdpa"),
            "entmax (dense)": load_model(teacher, attn_implementation="entmax"),
            **{label: load_model(teacher, attn_implementation=SPARSEFINDER) for label, _, _ in variants},
        }
    for label, setting, certified in variants:
        attach_setting(models[label], setting, kind=kind, projections=projections, certified=certified)
    measured = speed_table(
        models, test, settings.contexts, repeats=settings.repeats, backward=settings.backward
    )
    return [
        {
            **entry,
            **dict(zip(GRAPH_FIELDS, graphs[entry["model"]], strict=True)),
            **({"chosen_by": chosen_by[entry["model"]]} if entry["model"] in chosen_by else {}),
        }
        for entry in measured
    ]


def task_measures(
    params: Evaluate,
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    test: Dataset,
    teacher: PreTrainedModel,
    far_gap: int | None = None,
) -> tuple[Callable, Callable]:
    """(``measure(model)``, ``ensemble(model, samples)``) on ``test`` for ``task``: BLEU by decoding (the
    model's generation config) and the teacher-forced measures against ``teacher``'s targets, computed
    here once; the teacher, every predictor point and every student are measured by the same one. mqar's
    answers whose key lies more than ``far_gap`` back are also counted apart (the far half)."""
    quality = params.quality
    scoring = Scoring(task, quality.batch_size, mask_id=tokenizer.mask_token_id, far_gap=far_gap)
    targets = teacher_targets(teacher, test, scoring)
    data = {"test": test, "scoring": scoring, "teacher": targets}
    if task == "translation":
        decoding = {**data, "tokenizer": tokenizer, "batch_size": quality.batch_size}
        timed = quality.timing_batches * quality.batch_size  # the forward timed: a few batches suffice
        measure = partial(translation_quality, **decoding, timed=timed)
        return measure, partial(self_ensemble_quality, **decoding, seed=quality.ensemble_seed)
    measure = partial(language_quality, **data, tokenizer=tokenizer, task=task, batch_size=quality.batch_size)
    return measure, partial(language_ensemble_quality, **data, task=task, seed=quality.ensemble_seed)


def decode_like_every_model(model: PreTrainedModel, quality: Quality) -> None:
    """Give a translation ``model`` the one decoding every model is scored with (its other generation
    settings, saved with it, stay)."""
    model.generation_config.num_beams = quality.beams
    model.generation_config.max_new_tokens = quality.max_new_tokens


def evaluate_students(
    params: Evaluate,
    folders: Mapping[str, Sequence[Path]],
    task: Task,
    train: Dataset,
    measure: Callable,
    ensemble: Callable,
) -> tuple[list[dict], dict[str, SystemScores | list[SystemScores]]]:
    """One row per declared student (``folders``: its model folder per seed, checked by
    :mod:`pipeline.checks.evaluate`: each distilled from this teacher), measured by the teacher's ``measure``
    (:func:`task_measures`), and what every model measured produced, by evidence name (a student trained on
    several seeds: one scores per seed).

    The first seed's model is measured in full (:func:`student_quality`: its untrained twin, self-ensembles
    and training step time too); every further seed's by ``measure`` alone, and the row's measures are the
    mean over seeds, each seed's beside them (:func:`seed_means`). With ``decode: operating`` an untrained
    twin is scored teacher-forced alone."""
    if not folders:
        return [], {}
    quality = params.quality
    with loading(params.teacher, "evaluate.teacher"):
        teacher = load_model(params.teacher, attn_implementation=ENTMAX)
    pad_id = teacher.config.pad_token_id
    batches = timing_batches(train, quality.batch_size, quality.timing_batches, pad_id, task)
    # the untrained twins are no headline row: decoded only when every model is
    forced = task == "translation" and quality.decode == "operating"
    measure_untrained = partial(measure, decode=False) if forced else measure
    rows, scores = [], {}
    for name, seeds in folders.items():
        first, *others = (load_student(folder, f"evaluate.students ({name})") for folder in seeds)
        untrained = untrained_twin(first, params.teacher)
        for model in (first, *others, untrained):
            if model is not None and task == "translation":
                decode_like_every_model(model, quality)
        row, produced = student_quality(
            name,
            first,
            teacher,
            batches,
            measure=measure,
            ensemble=ensemble,
            ensemble_samples=quality.ensemble_samples,
            untrained=untrained,
            measure_untrained=measure_untrained,
        )
        scores |= produced
        if others:
            measured = [measure(model) for model in others]
            row = seed_means(row, [folder.name for folder in seeds], measured)
            scores[name] = [scores[name], *(produced for _, produced in measured)]
        rows.append(row)
    return rows, scores


def run_evaluation(params: Evaluate, inputs: EvaluateInputs) -> tuple[dict[str, Any], Evidence]:
    """What ``evaluate.json`` holds for ``params`` on its checked ``inputs``
    (:func:`~pipeline.checks.evaluate.check_inputs`), its wall times included
    (:func:`~pipeline.timings.write_metrics` writes them to their own file), and the evidence behind every
    quality row (:mod:`pipeline.evaluation.evidence`)."""
    store, teacher = inputs.store, inputs.teacher
    kind, projections = inputs.projections
    data, corpus_tokenizer, card = prepared_corpus(params.data, "evaluate.data", tasks=TASKS)
    task = card.task
    with loading(teacher, "evaluate.teacher"):
        model = load_model(teacher, attn_implementation=SPARSEFINDER)
        tokenizer = load_auto_tokenizer(teacher)
    positions = model.config.max_position_embeddings
    indices = range(min(len(store), params.max_sentences or len(store)))
    answers = answer_rows(store, data[store.split]) if task == "mqar" else None
    rows, full = graph_rows(params, inputs, indices, 2 * positions + 1, answers)
    gold = gold_sparsity(full[1])

    quality = params.quality
    key = f"evaluate.teacher = {params.teacher!r}"
    encoded = data_for_model(data, corpus_tokenizer, tokenizer, model, task=task, key=key)
    test = encoded["test"]
    if quality.examples is not None:
        test = test.select(range(min(quality.examples, len(test))))
    if task == "translation":
        decode_like_every_model(model, quality)
    # mqar: answers whose key is farther back than the test examples' median distance are the far half
    far_gap = median_gap(test) if task == "mqar" else None
    measure, ensemble = task_measures(params, task, tokenizer, test, model, far_gap)
    points = choose_points(
        rows,
        kind,
        min_sparsity=gold["sparsity"] - quality.sparsity_margin,
        per_method=quality.points_per_method,
        recall_targets=quality.recall_targets,
    )
    decoded = None  # every point
    if task == "translation" and quality.decode == "operating":
        decoded = operating_labels(points, quality.recall_targets[0] if quality.recall_targets else math.inf)
    teacher_quality, point_rows, scores = quality_sweep(
        model, [*points, full], measure=measure, kind=kind, projections=projections, decoded=decoded
    )
    teacher_quality["sparsity"] = gold["sparsity"]
    students, student_scores = evaluate_students(
        params, inputs.students, task, encoded["train"], measure, ensemble
    )
    found = (teacher_quality, point_rows)
    speed = speed_rows(params, teacher, kind, projections, rows, gold["sparsity"], found, data["test"])
    store_facts = {"path": params.graphs, "split": store.split, "sentences": len(indices)}
    evaluation = {
        "kind": kind,
        "store": {**store_facts, "layers": store.layers, "heads": store.heads},
        "projector": projections[min(projections)].config(),
        "gold_sparsity": gold["sparsity"],
        "gold_sparsity_per_layer_head": gold["per_layer_head"],
        "graphs": [row for _, row in [*rows, full]],
        "task": task,
        **({"far_gap": far_gap} if far_gap is not None else {}),
        "quality": {"teacher": teacher_quality, "points": point_rows, "sentences": len(test)},
        "students": students,
        "speed": speed,
    }
    references = list(test["tgt"]) if task == "translation" else None
    found_evidence = gather_evidence(
        evaluation,
        {**scores, **student_scores},
        references,
        quality=quality,
        split_units=len(encoded["test"]),
    )
    return evaluation, found_evidence
