"""Typed schema of ``params.yaml``, validated before any stage does work.

Each stage reads only its own section (``load_section("teacher")``), so DVC's per-key params tracking and the
validation agree on what a stage depends on. A wrong key, type or value raises :class:`UserError` with one
line: ``params.yaml: teacher.train.lr = -1: Input should be greater than 0``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.errors import UserError

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
# numpy, scikit-learn and the Trainer take seeds in [0, 2³²)
Seed = Annotated[int, Field(ge=0, lt=2**32)]


class Section(BaseModel):
    """Every section rejects unknown keys so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------------------------------------
# prepare


class SwordSource(Section):
    path: str = "/usr/share/sword"
    source_module: str = "engWEB2015eb"
    target_module: str = "spaRV1909eb"


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

    @model_validator(mode="after")
    def _columns(self) -> HubSource:
        flat = self.source_column is not None and self.target_column is not None
        if self.translation_column is None and not flat:
            raise ValueError("set translation_column, or both source_column and target_column")
        return self


class Prepare(Section):
    source: Literal["sword", "text", "hf"] = "sword"
    sword: SwordSource = SwordSource()
    text: TextSource | None = None
    hf: HubSource | None = None
    src_lang: str = "en"
    tgt_lang: str = "es"
    valid_fraction: Fraction = 0.02
    test_fraction: Fraction = 0.02
    split_seed: Seed = 0
    vocab_size: Annotated[int, Field(ge=100)] = 8000
    min_length: PositiveInt = 1
    max_length: PositiveInt = 64
    max_length_ratio: Annotated[float, Field(ge=1.0)] | None = None
    max_examples: PositiveInt | None = None
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
        return self


# ----------------------------------------------------------------------------------------------------------
# training (shared by pretrain and teacher)


class ModelShape(Section):
    """Marian encoder–decoder built from scratch (ignored when ``init`` names a checkpoint)."""

    d_model: PositiveInt = 256
    encoder_layers: PositiveInt = 3
    decoder_layers: PositiveInt = 3
    heads: PositiveInt = 4
    ffn_dim: PositiveInt = 1024
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    max_positions: PositiveInt = 256

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelShape:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.heads}")
        return self


class Training(Section):
    max_steps: PositiveInt = 1000
    batch_size: PositiveInt = 32
    grad_accumulation: PositiveInt = 1
    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 5e-4
    warmup_steps: NonNegativeInt = 200
    schedule: Literal["inverse_sqrt", "linear", "constant_with_warmup"] = "inverse_sqrt"
    label_smoothing: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0
    grad_clip: Annotated[float, Field(gt=0.0)] = 1.0
    eval_steps: PositiveInt = 250
    save_steps: PositiveInt = 250
    logging_steps: PositiveInt = 50
    seed: Seed = 0


class Evaluation(Section):
    beams: PositiveInt = 4
    max_new_tokens: PositiveInt = 96
    batch_size: PositiveInt = 32
    test_examples: PositiveInt | None = 500
    sparsity_examples: PositiveInt = 200


class Pretrain(Section):
    init: str | None = None
    model: ModelShape = ModelShape()
    train: Training = Training()
    eval: Evaluation = Evaluation()
    data: str = "artifacts/data"
    out: str = "artifacts/models/pretrain"
    run_dir: str = "artifacts/runs/pretrain"
    metrics: str = "artifacts/metrics/pretrain.json"

    @model_validator(mode="after")
    def _generation_fits(self) -> Pretrain:
        if self.init is None and self.eval.max_new_tokens > self.model.max_positions:
            raise ValueError(
                f"eval.max_new_tokens = {self.eval.max_new_tokens} exceeds model.max_positions = "
                f"{self.model.max_positions}; generation cannot go past the last position"
            )
        return self


class Teacher(Section):
    init: str = "artifacts/models/pretrain"
    alpha: Annotated[float, Field(ge=1.0, le=4.0)] = 1.5
    learn_alpha: bool = False
    train: Training = Training(max_steps=300, lr=2e-4, warmup_steps=50)
    eval: Evaluation = Evaluation()
    data: str = "artifacts/data"
    out: str = "artifacts/models/teacher"
    run_dir: str = "artifacts/runs/teacher"
    metrics: str = "artifacts/metrics/teacher.json"

    @model_validator(mode="after")
    def _learned_alpha_above_one(self) -> Teacher:
        if self.learn_alpha and self.alpha <= 1.0:
            raise ValueError(f"learn_alpha = true needs alpha > 1 to start from, got alpha = {self.alpha}")
        return self


# ----------------------------------------------------------------------------------------------------------
# attention graphs and learned predictors

AttentionKindName = Literal["decoder_self", "encoder_self", "cross"]


