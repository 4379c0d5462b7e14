"""The ``par_search`` stage's checks: the teacher is the teacher stage's folder, with stacks PAR can
search (its skeleton only: no weight is read), the corpus is prepared, and a block corpus was cut with the
teacher's tokenizer."""

from __future__ import annotations

from functools import cached_property

from datasets import DatasetDict
from transformers import PreTrainedTokenizerBase

from pipeline.attention import ENTMAX, model_skeleton
from pipeline.checkpoint import load_auto_tokenizer, loading, resolve_checkpoint
from pipeline.checks import InputCheck, StageInputs
from pipeline.corpus_card import TASKS, Task
from pipeline.errors import UserError
from pipeline.par.pattern import Stack
from pipeline.par.stacks import teacher_layers
from pipeline.params.par_search import ParSearch
from pipeline.training.run import check_vocabulary, prepared_corpus


class ParSearchInputs(StageInputs):
    """The stage's inputs and its checks against them."""

    def __init__(self, params: ParSearch) -> None:
        self.params = params

    @cached_property
    def teacher(self) -> str:
        """``par_search.teacher``, checked as a folder the teacher stage wrote."""
        return resolve_checkpoint(self.params.teacher, "par_search.teacher", writer="teacher")

    @cached_property
    def corpus(self) -> tuple[DatasetDict, PreTrainedTokenizerBase, Task]:
        """(the prepared corpus, the tokenizer it was cut with, its task)."""
        data, tokenizer, card = prepared_corpus(self.params.data, "par_search.data", tasks=TASKS)
        return data, tokenizer, card.task

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The teacher's own tokenizer."""
        with loading(self.teacher, "par_search.teacher"):
            return load_auto_tokenizer(self.teacher)

    @cached_property
    def layers(self) -> dict[Stack, int]:
        """The teacher's layers per stack, the positions the search mixes."""
        with loading(self.teacher, "par_search.teacher"):
            skeleton = model_skeleton(self.teacher, attn_implementation=ENTMAX)
        try:
            return teacher_layers(skeleton)
        except UserError as err:
            raise UserError(f"par_search.teacher = {self.params.teacher!r}: {err}") from None

    def check_vocabulary(self) -> None:
        _, corpus_tokenizer, task = self.corpus
        key = f"par_search.teacher = {self.params.teacher!r}"
        check_vocabulary(corpus_tokenizer, self.tokenizer, task=task, key=key)

    def checks(self) -> list[InputCheck]:
        teacher, data = {"par_search.teacher": self.params.teacher}, {"par_search.data": self.params.data}
        return [
            InputCheck(teacher, lambda: self.teacher),
            InputCheck(data, lambda: self.corpus),
            InputCheck(teacher, lambda: self.layers),
            InputCheck(teacher | data, self.check_vocabulary),
        ]


def input_checks(params: ParSearch) -> list[InputCheck]:
    return ParSearchInputs(params).checks()


def check_inputs(params: ParSearch) -> ParSearchInputs:
    return ParSearchInputs(params).check()
