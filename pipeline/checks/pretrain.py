"""The ``pretrain`` stage's checks: its corpus is prepared, a model from scratch has positions for its
longest sequence, and a model to start from (``init``) reads sentence pairs and generates within its
positions."""

from __future__ import annotations

from functools import cached_property

from datasets import DatasetDict
from transformers import PreTrainedTokenizerBase

from pipeline.checkpoint import load_config, loading, resolve_outside_checkpoint
from pipeline.checks import InputCheck, StageInputs
from pipeline.corpus_card import TASKS, CorpusCard
from pipeline.errors import UserError
from pipeline.params.pretrain import Pretrain
from pipeline.training.run import check_generation_fits, longest_sequence, prepared_corpus


class PretrainInputs(StageInputs):
    """The stage's inputs and its checks against them."""

    def __init__(self, params: Pretrain) -> None:
        self.params = params

    @cached_property
    def init(self) -> str | None:
        """``pretrain.init`` checked as a model folder or hub id, or None for a model from scratch."""
        if self.params.init is None:
            return None
        return resolve_outside_checkpoint(self.params.init, "pretrain.init")

    @cached_property
    def corpus(self) -> tuple[DatasetDict, PreTrainedTokenizerBase, CorpusCard]:
        """(the prepared corpus, its tokenizer, its card)."""
        return prepared_corpus(self.params.data, "pretrain.data", tasks=TASKS)

    def check_init_task(self) -> None:
        """Blocks are cut by the corpus's own tokenizer; a checkpoint's tokenizer would cut other blocks."""
        card = self.corpus[2]
        if card.task != "translation" and self.params.init is not None:
            raise UserError(
                f"pretrain.init = {self.params.init!r}: a {card.task} corpus holds blocks of its own "
                "tokenizer; allowed: null (a model from scratch)"
            )

    def check_positions(self) -> None:
        """A model from scratch has a position for every token of the longest sequence it trains on."""
        data, _, card = self.corpus
        longest = longest_sequence(data) if card.task == "translation" else card.context
        if longest > self.params.model.max_positions:
            raise UserError(
                f"pretrain.model.max_positions = {self.params.model.max_positions}: {self.params.data} holds "
                f"sequences of up to {longest} tokens; allowed: at least {longest} (or a shorter "
                "prepare.max_length or prepare.context)"
            )

    def check_generation(self) -> None:
        """Generation stays within the ``init`` model's positions (its config only: no weight is read)."""
        with loading(self.init, "pretrain.init"):
            check_generation_fits("pretrain", self.params, load_config(self.init))

    def checks(self) -> list[InputCheck]:
        init = {} if self.params.init is None else {"pretrain.init": self.params.init}
        data = {"pretrain.data": self.params.data}
        checks = [InputCheck(init, lambda: self.init), InputCheck(data, self.check_init_task)]
        if self.params.init is None:
            return [*checks, InputCheck(data, self.check_positions)]
        return [*checks, InputCheck(init, self.check_generation)]


def input_checks(params: Pretrain) -> list[InputCheck]:
    return PretrainInputs(params).checks()


def check_inputs(params: Pretrain) -> PretrainInputs:
    return PretrainInputs(params).check()
