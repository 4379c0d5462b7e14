"""One training stage, end to end: train, save a self-describing checkpoint, measure it.

Shared by ``pretrain`` (softmax), ``teacher`` (α-entmax) and ``student`` (a sparse attention, distilled
from the teacher): they differ only in the model (and teacher) they hand in.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from datasets import DatasetDict, load_from_disk
from transformers import (
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
)

import pipeline.attention  # noqa: F401  (registers the attention implementations)
from pipeline.atomic import atomic_path, staged_outputs
from pipeline.attention.sparsity import collect_marian_sparsity
from pipeline.checkpoint import load_auto_tokenizer, save_checkpoint, seed_path
from pipeline.corpus_card import MQAR_CARD, CorpusCard, Task, read_corpus_card
from pipeline.data.mqar_card import mqar_card_text
from pipeline.errors import UserError, writing
from pipeline.fingerprint import folder_sha256, value_sha256
from pipeline.metrics.language_model import evaluate_language_model
from pipeline.metrics.translation import corpus_bleu, perplexity, translate
from pipeline.models.marian import set_generation
from pipeline.params.training import Evaluation, Training
from pipeline.timings import metrics_files, write_metrics
from pipeline.training.batches import padded_batches
from pipeline.training.plateau import require_learning, unigram_entropy
from pipeline.training.trainer import is_main_process, train_model

TOKENIZER_FOLDER = "tokenizer"


class TrainedSection(Protocol):
    """What this module reads of a training stage's section (pretrain, teacher, a student's run, par_search;
    a student's and par_search's also ``distill``): the keys each of them has, so that the module imports
    none of their schemas."""

    data: str
    run_dir: str
    out: str
    metrics: str
    train: Training
    eval: Evaluation

    def model_dump(self) -> dict[str, Any]: ...

    def model_copy(self, *, update: dict[str, Any]) -> Any: ...


class GuardedSection(TrainedSection, Protocol):
    """A section whose model must learn beyond token frequencies (pretrain, teacher):
    :func:`~pipeline.training.plateau.require_learning` with ``unigram_margin`` (None: not checked)."""

    unigram_margin: float | None


class InitializedSection(TrainedSection, Protocol):
    """A section whose model starts from the folder ``init`` (pretrain: null, a model from scratch)."""

    init: str | None


def prepared_corpus(
    folder: str, key: str = "data", tasks: Sequence[Task] = ("translation",)
) -> tuple[DatasetDict, PreTrainedTokenizerBase, CorpusCard]:
    """The prepared DatasetDict, the tokenizer it was encoded with and its card; ``key`` names ``folder`` in
    errors, and the corpus must be of one of ``tasks`` (those the caller trains or evaluates)."""
    if not (Path(folder) / "dataset_dict.json").is_file():
        raise UserError(f"{key} = {folder!r}: no prepared corpus there (run the 'prepare' stage first)")
    card = read_corpus_card(folder, key)
    if card.task not in tasks:
        raise UserError(f"{key} = {folder!r} holds a {card.task!r} corpus; allowed here: {', '.join(tasks)}")
    return load_from_disk(folder), load_auto_tokenizer(Path(folder) / TOKENIZER_FOLDER), card


def load_corpus(
    folder: str, key: str = "data", tasks: Sequence[Task] = ("translation",)
) -> tuple[DatasetDict, PreTrainedTokenizerBase]:
    """:func:`prepared_corpus` without its card."""
    return prepared_corpus(folder, key, tasks)[:2]


def longest_sequence(data: DatasetDict) -> int:
    """Tokens in the longest source or target sequence of any split."""
    return max(
        (len(ids) for split in data.values() for column in ("input_ids", "labels") for ids in split[column]),
        default=0,
    )


def check_generation_fits(stage: str, params: InitializedSection, config: PretrainedConfig) -> None:
    """Raise :class:`UserError` when ``eval.max_new_tokens`` runs past the positions of the ``init`` model
    (its ``config``: checked before any weight is loaded)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and params.eval.max_new_tokens > positions:
        raise UserError(
            f"{stage}.eval.max_new_tokens = {params.eval.max_new_tokens}: the model of {stage}.init = "
            f"{params.init!r} has {positions} positions; allowed: at most {positions}"
        )


def data_for_model(
    data: DatasetDict,
    corpus_tokenizer: PreTrainedTokenizerBase,
    tokenizer: PreTrainedTokenizerBase,
    model: PreTrainedModel,
    *,
    task: Task,
    key: str,
) -> DatasetDict:
    """``data`` as ``model`` (with its own ``tokenizer``, from the folder params ``key`` names) reads it:
    sentence pairs re-encoded by :func:`encode_with`; blocks, which hold ids and no text, as they are once
    the model's vocabulary is the corpus's (else :class:`UserError`)."""
    if task == "translation":
        return encode_with(tokenizer, data, model.config.max_position_embeddings)
    check_vocabulary(corpus_tokenizer, tokenizer, task=task, key=key)
    return data


