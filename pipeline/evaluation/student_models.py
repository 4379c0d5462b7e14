"""The students next to the teacher: quality, attention computed per layer, and speed.

Each student folder under the students' folder is loaded with the attention its manifest names and run on
the same test sentences (or blocks), beam search and batches as the teacher and the predictor points, with
the same measure (:func:`~pipeline.evaluation.quality.translation_quality`, or
:func:`~pipeline.evaluation.quality.language_quality` for the block tasks), so it is one more point on the
sparsity–BLEU and sparsity–perplexity plots. Its sparsity is that of the graphs it computes while decoding: a
``sparsefinder`` student's predicted graphs, an SBM student's evaluation graphs, the keys a SAMSA student
selects (its learned support vectors are not pairs of the sentence and do not count); 0 for a student that
evaluates densely (SSA, the dense control). Training speed is
one forward and backward pass per batch (cross-entropy, no distillation), timed for the teacher and the
student alternately on the same training batches, so the ratio compares the attentions alone. A student
with SSA heads is also evaluated as a self-ensemble of S sampled sub-models for each S asked for, and a
``sparsefinder`` student beside its untrained twin: the teacher with the same predictor, which is what
fine-tuning started from. A PAR student's row also names its patterns and its self-attention sublayers as a
fraction of the teacher's (the PAR paper's "fewer attention blocks"); its speed is its decoding time.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.attention.loading import load_model
from pipeline.attention.sparsefinder import SPARSEFINDER, SparsefinderHead, attach_sparsefinder
from pipeline.attention.ssa import ssa_heads
from pipeline.checkpoint import MANIFEST, loading, read_manifest, resolve_checkpoint
from pipeline.corpus_card import Task
from pipeline.errors import UserError
from pipeline.evaluation.intervals import SystemScores
from pipeline.evaluation.quality import Measured, point_values, scores_of
from pipeline.metrics.language_model import labelled_batches
from pipeline.metrics.teacher_forced import Scoring, TeacherTargets, unit_sums
from pipeline.metrics.translation import corpus_bleu, translate_in_order
from pipeline.par.pattern import attention_share, compact_pattern
from pipeline.par.stacks import PAR, teacher_layers
from pipeline.students.attention import STUDENT_ATTENTIONS
from pipeline.students.ensemble import self_ensemble
from pipeline.timer import timed
from pipeline.training.batches import padded_batches


def student_folders(folder: str | None, declared: Mapping[str, Sequence[str]]) -> dict[str, list[Path]]:
    """{name: its seeds' model folders} of the students the params declare (``student.instances``: name →
    the folders its stage writes, one per seed of ``student.seeds``), in their order; none when ``folder``
    (``evaluate.students``) is None. Folders of other profiles' students that lie beside them are ignored.
    Each declared folder must lie inside ``folder``, which evaluate depends on, and hold a student model."""
    if folder is None:
        return {}
    root = Path(folder).resolve()
    found = {}
    for name, seeds in declared.items():
        found[name] = []
        for out in seeds:
            path = Path(out)
            if root not in path.resolve().parents:
                raise UserError(
                    f"student.instances.{name}.out: {out!r} lies outside evaluate.students = {folder!r}; "
                    "allowed: a folder inside it (evaluate depends on that folder)"
                )
            if not (path / MANIFEST).is_file():
                raise UserError(
                    f"student.instances.{name}.out: {out!r} holds no student model (one folder per seed of "
                    f"student.seeds); build it: dvc repro student@{name}"
                )
            found[name].append(path)
    return found


def check_parent(name: str, folder: Path, teacher_key: str, teacher_sha256: str | None) -> None:
    """The student in ``folder`` was distilled from the teacher whose weights hash to ``teacher_sha256``."""
    parent = read_manifest(folder).get("parent", {}).get("teacher", {})
    if parent.get("model_sha256") != teacher_sha256:
        raise UserError(
            f"student {name} ({folder}) was not distilled from {teacher_key}; rebuild it: "
            f"dvc repro student@{name}"
        )


def load_student(folder: Path, key: str) -> PreTrainedModel:
    """The student in ``folder``, verified, with the attention implementation its manifest records."""
    resolve_checkpoint(str(folder), key, writer="student")
    implementation = read_manifest(folder).get("attn_implementation")
    if implementation not in STUDENT_ATTENTIONS:
        raise UserError(
            f"{folder / MANIFEST}: attn_implementation {implementation!r} is no student's; allowed: "
            f"{', '.join(STUDENT_ATTENTIONS)} (re-run its student stage)"
        )
    with loading(str(folder), key):
        return load_model(folder, attn_implementation=implementation)


def train_step_seconds(
    models: Sequence[PreTrainedModel], batches: Sequence[dict[str, torch.Tensor]]
) -> list[float]:
    """Median seconds of one forward + backward pass per model, the models taking turns on each batch.

    Models are put in training mode for the passes (dropout, sampled attention) and back in eval mode
    after; gradients are discarded.
    """
    times: list[list[float]] = [[] for _ in models]
    for model in models:
        model.train()
    try:
        for batch in batches:
            for model, spent in zip(models, times, strict=True):
                spent.append(timed(functools.partial(_train_step, model, batch))[1])
                model.zero_grad(set_to_none=True)
    finally:
        for model in models:
            model.eval()
    return [statistics.median(spent) for spent in times]


def _train_step(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> None:
    """One forward and backward pass of the model's own loss on ``batch``."""
    model(**batch).loss.backward()


