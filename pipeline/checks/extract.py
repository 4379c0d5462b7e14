"""The ``extract`` stage's checks: its teacher has every attention kind asked for, all of one shape, and
every store's split has a sentence of the store's ``min_length`` (the teacher's skeleton only: no weight
is read)."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from datasets import DatasetDict
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.attention import ENTMAX, model_skeleton
from pipeline.attention.recording import Layout, model_layout
from pipeline.checkpoint import load_auto_tokenizer, loading, resolve_checkpoint
from pipeline.checks import InputCheck, StageInputs
from pipeline.corpus_card import TASKS, Task
from pipeline.errors import UserError
from pipeline.graphs import attention_kind
from pipeline.graphs.extract import kind_shapes, query_lengths
from pipeline.params.extract import Extract
from pipeline.training.run import data_for_model, prepared_corpus


def check_kinds(params: Extract, model: PreTrainedModel) -> None:
    """Raise :class:`UserError` unless the teacher has every kind asked for, all of one shape (layers,
    heads and head size)."""
    try:
        shapes = kind_shapes(model, [attention_kind(k) for k in params.kinds])
    except ValueError as err:
        raise UserError(f"extract.kinds = {params.kinds}: {err}") from None
    if len(set(shapes.values())) > 1:
        described = ", ".join(f"{k} {s[0]} layers × {s[1]} heads × {s[2]} dims" for k, s in shapes.items())
        raise UserError(
            f"extract.kinds = {params.kinds}: the teacher's kinds differ in shape ({described}); "
            "allowed: kinds of one shape"
        )


def check_lengths(params: Extract, name: str, dataset: Any, layout: Layout) -> None:
    """Raise :class:`UserError` unless some sentence of store ``name``'s split is ``min_length`` long."""
    store = params.stores[name]
    key = f"extract.stores.{name}"
    if len(dataset) == 0:
        raise UserError(f"{key}.split = {store.split!r}: that split of {params.data} is empty")
    kinds = [attention_kind(k) for k in params.kinds]
    lengths = query_lengths(dataset, kinds, layout)
    if lengths.max() < store.min_length:
        sides = " and ".join(sorted({k.query_side for k in kinds}))
        raise UserError(
            f"{key}.min_length = {store.min_length}: no sentence of the {store.split} split has "
            f"{store.min_length} {sides} tokens; the longest has {lengths.max()}"
        )


class ExtractInputs(StageInputs):
    """The stage's inputs and its checks against them."""

    def __init__(self, params: Extract) -> None:
        self.params = params

    @cached_property
    def teacher(self) -> str:
        """``extract.teacher``, checked as a folder the teacher stage wrote."""
        return resolve_checkpoint(self.params.teacher, "extract.teacher", writer="teacher")

    @cached_property
    def corpus(self) -> tuple[DatasetDict, PreTrainedTokenizerBase, Task]:
        """(the prepared corpus, the tokenizer it was cut with, its task)."""
        data, tokenizer, card = prepared_corpus(self.params.data, "extract.data", tasks=TASKS)
        return data, tokenizer, card.task

    @cached_property
    def skeleton(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """(the teacher without its weights, its tokenizer)."""
        with loading(self.teacher, "extract.teacher"):
            return model_skeleton(self.teacher, attn_implementation=ENTMAX), load_auto_tokenizer(self.teacher)

    @cached_property
    def data(self) -> DatasetDict:
        """The corpus as the teacher reads it."""
        corpus, corpus_tokenizer, task = self.corpus
        skeleton, tokenizer = self.skeleton
        key = f"extract.teacher = {self.params.teacher!r}"
        return data_for_model(corpus, corpus_tokenizer, tokenizer, skeleton, task=task, key=key)

    def check_lengths(self) -> None:
        """Every store's split, before any store is extracted."""
        layout = model_layout(self.skeleton[0])
        for name, store in self.params.stores.items():
            check_lengths(self.params, name, self.data[store.split], layout)

    def checks(self) -> list[InputCheck]:
        teacher, data = {"extract.teacher": self.params.teacher}, {"extract.data": self.params.data}
        return [
            InputCheck(teacher, lambda: self.teacher),
            InputCheck(data, lambda: self.corpus),
            InputCheck(teacher, lambda: check_kinds(self.params, self.skeleton[0])),
            InputCheck(teacher | data, self.check_lengths),
        ]


def input_checks(params: Extract) -> list[InputCheck]:
    return ExtractInputs(params).checks()


def check_inputs(params: Extract) -> ExtractInputs:
    return ExtractInputs(params).check()