def check_vocabulary(
    corpus_tokenizer: PreTrainedTokenizerBase, tokenizer: PreTrainedTokenizerBase, *, task: Task, key: str
) -> None:
    """Raise :class:`UserError` when a model's ``tokenizer`` is not the one a block corpus (``task`` lm or
    mlm) was cut with: blocks hold ids and no text to re-encode, so they mean other words to that model.
    Sentence pairs are re-encoded with the model's own tokenizer, so any vocabulary fits them."""
    if task != "translation" and tokenizer.get_vocab() != corpus_tokenizer.get_vocab():
        raise UserError(
            f"{key}: the model's tokenizer is not the one its {task} corpus was cut with; allowed: a model "
            "trained on that corpus (from the pretrain stage on)"
        )


def encode_with(tokenizer: PreTrainedTokenizerBase, data: DatasetDict, max_length: int) -> DatasetDict:
    """Re-encode the text columns with a checkpoint's own tokenizer, in memory (data folder untouched)."""

    def encode(batch: dict[str, list]) -> dict[str, list]:
        encoded = tokenizer(batch["src"], text_target=batch["tgt"], truncation=True, max_length=max_length)
        return {"input_ids": encoded["input_ids"], "labels": encoded["labels"]}

    return data.map(encode, batched=True, keep_in_memory=True, load_from_cache_file=False, desc="encode")


def evaluate_translation(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, data: DatasetDict, settings: Evaluation
) -> dict[str, Any]:
    """Valid perplexity, test BLEU (beam search, detokenized; none with ``test_examples`` 0) and, for
    entmax models, attention sparsity."""
    started = time.perf_counter()
    metrics: dict[str, Any] = {"valid": perplexity(model, data["valid"], settings.batch_size)}
    test = data["test"]
    if settings.test_examples is not None:
        test = test.select(range(min(settings.test_examples, len(test))))
    if len(test):
        hypotheses, references = translate(model, tokenizer, test, settings.batch_size)
        metrics["test"] = {"sentences": len(test), **corpus_bleu(hypotheses, references)}
        metrics["examples"] = [
            {"hypothesis": h, "reference": r} for h, r in zip(hypotheses[:3], references[:3], strict=True)
        ]
    if model.config._attn_implementation == "entmax":
        sample = data["valid"].select(range(min(settings.sparsity_examples, len(data["valid"]))))
        batches = (
            batch for batch, _ in padded_batches(sample, settings.batch_size, model.config.pad_token_id)
        )
        metrics["attention_sparsity"] = collect_marian_sparsity(model, batches)
    metrics["eval_seconds"] = round(time.perf_counter() - started, 1)
    return metrics


def train_stage(
    params: TrainedSection,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: DatasetDict,
    parent: dict[str, Any] | None,
    *,
    teacher: PreTrainedModel | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    optimizer: torch.optim.Optimizer | None = None,
    last: bool = True,
) -> tuple[PreTrainedModel, float, str]:
    """Train ``model`` with ``params.train`` in ``params.run_dir``, resuming a run of the same params, data
    and parent; with a ``teacher``, distilled with ``params.distill``; ``last``: whether it is the process's
    last training (:func:`~pipeline.training.trainer.train_model`). Returns the trained model, the seconds
    it took and the data folder's sha256."""
    data_sha256 = folder_sha256(params.data)
    fingerprint = value_sha256({"params": params.model_dump(), "data": data_sha256, "parent": parent})
    started = time.perf_counter()
    model = train_model(
        model,
        tokenizer,
        data,
        params.run_dir,
        params.train,
        fingerprint,
        task=read_corpus_card(params.data, "data").task,
        teacher=teacher,
        distillation=getattr(params, "distill", None),
        callbacks=callbacks,
        optimizer=optimizer,
        last=last,
    )
    return model, time.perf_counter() - started, data_sha256