def timing_batches(
    train: Dataset, batch_size: int, count: int, pad_id: int, task: Task
) -> list[dict[str, torch.Tensor]]:
    """``count`` training batches of ``batch_size`` from the start of ``train``: padded sentence pairs
    (length-sorted), or blocks with their labels (lm: the inputs, every position scored; mqar: the
    answers)."""
    chosen = range(min(len(train), batch_size * count))
    if task == "mqar":  # a training mixture's rows differ in length: time the longest, the test examples'
        lengths = [len(ids) for ids in train["input_ids"]]
        longest = max(lengths)
        chosen = [row for row, length in enumerate(lengths) if length == longest][: batch_size * count]
    rows = train.select(chosen)
    if task != "translation":  # an mqar corpus's own labels, else labels = inputs
        return [{"input_ids": ids, "labels": labels} for ids, labels in labelled_batches(rows, batch_size)][
            :count
        ]
    return [batch for batch, _ in padded_batches(rows, batch_size, pad_id)][:count]


def per_layer(table: list[list[float]] | None) -> list[float] | None:
    """Mean over heads of each layer's value (a layer × head table)."""
    return None if table is None else [round(sum(row) / len(row), 4) for row in table]


def untrained_twin(student: PreTrainedModel, teacher: str) -> PreTrainedModel | None:
    """The student as it was before fine-tuning, for a ``sparsefinder`` student: the ``teacher`` folder's
    weights with the student's predictor (kept fixed in training, so equal to the one it started with);
    None for other students, whose starting point is the teacher itself."""
    spec = getattr(student.config, SPARSEFINDER, None)
    if spec is None:
        return None
    twin = load_model(teacher, attn_implementation=SPARSEFINDER)
    attach_sparsefinder(twin, spec)
    heads = dict(twin.named_modules())
    for name, module in student.named_modules():
        if isinstance(module, SparsefinderHead):
            heads[name].load_state_dict(module.state_dict())
    return twin.eval()


