"""The ``teacher`` stage's checks: it starts from the pretrain stage's folder, its corpus is prepared,
generation stays within the model's positions, and a block corpus was cut with the model's tokenizer."""

from __future__ import annotations

from functools import cached_property

from datasets import DatasetDict
from transformers import PreTrainedTokenizerBase

from pipeline.checkpoint import load_auto_tokenizer, load_config, loading, resolve_checkpoint
from pipeline.checks import InputCheck, StageInputs
from pipeline.corpus_card import TASKS, Task
from pipeline.params.teacher import Teacher
from pipeline.training.run import check_generation_fits, check_vocabulary, prepared_corpus


class TeacherInputs(StageInputs):
    """The stage's inputs and its checks against them."""

    def __init__(self, params: Teacher) -> None:
        self.params = params

    @cached_property
    def init(self) -> str:
        """``teacher.init``, checked as a folder the pretrain stage wrote."""
        return resolve_checkpoint(self.params.init, "teacher.init", writer="pretrain")

    @cached_property
    def corpus(self) -> tuple[DatasetDict, PreTrainedTokenizerBase, Task]:
        """(the prepared corpus, the tokenizer it was cut with, its task)."""
        data, tokenizer, card = prepared_corpus(self.params.data, "teacher.data", tasks=TASKS)
        return data, tokenizer, card.task

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The ``init`` model's own tokenizer."""
        with loading(self.init, "teacher.init"):
            return load_auto_tokenizer(self.init)

    def check_model(self) -> None:
        """Generation within the model's positions (its config: no weight is read) and, for blocks, the
        corpus's vocabulary."""
        _, corpus_tokenizer, task = self.corpus
        if task == "translation":
            with loading(self.init, "teacher.init"):
                check_generation_fits("teacher", self.params, load_config(self.init))
        key = f"teacher.init = {self.params.init!r}"
        check_vocabulary(corpus_tokenizer, self.tokenizer, task=task, key=key)

    def checks(self) -> list[InputCheck]:
        init, data = {"teacher.init": self.params.init}, {"teacher.data": self.params.data}
        return [
            InputCheck(init, lambda: self.init),
            InputCheck(data, lambda: self.corpus),
            InputCheck(init | data, self.check_model),
        ]


def input_checks(params: Teacher) -> list[InputCheck]:
    return TeacherInputs(params).checks()


def check_inputs(params: Teacher) -> TeacherInputs:
    return TeacherInputs(params).check()