def train_and_evaluate(
    stage: str,
    params: GuardedSection,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: DatasetDict,
    parent: dict[str, Any] | None,
    *,
    teacher: PreTrainedModel | None = None,
    callbacks: Sequence[TrainerCallback] = (),
) -> None:
    """Train ``model`` (:func:`train_stage`), save it to ``params.out`` and write ``params.metrics``, the two
    swapped in together; a model whose validation loss is not clearly below the unigram entropy of its
    training labels is refused instead (:mod:`pipeline.training.plateau`), and nothing is written.

    A student passes its ``teacher`` (distilled with ``params.distill``) and its own training callbacks.
    """
    model, train_seconds, data_sha256 = train_stage(
        params, model, tokenizer, data, parent, teacher=teacher, callbacks=callbacks
    )
    if not is_main_process():
        return
    task = read_corpus_card(params.data, f"{stage}.data").task
    # the model, its metrics and their timings are swapped in together: a failure while measuring or while
    # writing the metrics (a full disk) leaves the previous model and the metrics describing it as they were
    with staged_outputs(params.out, *metrics_files(params.metrics)):
        manifest = {
            "stage": stage,
            "params": params.model_dump(),
            "data_sha256": data_sha256,
            "parent": parent,
        }
        measured = save_and_measure(params.out, params, model, tokenizer, data, manifest, task=task)
        # a model that learned nothing beyond token frequencies is refused before anyone extracts from it
        labels = data["train"]["labels" if task in ("translation", "mqar") else "input_ids"]
        entropy = unigram_entropy(labels, vocab_size=len(tokenizer), pad_id=tokenizer.pad_token_id)
        measured["unigram_entropy"] = round(entropy, 4)
        if params.unigram_margin is not None:
            require_learning(stage, measured["valid"]["loss"], entropy, params.unigram_margin)
        with writing(f"the metrics {params.metrics}"):
            write_metrics(params.metrics, {"train_seconds": round(train_seconds, 1), **measured})
    shutil.rmtree(params.run_dir, ignore_errors=True)


def train_seeds(
    stage: str,
    params: TrainedSection,
    build: Callable[[int], PreTrainedModel],
    tokenizer: PreTrainedTokenizerBase,
    data: DatasetDict,
    parent: dict[str, Any] | None,
    *,
    seeds: Sequence[int],
    teacher: PreTrainedModel | None = None,
    callbacks: Callable[[], Sequence[TrainerCallback]] = tuple,
) -> None:
    """Train one model per seed: ``build(seed)`` is its starting model and ``train.seed`` = seed; save each
    to ``params.out``/seed-S (:func:`seed_path`) and write ``params.metrics`` with one entry per seed
    (``"seed-S"``), all swapped in together.

    Each seed runs in ``params.run_dir``/seed-S, kept until every seed is saved, so an interrupted stage
    resumes the seed it was training and does not train the finished ones again. ``callbacks()`` makes a
    fresh set of training callbacks per seed.
    """
    trained = []
    for seed in seeds:
        own = params.model_copy(
            update={
                "train": params.train.model_copy(update={"seed": seed}),
                "run_dir": str(seed_path(params.run_dir, seed)),
                "out": str(seed_path(params.out, seed)),
            }
        )
        last = seed == seeds[-1]  # under torchrun the process group lives until the last seed is trained
        found = train_stage(
            own, build(seed), tokenizer, data, parent, teacher=teacher, callbacks=callbacks(), last=last
        )
        trained.append((seed, own, *found))
    if not is_main_process():
        return
    task = read_corpus_card(params.data, f"{stage}.data").task
    metrics = {}
    with staged_outputs(params.out, *metrics_files(params.metrics)):
        with atomic_path(params.out, directory=True) as folder:
            for seed, own, model, train_seconds, data_sha256 in trained:
                manifest = {"stage": stage, "params": own.model_dump(), "data_sha256": data_sha256}
                manifest |= {"parent": parent, "seed": seed}
                target = seed_path(folder, seed)
                measured = save_and_measure(target, own, model, tokenizer, data, manifest, task=task)
                metrics[target.name] = {"train_seconds": round(train_seconds, 1), **measured}
        with writing(f"the metrics {params.metrics}"):
            write_metrics(params.metrics, metrics)
    shutil.rmtree(params.run_dir, ignore_errors=True)


def save_and_measure(
    folder: str | Path,
    params: TrainedSection,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: DatasetDict,
    manifest: dict[str, Any],
    *,
    task: Task,
) -> dict[str, Any]:
    """Save a trained ``model`` to ``folder`` with ``manifest``, and its measures on ``task`` with
    ``params.eval`` (:func:`evaluate_translation`, or the block tasks' :func:`evaluate_language_model`)."""
    if task == "translation":
        set_generation(model, params.eval)
    with writing(f"the checkpoint {params.out}"):
        extra = {MQAR_CARD: mqar_card_text(params.data)} if task == "mqar" else None
        save_checkpoint(folder, model, tokenizer, manifest, extra)
    if task == "translation":
        return evaluate_translation(model, tokenizer, data, params.eval)
    settings = params.eval
    return evaluate_language_model(
        model,
        tokenizer,
        task,
        data,
        batch_size=settings.batch_size,
        test_examples=settings.test_examples,
        sparsity_examples=settings.sparsity_examples,
    )
