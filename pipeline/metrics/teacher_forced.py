"""Teacher-forced measures per test unit (a sentence pair, or a block of the block tasks): NLL, KL(teacher ‖
model), top-1 agreement with the teacher, and top-1 accuracy.

For a unit s with scored target tokens y_1 … y_T (T = tokens_s), the model's next-token distribution q_t
and the teacher's p_t, both given the same inputs:

    nll_s      = Σ_t −log q_t(y_t)
    kl_s       = Σ_t Σ_v p_t(v) (log p_t(v) − log q_t(v))
    agree_s    = Σ_t [argmax_v q_t(v) = argmax_v p_t(v)]
    correct_s  = Σ_t [argmax_v q_t(v) = y_t]

What is scored per task: translation, every target token given the reference prefix and the source; lm,
every position t ≥ 1 of a block given x_<t; mqar, the answers alone (each value given the example up
to its query); mlm, the block's chosen positions (15 %, drawn from a generator
seeded with ``seed`` in block order, as :func:`pipeline.metrics.language_model.token_loss` draws them), all
replaced by ``<mask>``, so every model is scored on the same positions.

Every corpus value is a ratio of sums over units (perplexity = exp(Σ nll / Σ tokens), KL = Σ kl / Σ tokens,
agreement = Σ agree / Σ tokens, accuracy = Σ correct / Σ tokens), so the per-unit sums are what a bootstrap
over units resamples (:mod:`pipeline.evaluation.intervals`). KL and agreement are far more sensitive than
BLEU to a change of attention: they compare whole distributions at every position instead of one decoded
string.

The teacher's log-probabilities are computed once (:func:`teacher_targets`) and kept in memory for every
model compared with it: scored tokens × vocabulary float32 values (about 1.7 GB for 2,000 sentences of 35
tokens and a 6,000-word vocabulary).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from pipeline.corpus_card import CAUSAL_TASKS, Task
from pipeline.data.mqar import IGNORE, query_gaps
from pipeline.metrics.language_model import labelled_batches, masked_positions
from pipeline.metrics.translation import ROW
from pipeline.training.batches import padded_batches

SUMS = ("nll", "tokens", "correct")
"""The per-unit sums every model gets; with the teacher's targets also ``kl`` and ``agree``."""
GAP_SUMS = ("tokens_near", "correct_near", "tokens_far", "correct_far")
"""mqar's answers and right answers counted apart by how far back their key is (``Scoring.far_gap``)."""


@dataclass(frozen=True)
class Scoring:
    """How a split is scored: its task, the batch size, for mlm the mask id and the positions' seed, and for
    mqar the distance ``far_gap`` beyond which an answer's key counts as far (None: no near/far split)."""

    task: Task
    batch_size: int
    mask_id: int | None = None
    seed: int = 0
    far_gap: int | None = None


@dataclass(frozen=True)
class TeacherTargets:
    """The teacher's log-probabilities at the scored tokens of a split, batch by batch in the order
    :func:`scored_batches` gives (each (tokens in the batch, V) float32 on the CPU), and how it was scored."""

    log_probs: list[torch.Tensor]
    scoring: Scoring


@dataclass(frozen=True)
class Batch:
    """One batch to score: the model's ``inputs``, the (B, L) ``targets`` its logits are read against
    (−100 where nothing is scored), whether logit t predicts target t + 1 (``shifted``, lm), and each row's
    index in the split (``rows``, (B,))."""

    inputs: dict[str, torch.Tensor]
    targets: torch.Tensor
    shifted: bool
    rows: np.ndarray


def scored_batches(dataset: Dataset, scoring: Scoring, pad_id: int | None) -> Iterator[Batch]:
    """The batches every model of an evaluation is scored on, the same for each (translation: length-sorted
    pairs padded with ``pad_id``, which a translation model always has; the block tasks: consecutive
    blocks, which need no padding)."""
    if scoring.task == "translation":
        numbered = dataset.add_column(ROW, list(range(len(dataset))))
        for batch, rows in padded_batches(numbered, scoring.batch_size, pad_id):
            # the model shifts the labels into its decoder inputs itself: logit t is read against label t
            yield Batch(batch, batch["labels"], False, np.asarray(rows[ROW]))
        return
    generator = torch.Generator().manual_seed(scoring.seed)
    start = 0
    for ids, labels in labelled_batches(dataset, scoring.batch_size):  # (B, n) each
        rows = np.arange(start, start + len(ids))
        start += len(ids)
        if scoring.task in CAUSAL_TASKS:  # lm: every next token; mqar: the answers alone
            yield Batch({"input_ids": ids}, labels, True, rows)
        else:
            chosen = masked_positions(ids, generator)  # (B, n) bool
            targets = ids.masked_fill(~chosen, -100)
            yield Batch({"input_ids": ids.masked_fill(chosen, scoring.mask_id)}, targets, False, rows)