def student_quality(
    name: str,
    student: PreTrainedModel,
    teacher: PreTrainedModel,
    batches: Sequence[dict[str, torch.Tensor]],
    *,
    measure: Callable[[PreTrainedModel], Measured],
    ensemble: Callable[[PreTrainedModel, int], Measured],
    ensemble_samples: Sequence[int],
    untrained: PreTrainedModel | None = None,
    measure_untrained: Callable[[PreTrainedModel], Measured] | None = None,
) -> tuple[dict[str, Any], dict[str, SystemScores]]:
    """One student's row: ``measure(student)`` (the teacher's and the predictor points' measure:
    :func:`~pipeline.evaluation.quality.translation_quality` or
    :func:`~pipeline.evaluation.quality.language_quality`) plus the fraction of query–key pairs it computes
    per layer, its training step time and the teacher's measured beside it, its self-ensembles
    ``ensemble(student, samples)`` (SSA students) for each of ``ensemble_samples``, and the quality of its
    ``untrained`` twin (:func:`untrained_twin`) when it has one (measured by ``measure_untrained``, by
    default ``measure``); and what each of these models produced, by evidence name (:func:`ensemble_name`,
    :func:`untrained_name`)."""
    quality, student_scores = measure(student)
    scores = {name: student_scores}
    sparsity_table = quality.pop("sparsity_per_layer_head")
    if quality["sparsity"] is None:  # no predictor heads: every allowed pair is computed
        quality["sparsity"] = 0.0
    computed = per_layer([[1.0 - s for s in row] for row in sparsity_table]) if sparsity_table else None
    student_step, teacher_step = train_step_seconds([student, teacher], batches)
    row: dict[str, Any] = {
        "student": name,
        "attention": student.config._attn_implementation,
        **quality,
        "computed_fraction_per_layer": computed,
        "train_step_seconds": round(student_step, 4),
        "teacher_train_step_seconds": round(teacher_step, 4),
    }
    patterns = getattr(student.config, PAR, None)
    if patterns is not None:
        attention, share = attention_share(patterns, sum(teacher_layers(teacher).values()))
        row[PAR] = {
            **{stack: compact_pattern(pattern) for stack, pattern in patterns.items()},
            "attention_sublayers": attention,
            "attention_fraction": share,
        }
    if untrained is not None:
        before, scores[untrained_name(name)] = (measure_untrained or measure)(untrained)
        row["untrained"] = {key: before[key] for key in ("bleu", "perplexity", "sparsity") if key in before}
    if ssa_heads(student) and ensemble_samples:
        row["ensembles"] = []
        for samples in ensemble_samples:
            measured, scores[ensemble_name(name, samples)] = ensemble(student, samples)
            row["ensembles"].append(measured)
    return row, scores


SEED_MEASURES = ("bleu", "perplexity", "kl", "agreement", "accuracy", "loss", "sparsity")
"""The measures of a student's row that are averaged over its seeds."""


def seed_means(row: dict[str, Any], seeds: Sequence[str], others: Sequence[Measured]) -> dict[str, Any]:
    """A student's ``row`` (its first seed's, :func:`student_quality`) as the mean over its ``seeds``
    (their folder names; ``others`` are the further seeds' measures, in order): each of
    :data:`SEED_MEASURES` that every seed has becomes the mean, and ``seeds`` holds each seed's own values.
    Its untrained twin, self-ensembles and step times stay the first seed's."""
    rows = [row, *(other for other, _ in others)]
    keys = [key for key in SEED_MEASURES if all(isinstance(found.get(key), float | int) for found in rows)]
    means = {key: round(statistics.fmean(found[key] for found in rows), 4) for key in keys}
    per_seed = {seed: {key: found[key] for key in keys} for seed, found in zip(seeds, rows, strict=True)}
    return {**row, **means, "seeds": per_seed}


def untrained_name(student: str) -> str:
    """The evidence row of a student's untrained twin."""
    return f"{student} untrained"


def ensemble_name(student: str, samples: int) -> str:
    """The evidence row of a student's self-ensemble of ``samples`` sub-models."""
    return f"{student} S={samples}"


def language_ensemble_quality(
    model: PreTrainedModel,
    samples: int,
    *,
    task: Task,
    test: Dataset,
    seed: int,
    scoring: Scoring,
    teacher: TeacherTargets | None,
) -> Measured:
    """The teacher-forced measures (mlm: accuracy too) of the average of ``samples`` sampled sub-models
    over the test blocks."""
    with self_ensemble(model, samples, seed) as replicated:
        scores = scores_of(unit_sums(replicated, test, scoring, teacher), task)
    return {"samples": samples, **point_values(scores)}, scores


def self_ensemble_quality(
    model: PreTrainedModel,
    samples: int,
    *,
    tokenizer: PreTrainedTokenizerBase,
    test: Dataset,
    seed: int,
    batch_size: int,
    scoring: Scoring,
    teacher: TeacherTargets | None,
) -> Measured:
    """BLEU and the teacher-forced measures of the average of ``samples`` sampled sub-models (decoding
    included)."""
    # two ensembles drawn from the same seed: decoding and scoring each start from the seed's first draw
    with self_ensemble(model, samples, seed) as replicated:
        started = time.perf_counter()
        hypotheses, references = translate_in_order(replicated, tokenizer, test, batch_size)
        decode_seconds = time.perf_counter() - started
    with self_ensemble(model, samples, seed) as replicated:
        scores = scores_of(unit_sums(replicated, test, scoring, teacher), "translation", hypotheses)
    measured = {
        "samples": samples,
        **corpus_bleu(hypotheses, references),
        **point_values(scores),
        "decode_seconds": round(decode_seconds, 3),
    }
    return measured, scores