class Extract(Section):
    teacher: str = "artifacts/models/teacher"
    data: str = "artifacts/data"
    split: Literal["train", "valid", "test"] = "train"
    kinds: Annotated[list[AttentionKindName], Field(min_length=1)] = ["decoder_self"]
    min_length: PositiveInt = 21
    max_sentences: PositiveInt | None = 10000
    batch_size: PositiveInt = 32
    dtype: Literal["float16", "float32"] = "float16"
    shard_sentences: PositiveInt = 512
    seed: Seed = 0
    out: str = "artifacts/graphs"
    metrics: str = "artifacts/metrics/extract.json"

    @model_validator(mode="after")
    def _unique_kinds(self) -> Extract:
        if len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"kinds {self.kinds} lists a kind twice")
        return self


class Project(Section):
    graphs: str = "artifacts/graphs"
    kind: AttentionKindName = "decoder_self"
    rank: PositiveInt = 4
    shared: bool = False
    epochs: PositiveInt = 2
    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 1e-2
    batch_size: PositiveInt = 16
    grad_clip: Annotated[float, Field(gt=0.0)] = 1.0
    omega: Annotated[float, Field(gt=0.0)] = 1.0
    valid_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1
    eval_threshold: Annotated[float, Field(gt=0.0)] = 1.0
    eval_bins: PositiveInt = 4
    seed: Seed = 0
    out: str = "artifacts/predictors/projections.safetensors"
    metrics: str = "artifacts/metrics/project.json"
    plot: str = "artifacts/plots/project_loss.csv"


class Cluster(Section):
    graphs: str = "artifacts/graphs"
    projections: str = "artifacts/predictors/projections.safetensors"
    bucket_counts: Annotated[list[Annotated[int, Field(ge=2)]], Field(min_length=1)] = [
        2,
        4,
        6,
        8,
        10,
        12,
        16,
        20,
    ]
    top_k: PositiveInt = 1
    backend: Literal["auto", "faiss", "sklearn"] = "auto"
    iterations: PositiveInt = 25
    max_points_per_centroid: PositiveInt | None = None
    seed: Seed = 0
    out: str = "artifacts/predictors/centroids.safetensors"
    metrics: str = "artifacts/metrics/cluster.json"

    @model_validator(mode="after")
    def _top_k_fits(self) -> Cluster:
        if self.top_k > min(self.bucket_counts):
            raise ValueError(
                f"top_k {self.top_k} exceeds the smallest bucket count {min(self.bucket_counts)}"
            )
        return self


SECTIONS: dict[str, type[Section]] = {
    "prepare": Prepare,
    "pretrain": Pretrain,
    "teacher": Teacher,
    "extract": Extract,
    "project": Project,
    "cluster": Cluster,
}


# ----------------------------------------------------------------------------------------------------------
# loading


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path}: params file not found (pass --params FILE or create params.yaml)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _one_line(path: Path, section: str, err: ValidationError) -> str:
    first = err.errors()[0]
    key = ".".join(str(part) for part in (section, *first["loc"]))
    if first["type"] == "extra_forbidden":
        allowed = ", ".join(SECTIONS[section].model_fields) if len(first["loc"]) == 1 else None
        hint = f"unknown key (allowed: {allowed})" if allowed else "unknown key"
        return f"{path}: {key}: {hint}"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] in {"missing"} or first["loc"] == ():
        return f"{path}: {key}: {msg}"
    return f"{path}: {key} = {first['input']!r}: {msg}"


def validate_section(name: str, raw: Any, path: Path = Path("params.yaml")) -> Section:
    """Validate the mapping ``raw`` as section ``name``; raise :class:`UserError` (one line) if bad."""
    if name not in SECTIONS:
        raise UserError(f"{path}: unknown section {name!r} (allowed: {', '.join(SECTIONS)})")
    try:
        return SECTIONS[name].model_validate(raw if raw is not None else {})
    except ValidationError as err:
        raise UserError(_one_line(path, name, err)) from None


def load_section(name: str, path: str | os.PathLike = "params.yaml") -> Any:
    """Read ``path`` and return its validated section ``name`` (defaults fill absent keys)."""
    path = Path(path)
    return validate_section(name, _read_yaml(path).get(name), path)


def load_all(path: str | os.PathLike = "params.yaml") -> dict[str, Section]:
    """Validate every known section of ``path`` (unknown top-level sections are an error too)."""
    path = Path(path)
    data = _read_yaml(path)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise UserError(f"{path}: unknown section {unknown[0]!r} (allowed: {', '.join(SECTIONS)})")
    return {name: validate_section(name, data.get(name), path) for name in SECTIONS}
