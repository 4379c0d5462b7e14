"""The ``prepare`` section: which corpus is read, and how it is cleaned, split and tokenized."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.params.base import Context, Examples, Fraction, Section, Seed, Tokens, Vocabulary


class SwordSource(Section):
    path: str = "/usr/share/sword"
    source_module: str = "engWEB2015eb"
    target_module: str = "spaRV1909eb"
    # lm/mlm: the modules whose chapters are the documents (World English Bible, King James Version),
    # and the books read (OSIS names such as "Gen"; null: all)
    modules: Annotated[list[str], Field(min_length=1)] = ["engWEB2015eb", "engKJV2006eb"]
    books: Annotated[list[str], Field(min_length=1)] | None = None


class TextSource(Section):
    source_file: str
    target_file: str


class HubSource(Section):
    """A ``datasets`` dataset: a hub id (online) or a local folder in the same format."""

    name: str
    config: str | None = None
    translation_column: str | None = "translation"
    source_column: str | None = None
    target_column: str | None = None
    id_column: str | None = None
    use_dataset_splits: bool = True
    # lm/mlm: the column of text rows; `lines`: rows are lines of articles starting at WikiText's
    # " = Title = " lines (else one document per row)
    text_column: str | None = None
    lines: bool = True

    @model_validator(mode="after")
    def _columns(self) -> HubSource:
        flat = self.source_column is not None and self.target_column is not None
        if self.translation_column is None and not flat and self.text_column is None:
            raise ValueError(
                "set translation_column, or both source_column and target_column (or text_column)"
            )
        return self


class MqarPart(Section):
    """One part of a training mixture: examples of another length and pair count, the task otherwise the
    same (vocabulary, power law, filler)."""

    input_seq_len: Context
    num_kv_pairs: Annotated[int, Field(ge=1)]
    examples: Examples


class MqarSource(Section):
    """Multi-query associative recall (:mod:`pipeline.data.mqar`): Zoology's ``multiquery_ar`` arguments and
    the examples per split. ``vocab_size`` must exceed ``input_seq_len`` (as Zoology asserts); 8192 as
    published. The spec's own checks (:class:`~pipeline.data.mqar.MqarSpec`) run before any example is
    generated."""

    vocab_size: Vocabulary = 8192
    input_seq_len: Context = 512
    num_kv_pairs: Annotated[int, Field(ge=1)] = 32
    power_a: Annotated[float, Field(gt=0.0)] = 0.01
    random_non_queries: bool = True
    train_examples: Examples = 20000
    # Zoology trains on a mixture of shorter, easier examples and tests on long ones; each part at most
    # input_seq_len long (null: train_examples of the spec itself)
    train_mixture: Annotated[list[MqarPart], Field(min_length=1)] | None = None
    valid_examples: Examples = 256
    test_examples: Examples = 256

    @model_validator(mode="after")
    def _one_training_set(self) -> MqarSource:
        if self.train_mixture is not None and "train_examples" in self.model_fields_set:
            raise ValueError("set train_examples or train_mixture, not both")
        for part in self.train_mixture or ():
            if part.input_seq_len > self.input_seq_len:
                raise ValueError(
                    f"train_mixture part of input_seq_len {part.input_seq_len} is longer than the "
                    f"test examples' {self.input_seq_len}; allowed: at most {self.input_seq_len}"
                )
        return self

    def counts(self) -> dict[str, int]:
        """Examples per split."""
        train = (
            sum(part.examples for part in self.train_mixture) if self.train_mixture else self.train_examples
        )
        return {"train": train, "valid": self.valid_examples, "test": self.test_examples}


class Prepare(Section):
    """A translation corpus of sentence pairs, or (``task`` lm / mlm) a corpus of ``context``-token blocks
    cut from long documents: chapters of ``sword.modules``, or the articles of ``hf.text_column``, or
    (``task`` mqar) generated recall examples, their length, vocabulary and seeds from ``mqar`` and
    ``split_seed`` (``source``, ``vocab_size`` and ``context`` are not read)."""

    task: Literal["translation", "lm", "mlm", "mqar"] = "translation"
    source: Literal["sword", "text", "hf"] = "sword"
    sword: SwordSource = SwordSource()
    text: TextSource | None = None
    hf: HubSource | None = None
    mqar: MqarSource = MqarSource()
    src_lang: str = "en"
    tgt_lang: str = "es"
    valid_fraction: Fraction = 0.02
    test_fraction: Fraction = 0.02
    split_seed: Seed = 0
    # translation: leave out valid/test pairs whose source sentence is also a training source
    held_out_unseen: bool = True
    vocab_size: Vocabulary = 8000
    min_length: Tokens = 1
    max_length: Tokens = 64
    max_length_ratio: Annotated[float, Field(ge=1.0)] | None = None
    max_examples: Examples | None = None
    context: Context = 1024
    out: str = "artifacts/data"
    metrics: str = "artifacts/metrics/prepare.json"

    @model_validator(mode="after")
    def _source_options(self) -> Prepare:
        if self.source == "text" and self.text is None:
            raise ValueError("source 'text' needs a 'text' section with source_file and target_file")
        if self.source == "hf" and self.hf is None:
            raise ValueError("source 'hf' needs an 'hf' section with at least 'name'")
        if self.min_length > self.max_length:
            raise ValueError(f"min_length {self.min_length} exceeds max_length {self.max_length}")
        if self.valid_fraction + self.test_fraction >= 1.0:
            raise ValueError("valid_fraction + test_fraction must leave room for training data")
        if self.task == "mqar":
            return self
        if self.task != "translation" and self.source == "text":
            raise ValueError(f"source 'text' reads sentence pairs; allowed for task {self.task!r}: sword, hf")
        if self.task != "translation" and self.source == "hf" and self.hf.text_column is None:
            raise ValueError(f"task {self.task!r} reads documents from a text column; set hf.text_column")
        return self