def _scored(model: PreTrainedModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(log q at the scored positions (N, V) float32, the (B, L) bool mask of those positions)."""
    inputs = {name: tensor.to(model.device) for name, tensor in batch.inputs.items()}
    logits = model(**inputs).logits.float().cpu()  # (B, L, V)
    targets = batch.targets
    if batch.shifted:  # position t predicts t + 1; the first token is never a target
        logits, targets = logits[:, :-1], targets[:, 1:]
    scored = targets.ne(-100)  # (B, L')
    return torch.log_softmax(logits[scored], dim=-1), scored


def _targets(batch: Batch) -> torch.Tensor:
    """(B, L') the targets aligned with :func:`_scored`'s logits (lm: from the second token on)."""
    return batch.targets[:, 1:] if batch.shifted else batch.targets


def generator_labels(causal: np.ndarray) -> np.ndarray:
    """(B, n) mqar labels at the query positions themselves, from the corpus's causal-LM ones (moved one
    place left; the inverse of :func:`~pipeline.data.mqar_corpus.causal_labels`)."""
    labels = np.full_like(causal, IGNORE)
    labels[:, :-1] = causal[:, 1:]
    return labels


def answer_gaps(batch: Batch) -> np.ndarray:
    """(B, P) for each answer of an mqar batch, in position order (the order :func:`_scored` scores them),
    how far back the first occurrence of its key is."""
    return query_gaps(batch.inputs["input_ids"].numpy(), generator_labels(batch.targets.numpy()))


def median_gap(dataset: Dataset) -> int:
    """The median distance back to the key over every answer of an mqar split: answers farther than it are
    the far half."""
    inputs = np.asarray(dataset["input_ids"], dtype=np.int64)
    return int(np.median(query_gaps(inputs, generator_labels(np.asarray(dataset["labels"], dtype=np.int64)))))


def _batch_count(units: int, scoring: Scoring) -> int:
    """How many batches :func:`scored_batches` gives for ``units`` units (for the progress bar)."""
    return -(-units // scoring.batch_size)


@torch.no_grad()
def teacher_targets(teacher: PreTrainedModel, dataset: Dataset, scoring: Scoring) -> TeacherTargets:
    """The teacher's log-probabilities over ``dataset`` at every scored token, for :func:`unit_sums`."""
    teacher.eval()
    batches = scored_batches(dataset, scoring, teacher.config.pad_token_id)
    total = _batch_count(len(dataset), scoring)
    log_probs = [
        _scored(teacher, batch)[0] for batch in tqdm(batches, total=total, desc="teacher", leave=False)
    ]
    return TeacherTargets(log_probs, scoring)


@torch.no_grad()
def unit_sums(
    model: PreTrainedModel, dataset: Dataset, scoring: Scoring, teacher: TeacherTargets | None = None
) -> dict[str, np.ndarray]:
    """Per unit of ``dataset``, in its order: ``nll``, ``tokens``, ``correct`` and, given the teacher's
    targets (scored the same way), ``kl`` and ``agree`` (each (units,) float64)."""
    if teacher is not None and teacher.scoring != scoring:
        raise ValueError(f"the teacher's targets were scored as {teacher.scoring}, not {scoring}")
    model.eval()
    size = len(dataset)
    names = (*SUMS, *(("kl", "agree") if teacher else ()), *(GAP_SUMS if scoring.far_gap is not None else ()))
    sums = {name: np.zeros(size) for name in names}
    batches = scored_batches(dataset, scoring, model.config.pad_token_id)
    for at, batch in enumerate(tqdm(batches, total=_batch_count(size, scoring), desc="scored", leave=False)):
        log_q, scored = _scored(model, batch)  # (N, V), (B, L)
        target = _targets(batch)[scored]  # (N,)
        owner = scored.nonzero()[:, 0].numpy()  # (N,) the batch row of each scored token
        index = batch.rows[owner]  # (N,) its unit's index in the split
        values = {"nll": -log_q.gather(-1, target[:, None]).squeeze(-1)}  # each (N,)
        predicted = log_q.argmax(-1)
        values |= {"tokens": torch.ones_like(target), "correct": predicted == target}
        if scoring.far_gap is not None:
            far = torch.from_numpy(answer_gaps(batch).reshape(-1) > scoring.far_gap)  # (N,)
            values |= {"tokens_far": far, "correct_far": far & values["correct"]}
            values |= {"tokens_near": ~far, "correct_near": ~far & values["correct"]}
        if teacher is not None:
            log_p = teacher.log_probs[at]  # (N, V)
            if log_p.shape != log_q.shape:
                raise ValueError(
                    f"teacher targets of batch {at} are {tuple(log_p.shape)}, not {tuple(log_q.shape)}"
                )
            # p log(p / q) is 0 where p is: a token the teacher rules out (log p = −inf) adds nothing
            terms = torch.where(log_p.isfinite(), log_p.exp() * (log_p - log_q), 0.0)
            values["kl"] = terms.sum(-1)
            values["agree"] = log_p.argmax(-1) == predicted
        for name, value in values.items():
            np.add.at(sums[name], index, value.double().numpy())
    return sums
