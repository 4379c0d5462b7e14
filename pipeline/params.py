"""Typed schema of ``params.yaml``, validated before any stage does work.

Each stage reads only its own section (``load_section("teacher")``), so DVC's per-key params tracking and the
validation agree on what a stage depends on. A wrong key, type or value raises :class:`UserError` with one
line: ``params.yaml: teacher.train.lr = -1: Input should be greater than 0``.

The rules:

- Types are strict: a YAML ``true`` or ``"4"`` is not an int, a bool or a string is not a float (an int is:
  ``lr: 1``), and an int is not a string. ``1e-3`` is a float, as YAML 1.2 (and DVC, which reads the same
  file) has it, though PyYAML's YAML 1.1 would read a string. Unknown keys are errors.
- A key given twice in one mapping, at any depth, is an error naming the key and both lines (PyYAML would
  keep the last silently). Otherwise the file is read exactly like ``yaml.safe_load`` reads it, ``<<``
  merge keys included.
- Numbers mean something: a float must be finite (``.nan`` and ``.inf`` are refused wherever a number is
  meant, knob grids included), and an integer that sizes a tensor, a loop or a file has a generous upper
  bound (:func:`bounded`) that names the memory it would take, so a slip of the keyboard is one line rather
  than an allocation error deep inside a stage.
- The file itself is read defensively: it must be UTF-8, nested at most ``MAX_DEPTH`` levels, and its
  aliases may not expand past ``MAX_NODES`` values (a "billion laughs" file is one line, not a hang).
- Every section must be present: a missing one is an error rather than silently all defaults, so a
  truncated or misspelt file never runs a stage on settings nobody wrote. A section given but empty
  (``prepare: {}`` or a bare ``prepare:``) is written on purpose and means all defaults.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import os
import re
import reprlib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from pipeline.errors import UserError
from pipeline.par.pattern import Stack, parse_pattern

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
# numpy, scikit-learn and the Trainer take seeds in [0, 2³²)
Seed = Annotated[int, Field(ge=0, lt=2**32)]


def bounded(limit: int, *, least: int = 1, tensor: str | None = None, bytes_each: int = 4) -> Any:
    """An int in [``least``, ``limit``]; above the limit the one-line error names the memory it would take.

    The limits are far above any real run (the GPU profiles' largest values are 10 to 100 times smaller),
    so they only catch slips such as a width of 10¹² that would otherwise end in an allocation error deep
    in a stage. ``tensor`` describes what the value sizes, with ``{n}`` for the value (``"a {n} × 32000
    embedding"``) and ``bytes_each`` the bytes per unit of the value (the other factors times 4 for
    float32); without one the value sizes a loop or a count, and the message says only what is allowed.
    """

    def check(value: int) -> int:
        if value > limit:
            need = ""
            if tensor:
                need = f"{tensor.format(n=f'{value:.2g}')} needs ~{value * bytes_each:.1e} bytes; "
            raise ValueError(f"{need}allowed: ≤ {limit}")
        return value

    low = Field(gt=0) if least == 1 else Field(ge=least)  # as PositiveInt says it: "greater than 0"
    return Annotated[int, low, AfterValidator(check)]


# Generous bounds (see bounded): the GPU profiles' largest values are 10 to 100 times smaller. The memory
# estimates take the other factors of a tensor at typical sizes: 512 wide, 8000 words, 256 tokens, float32.
WIDTH_LIMIT = 65536  # d_model 512, ffn 2048, hidden 32, rank 32
COUNT_LIMIT = 4096  # layers 8, heads 8, beams 5, ensemble samples 16
TOKENS_LIMIT = 2**20  # positions and contexts 32768, vocabulary 16000, buckets 64
BATCH_LIMIT = 65536  # batch 128, shard 512 sentences
STEPS_LIMIT = 10**8  # steps 30000, epochs 5, iterations 25
EXAMPLES_LIMIT = 10**9  # sentences and examples 10000 (a corpus's size bounds them anyway)

ModelWidth = bounded(WIDTH_LIMIT, tensor="a {n} × 8000-word embedding", bytes_each=8000 * 4)
FeedForward = bounded(WIDTH_LIMIT, tensor="a 512 × {n} feed-forward matrix", bytes_each=512 * 4)
Positions = bounded(TOKENS_LIMIT, tensor="a {n} × 512 position table", bytes_each=512 * 4)
Vocabulary = bounded(TOKENS_LIMIT, least=100, tensor="a {n}-word × 512 embedding", bytes_each=512 * 4)
Context = bounded(TOKENS_LIMIT, least=2, tensor="a {n}-token block × 512 wide", bytes_each=512 * 4)
Layers = bounded(COUNT_LIMIT, tensor="{n} layers of 512 wide", bytes_each=12 * 512 * 512 * 4)
Heads = bounded(COUNT_LIMIT)
Beams = bounded(COUNT_LIMIT, tensor="{n} beams × 256 tokens × 8000-word scores", bytes_each=256 * 8000 * 4)
Rank = bounded(WIDTH_LIMIT, tensor="a {n} × 512 projection per head", bytes_each=512 * 4)
Hidden = bounded(WIDTH_LIMIT, tensor="a {n} × 512 hidden layer per head", bytes_each=512 * 4)
# a centroid count is bounded by the training tokens too (the cluster stage's check against its store)
Centroids = bounded(TOKENS_LIMIT, least=2, tensor="{n} centroids × 256 tokens per head", bytes_each=256 * 4)
BatchSize = bounded(BATCH_LIMIT, tensor="{n} sequences × 256 tokens × 512 wide", bytes_each=256 * 512 * 4)
Tokens = bounded(TOKENS_LIMIT)
NonNegativeTokens = bounded(TOKENS_LIMIT, least=0)
Count = bounded(COUNT_LIMIT)
Steps = bounded(STEPS_LIMIT)
NonNegativeSteps = bounded(STEPS_LIMIT, least=0)
Examples = bounded(EXAMPLES_LIMIT)


class Section(BaseModel):
    """Every section rejects unknown keys so a typo never passes silently, and converts no types.

    Strict mode holds for nested sections given as mappings, list items and dict values too; only an int
    is taken for a float, and no float is NaN or infinite (a rate, a margin or a temperature of ``.nan``
    would pass every range check and train or score garbage).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# ----------------------------------------------------------------------------------------------------------
# prepare


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


class Prepare(Section):
    """A translation corpus of sentence pairs, or (``task`` lm / mlm) a corpus of ``context``-token blocks
    cut from long documents: chapters of ``sword.modules``, or the articles of ``hf.text_column``."""

    task: Literal["translation", "lm", "mlm"] = "translation"
    source: Literal["sword", "text", "hf"] = "sword"
    sword: SwordSource = SwordSource()
    text: TextSource | None = None
    hf: HubSource | None = None
    src_lang: str = "en"
    tgt_lang: str = "es"
    valid_fraction: Fraction = 0.02
    test_fraction: Fraction = 0.02
    split_seed: Seed = 0
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
        if self.task != "translation" and self.source == "text":
            raise ValueError(f"source 'text' reads sentence pairs; allowed for task {self.task!r}: sword, hf")
        if self.task != "translation" and self.source == "hf" and self.hf.text_column is None:
            raise ValueError(f"task {self.task!r} reads documents from a text column; set hf.text_column")
        return self


# ----------------------------------------------------------------------------------------------------------
# training (shared by pretrain and teacher)


class ModelShape(Section):
    """Marian encoder–decoder built from scratch (ignored when ``init`` names a checkpoint)."""

    d_model: ModelWidth = 256
    encoder_layers: Layers = 3
    decoder_layers: Layers = 3
    heads: Heads = 4
    ffn_dim: FeedForward = 1024
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    max_positions: Positions = 256

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelShape:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.heads}")
        return self


class Training(Section):
    max_steps: Steps = 1000
    batch_size: BatchSize = 32
    grad_accumulation: Count = 1
    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 5e-4
    warmup_steps: NonNegativeSteps = 200
    schedule: Literal["inverse_sqrt", "linear", "constant_with_warmup"] = "inverse_sqrt"
    label_smoothing: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0
    grad_clip: Annotated[float, Field(gt=0.0)] = 1.0
    eval_steps: Steps = 250
    save_steps: Steps = 250
    logging_steps: Steps = 50
    seed: Seed = 0


class Evaluation(Section):
    beams: Beams = 4
    max_new_tokens: Tokens = 96
    batch_size: BatchSize = 32
    test_examples: Examples | None = 500
    sparsity_examples: Examples = 200


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


# a store name is a key in dvc.yaml interpolations (${extract.stores.NAME.out}) and in the metrics JSON
STORE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExtractStore(Section):
    """One graph store: which split it reads, which of its sentences, and where it goes."""

    split: Literal["train", "valid", "test"]
    min_length: Tokens = 21
    max_sentences: Examples | None = 10000
    out: str


class Extract(Section):
    """Settings shared by every store, then the stores, extracted in order by one stage run.

    Each split feeds one store at most, so a held-out store never shares a sentence with a training one.
    """

    teacher: str = "artifacts/models/teacher"
    data: str = "artifacts/data"
    kinds: Annotated[list[AttentionKindName], Field(min_length=1)] = ["decoder_self"]
    batch_size: BatchSize = 32
    dtype: Literal["float16", "float32"] = "float16"
    shard_sentences: BatchSize = 512
    seed: Seed = 0
    stores: Annotated[dict[str, ExtractStore], Field(min_length=1)] = {
        "train": ExtractStore(split="train", out="artifacts/graphs/train"),
        "test": ExtractStore(split="test", max_sentences=1000, out="artifacts/graphs/test"),
    }
    metrics: str = "artifacts/metrics/extract.json"

    @model_validator(mode="after")
    def _unique_kinds(self) -> Extract:
        if len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"kinds {self.kinds} lists a kind twice")
        return self

    @model_validator(mode="after")
    def _separate_stores(self) -> Extract:
        for name in self.stores:
            if not STORE_NAME.fullmatch(name):
                raise ValueError(
                    f"store name {name!r} is not a simple identifier (allowed: letters, digits and _, "
                    "not starting with a digit)"
                )
        readers: dict[str, str] = {}
        for name, store in self.stores.items():
            if store.split in readers:
                raise ValueError(
                    f"stores {readers[store.split]!r} and {name!r} both read the {store.split} split; "
                    "allowed: one store per split, so no sentence lands in two stores"
                )
            readers[store.split] = name
        outs = {name: PurePosixPath(os.path.normpath(store.out)) for name, store in self.stores.items()}
        for (a, out_a), (b, out_b) in itertools.combinations(outs.items(), 2):
            if out_a == out_b or out_a in out_b.parents or out_b in out_a.parents:
                raise ValueError(
                    f"stores {a!r} and {b!r} write overlapping folders ({out_a} and {out_b}); "
                    "allowed: distinct folders, neither inside the other"
                )
        return self


class Project(Section):
    """Per-head projections g: d → ``rank``, linear (``hidden`` null) or W tanh(V x + c) + b with V of
    ``hidden`` rows; one map for queries and keys when ``shared``."""

    graphs: str = "artifacts/graphs/train"
    kind: AttentionKindName = "decoder_self"
    rank: Rank = 4
    # the reference code's recipe, which measured best on the default profile: a shared tanh MLP
    shared: bool = True
    hidden: Hidden | None = 32
    epochs: Steps = 3
    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 1e-3
    batch_size: BatchSize = 32
    grad_clip: Annotated[float, Field(gt=0.0)] = 1.0
    omega: Annotated[float, Field(gt=0.0)] = 1.0
    valid_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1
    eval_threshold: Annotated[float, Field(gt=0.0)] = 0.75
    eval_bins: Hidden = 4
    seed: Seed = 0
    out: str = "artifacts/predictors/projections.safetensors"
    metrics: str = "artifacts/metrics/project.json"
    plot: str = "artifacts/plots/project_loss.csv"


def _even(value: int) -> int:
    if value % 2:
        raise ValueError("Reformer's bucket count must be even (argmax over [xR; −xR])")
    return value


EvenBuckets = Annotated[Centroids, AfterValidator(_even)]


class IndexerFits(Section):
    """The τ-indexer states fitted next to the centroids: every rank × fitting (empty lists: none)."""

    ranks: list[Rank] = [2, 4, 8, 16]
    fittings: list[Literal["pca", "distill"]] = ["pca", "distill"]
    # distillation (Adam on the entmax Fenchel–Young loss, starting from the PCA maps)
    epochs: Steps = 3
    lr: Annotated[float, Field(gt=0.0)] = 0.01


class Cluster(Section):
    graphs: str = "artifacts/graphs/train"
    projections: str = "artifacts/predictors/projections.safetensors"
    bucket_counts: Annotated[list[Centroids], Field(min_length=1)] = [
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
    iterations: Steps = 25
    max_points_per_centroid: Examples | None = None
    # the fitted baselines, in the same state file: Routing's spherical centroids, Reformer's rotations
    routing_clusters: list[Centroids] = [2, 4, 8]
    reformer_buckets: list[EvenBuckets] = [2, 4, 8]
    indexer: IndexerFits = IndexerFits()
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


# ----------------------------------------------------------------------------------------------------------
# evaluate and report

OpenFraction = Annotated[float, Field(gt=0.0, lt=1.0)]


def _window_size(value: int) -> int:
    if value < 0 or (value > 0 and value % 2 == 0):
        raise ValueError("a window size must be 0 (none) or odd (|i − j| ≤ w // 2)")
    if value > TOKENS_LIMIT:
        raise ValueError(f"a window wider than any sequence; allowed: ≤ {TOKENS_LIMIT}")
    return value


WindowSize = Annotated[int, AfterValidator(_window_size)]
# the paper's window sizes: 0 (none), 1 (the diagonal), 3, 5, ...
PAPER_WINDOWS = [0, 1, 3, 5, 7, 9, 11, 15, 19, 23, 27]


class Quality(Section):
    """Which grid points are translated, and how: the same beam search and sentences for every point."""

    examples: Examples | None = 100
    beams: Beams = 4
    max_new_tokens: Tokens = 80
    batch_size: BatchSize = 32
    # each method's Pareto points at sparsity >= the teacher's gold sparsity − sparsity_margin
    sparsity_margin: Fraction = 0.1
    points_per_method: bounded(COUNT_LIMIT, least=0) = 1
    # and each method's sparsest setting there with recall >= each of these (its operating point)
    recall_targets: list[Annotated[float, Field(gt=0.0, le=1.0)]] = [0.95, 0.99]
    # students: self-ensembles of S sampled sub-models (SSA students), and training batches timed per model
    ensemble_samples: list[Count] = [1, 4]
    ensemble_seed: Seed = 0
    timing_batches: Count = 5


class Speed(Section):
    """Block tasks: forward (and forward + backward) tokens/s of the model at each of ``contexts``, side by
    side — softmax SDPA, the dense α-entmax teacher, and the teacher on each of ``methods``' predicted graph
    (bucket predictors run on the bucketed kernel, the τ-indexer on the indexed one; with ``certified`` the
    indexer also runs exact, its predicted sets deciding only which key blocks are skipped) — and the share
    of the forward spent in attention.

    A method runs at its sparsest quality point whose perplexity is within ``perplexity_gap`` (a fraction)
    of the teacher's, when that is set and such a point exists; otherwise at its sparsest setting with
    recall ≥ ``recall_target``."""

    contexts: list[Context] = []  # empty: not measured
    methods: Annotated[list[str], Field(min_length=1)] = ["kmeans"]
    certified: bool = True
    recall_target: Annotated[float, Field(gt=0.0, le=1.0)] = 0.95
    perplexity_gap: Annotated[float, Field(ge=0.0)] | None = None
    repeats: Count = 3
    backward: bool = True


# a knob's integer value (buckets, keys, bins, ...) sizes tensors like the section's own counts do
KNOB_LIMIT = TOKENS_LIMIT


def knob_value_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be knob ``key``'s value, or None: knobs are scalars (a number, a string, a
    boolean or null), numbers finite, integers at most :data:`KNOB_LIMIT` (a ``seed`` less than 2³²).

    Shared by the params file's knob grids and the command line's ``--knob`` flags; the predictors check
    each knob's own range when they are built.
    """
    if value is None or isinstance(value, bool | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "must be a finite number"
    if isinstance(value, int):
        limit = 2**32 - 1 if key == "seed" else KNOB_LIMIT
        return None if abs(value) <= limit else f"allowed: at most {limit}"
    return f"allowed: a number, a string, true/false or null, not {YAML_KINDS.get(type(value), 'this')}"


def _checked_knobs(where: str, knobs: dict[str, Any]) -> None:
    """Raise ValueError naming the first knob (``where.KEY``) :func:`knob_value_problem` refuses."""
    for key, value in knobs.items():
        for item in value if isinstance(value, list) else [value]:
            problem = knob_value_problem(key, item)
            if problem:
                raise ValueError(f"{where}.{key} = {short_repr(item)}: {problem}")


class Evaluate(Section):
    graphs: str = "artifacts/graphs/test"
    projections: str = "artifacts/predictors/projections.safetensors"
    state: str = "artifacts/predictors/centroids.safetensors"
    teacher: str = "artifacts/models/teacher"
    data: str = "artifacts/data"
    # per method, lists of knob values (and optionally its own window / global_tokens lists); fitted
    # methods choose among the states in `state`
    methods: Annotated[dict[str, dict[str, list[Any]]], Field(min_length=1)] = {
        "window": {},
        "distance": {"threshold": [0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5, 2.0]},
        "quantization": {"bins": [2, 4, 6, 8, 12], "tokens_per_bin": [None, 4, 8, 12, 16, 20]},
        "kmeans": {"top_k": [1, 2]},
        "bigbird": {"random_keys": [2, 4, 8, 12, 16, 20]},
        "longformer": {"global_random": [4, 8, 12, 16, 20]},
        "reformer": {},
        "routing": {},
        "indexer": {"margin": [0.0, 0.05, 0.1, 0.2, 0.4], "window": [0, 3], "global_tokens": [0]},
    }
    windows: Annotated[list[WindowSize], Field(min_length=1)] = PAPER_WINDOWS
    global_tokens: Annotated[list[NonNegativeTokens], Field(min_length=1)] = [0, 1]
    max_sentences: Examples | None = None
    batch_size: BatchSize = 64
    quality: Quality = Quality()
    speed: Speed = Speed()
    # the folder of the student stages' model folders (each evaluated next to the teacher); null: none
    students: str | None = "artifacts/students"
    out: str = "artifacts/evaluation/evaluate.json"
    # its wall times (forward and decode, per point), kept apart so that evaluate.json is reproducible
    timings: str = "artifacts/evaluation/evaluate.timings.json"

    @model_validator(mode="after")
    def _grids(self) -> Evaluate:
        for method, grid in self.methods.items():
            _checked_knobs(f"methods.{method}", grid)
        for method in self.speed.methods:
            if method not in self.methods:
                raise ValueError(
                    f"speed.methods lists {method!r}, which methods does not evaluate; allowed: "
                    f"{', '.join(self.methods)}"
                )
        return self


class Report(Section):
    evaluation: str = "artifacts/evaluation/evaluate.json"
    timings: str = "artifacts/evaluation/evaluate.timings.json"
    sparsity_levels: Annotated[list[OpenFraction], Field(min_length=1)] = [0.8, 0.9]
    recall_target: Annotated[float, Field(gt=0.0, le=1.0)] = 0.95
    out: str = "artifacts/report.md"
    plots: str = "artifacts/plots/report"
    metrics: str = "artifacts/metrics/report.json"

    @model_validator(mode="after")
    def _unique_levels(self) -> Report:
        if len(set(self.sparsity_levels)) != len(self.sparsity_levels):
            raise ValueError(f"sparsity_levels {self.sparsity_levels} lists a level twice")
        return self


# ----------------------------------------------------------------------------------------------------------
# students: the teacher fine-tuned with a sparse attention, distilled from the teacher


class Distillation(Section):
    """loss = (1 − weight) · CE(labels) + weight · T² · KL(teacher_T ‖ student_T) per target token."""

    weight: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    temperature: Annotated[float, Field(gt=0.0)] = 2.0


class Configure(Section):
    """The teacher with a learned predictor's graph in its attention (``sparsefinder configure``)."""

    teacher: str = "artifacts/models/teacher"
    projections: str = "artifacts/predictors/projections.safetensors"
    state: str = "artifacts/predictors/centroids.safetensors"
    method: str = "kmeans"
    knobs: dict[str, Any] = {"buckets": 8, "top_k": 1}
    window: WindowSize = 0
    global_tokens: NonNegativeTokens = 0
    out: str = "artifacts/models/sparsefinder"

    @model_validator(mode="after")
    def _knob_values(self) -> Configure:
        _checked_knobs("knobs", self.knobs)
        return self


# the self-attention kinds a student's attention replaces (cross-attention stays dense)
SelfKinds = Annotated[list[Literal["encoder_self", "decoder_self"]], Field(min_length=1)]


class StudentInstance(Section):
    """What one student starts from (a model folder, loaded with the attention its manifest names) and
    writes; every instance needs its own outputs."""

    init: str
    out: str
    run_dir: str
    metrics: str


class SparsefinderStudent(StudentInstance):
    """Fine-tunes a ``sparsefinder`` folder (the ``configure`` stage's): the teacher restricted to the
    predicted graph, so that it adapts to the recall it actually gets."""

    attention: Literal["sparsefinder"] = "sparsefinder"
    init: str = "artifacts/models/sparsefinder"


class SsaStudent(StudentInstance):
    """Stochastically subsampled self-attention in training; dense (or a self-ensemble) at evaluation."""

    attention: Literal["ssa"] = "ssa"
    init: str = "artifacts/models/teacher"
    mode: Literal["unbiased", "local"] = "local"
    keys: Tokens = 16  # unbiased: keys kept per layer and step
    windows: Tokens = 2  # locally biased: windows per sequence
    # locally biased: the local bias's standard deviation per layer; one value stands for every layer
    sigma: Annotated[list[Annotated[float, Field(gt=0.0)]], Field(min_length=1)] = [4.0]
    kinds: SelfKinds = ["encoder_self", "decoder_self"]
    # "+FT": the last fraction of the steps trains with dense attention
    dense_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0


class SbmStudent(StudentInstance):
    """SBM-Transformer: each head samples its attention graph from a learned stochastic block model
    (cluster memberships of queries and keys, a block matrix); straight-through gradients, a density
    regulariser."""

    attention: Literal["sbm"] = "sbm"
    init: str = "artifacts/models/teacher"
    clusters: Hidden = 8  # cluster embeddings per head
    kinds: SelfKinds = ["encoder_self", "decoder_self"]
    density_weight: Annotated[float, Field(ge=0.0)] = 1e-4  # λ: loss + λ · mean sampled density
    # sequences longer than this draw edges with the sub-quadratic sampler (no n × n probability matrix)
    sparse_above: Tokens = 256
    # evaluation graph: "sampled" draws from the model with a fixed seed (the distribution it trained
    # on); "expected" keeps the edges with p ≥ threshold
    evaluation: Literal["sampled", "expected"] = "sampled"
    threshold: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    seed: Seed = 0


class SamsaStudent(StudentInstance):
    """SAMSA: each head attends the k keys of highest learned importance (differentiable top-k) plus 2k
    learned support keys and values; Gumbel noise in training only."""

    attention: Literal["samsa"] = "samsa"
    init: str = "artifacts/models/teacher"
    keys: Tokens = 8  # k: keys of the sequence each head selects
    temperature: Annotated[float, Field(gt=0.0)] = 1.0  # τ of the soft top-k proxy
    kinds: SelfKinds = ["encoder_self", "decoder_self"]


def _pattern_of(stack: Stack) -> AfterValidator:
    def check(text: str) -> str:
        parse_pattern(text, stack, cross=None)  # whether the decoder reads an encoder is the model's
        return text

    return AfterValidator(check)


# PAR patterns as written ('(sff)x2 (f)x2'): s self-attention, f feed-forward, c cross-attention (decoder)
EncoderPattern = Annotated[str, _pattern_of("encoder")]
DecoderPattern = Annotated[str, _pattern_of("decoder")]


class ParStudent(StudentInstance):
    """PAR: the teacher's stacks rebuilt to a pattern of sublayers (``s`` self-attention, ``f``
    feed-forward, ``c`` the decoder's cross-attention), distilled like every student. From the teacher
    with a pattern per stack it has (an encoder–decoder's ``encoder`` and ``decoder``, a decoder-only LM's
    ``decoder``), or from a ``par_search`` folder, which holds its searched patterns (give none)."""

    attention: Literal["par"] = "par"
    init: str = "artifacts/models/par-searched"
    encoder: EncoderPattern | None = None
    decoder: DecoderPattern | None = None

    @model_validator(mode="after")
    def _decoder_with_encoder(self) -> ParStudent:
        if self.encoder is not None and self.decoder is None:
            raise ValueError(
                "give both encoder and decoder patterns (init: an encoder–decoder teacher), the decoder "
                "pattern alone (a decoder-only teacher), or none (init: a par_search folder)"
            )
        if self.encoder is not None:  # an encoder–decoder: its decoder reads the encoder
            try:
                parse_pattern(self.decoder, "decoder", cross=True)
            except ValueError as err:
                raise ValueError(f"decoder = {self.decoder!r}: {err}") from None
        return self


class EntmaxStudent(StudentInstance):
    """The control: the teacher fine-tuned and distilled exactly like the others, with its own dense
    α-entmax, so that a sparse student's gap to it is the cost of its sparsity alone, not of the extra
    training."""

    attention: Literal["entmax"] = "entmax"
    init: str = "artifacts/models/teacher"


StudentSpec = Annotated[
    SparsefinderStudent | SsaStudent | SbmStudent | SamsaStudent | ParStudent | EntmaxStudent,
    Field(discriminator="attention"),
]
# an instance name is a DVC foreach key (student@NAME) and part of file names
STUDENT_NAME = re.compile(r"[a-z][a-z0-9_-]*")


class Student(Section):
    teacher: str = "artifacts/models/teacher"
    data: str = "artifacts/data"
    distill: Distillation = Distillation()
    train: Training = Training(max_steps=200, lr=2e-4, warmup_steps=20)
    eval: Evaluation = Evaluation()
    instances: Annotated[dict[str, StudentSpec], Field(min_length=1)] = {
        name: kind(
            out=f"artifacts/students/{name}",
            run_dir=f"artifacts/runs/student-{name}",
            metrics=f"artifacts/metrics/student_{name}.json",
        )
        for name, kind in {
            "sparsefinder": SparsefinderStudent,
            "ssa": SsaStudent,
            "sbm": SbmStudent,
            "samsa": SamsaStudent,
            "par": ParStudent,
            "dense": EntmaxStudent,
        }.items()
    }

    @model_validator(mode="after")
    def _instances(self) -> Student:
        for name in self.instances:
            if not STUDENT_NAME.fullmatch(name):
                raise ValueError(
                    f"student name {name!r}: allowed are lower-case letters, digits, '_' and '-', "
                    "starting with a letter"
                )
        for key in ("out", "run_dir", "metrics"):
            paths = [getattr(spec, key) for spec in self.instances.values()]
            if len(set(paths)) != len(paths):
                raise ValueError(f"two students share one {key} path; every student needs its own")
        return self

    def run(self, name: str) -> StudentRun:
        """Everything student ``name`` trains with, flat like a ``teacher`` section."""
        spec = self.instances[name]
        shared = self.model_dump(exclude={"instances"})
        return StudentRun(
            name=name, spec=spec, out=spec.out, run_dir=spec.run_dir, metrics=spec.metrics, **shared
        )


class StudentRun(Section):
    """One student's settings: the shared ones and its instance (what its run fingerprint covers)."""

    # built from validated values, not YAML
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str
    teacher: str
    data: str
    distill: Distillation
    train: Training
    eval: Evaluation
    spec: StudentSpec
    out: str
    run_dir: str
    metrics: str


class ParArchitecture(Section):
    """How the supernet's mixing parameters θ learn (the PAR paper's search: lr 1e-2, weight decay 5e-4,
    θ held uniform while the blocks first adapt to being mixed)."""

    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 1e-2
    weight_decay: Annotated[float, Field(ge=0.0)] = 5e-4
    frozen_steps: NonNegativeSteps = 50  # θ stays at its start (uniform) for the first steps
    temperature: Annotated[float, Field(gt=0.0)] = 1.0  # τ of the Gumbel-softmax


class ParSearch(Section):
    """PAR's architecture search: a supernet from the teacher, distilled from it; the most probable choice
    per position becomes the searched model (``out``, the teacher's blocks rearranged), with the mixing
    weights in ``mixing`` and ``plot``."""

    teacher: str = "artifacts/models/teacher"
    data: str = "artifacts/data"
    distill: Distillation = Distillation()
    # the blocks' settings (the paper: weight decay 1e-4); the seed also draws blocks beyond the teacher's
    train: Training = Training(max_steps=200, lr=2e-4, warmup_steps=20, weight_decay=1e-4)
    architecture: ParArchitecture = ParArchitecture()
    eval: Evaluation = Evaluation()  # the searched model's generation settings
    run_dir: str = "artifacts/runs/par-search"
    out: str = "artifacts/models/par-searched"
    mixing: str = "artifacts/par/mixing.json"
    plot: str = "artifacts/plots/par_search.png"
    metrics: str = "artifacts/metrics/par_search.json"

    @model_validator(mode="after")
    def _frozen_within_training(self) -> ParSearch:
        if self.architecture.frozen_steps >= self.train.max_steps:
            raise ValueError(
                f"architecture.frozen_steps {self.architecture.frozen_steps} leaves no step of the "
                f"{self.train.max_steps} to search in; allowed: fewer than train.max_steps"
            )
        return self


SECTIONS: dict[str, type[Section]] = {
    "prepare": Prepare,
    "pretrain": Pretrain,
    "teacher": Teacher,
    "extract": Extract,
    "project": Project,
    "cluster": Cluster,
    "evaluate": Evaluate,
    "configure": Configure,
    "par_search": ParSearch,
    "student": Student,
    "report": Report,
}


# ----------------------------------------------------------------------------------------------------------
# loading

MERGE_TAG = "tag:yaml.org,2002:merge"
MICRO_PROFILE = "configs/micro.yaml"
# the profiles nest 5 levels deep and hold a few hundred values
MAX_DEPTH = 100
MAX_NODES = 100_000


def _dotted(where: str, part: object) -> str:
    return f"{where}.{part}" if where else str(part)


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, except that a key given twice in one mapping is an error, that floats
    are YAML 1.2's (``1e-3`` too), and that a document nested deeper than ``MAX_DEPTH`` levels or whose
    aliases expand past ``MAX_NODES`` values is an error (PyYAML would overflow the stack composing the
    first, and anything that walks the second, validation or an error message, would never finish)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        # composing recurses once per level: count the levels before Python's own limit is reached
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise ComposerError(
                    problem=f"line {line}: nested deeper than {MAX_DEPTH} levels; allowed: {MAX_DEPTH} at "
                    "most"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node)
        # checked on the composed nodes, before construction: PyYAML expands `<<` merges by rewriting the
        # merged mapping nodes in place, after which a legitimate override looks like a duplicate
        stack: list[tuple[yaml.Node, str]] = [(node, "")]
        seen: set[yaml.Node] = set()
        while stack:
            current, where = stack.pop()
            if current in seen:  # an alias shares its anchor's node (and may even contain itself)
                continue
            seen.add(current)
            if isinstance(current, yaml.MappingNode):
                stack.extend(self._unique_children(current, where))
            elif isinstance(current, yaml.SequenceNode):
                stack.extend((item, _dotted(where, i)) for i, item in enumerate(current.value))
        return super().construct_document(node)

    def _unique_children(self, mapping: yaml.MappingNode, where: str) -> list[tuple[yaml.Node, str]]:
        """The values of ``mapping`` with their dotted keys; raise if one key is given twice."""
        first_line: dict[Any, int] = {}
        children = []
        for key_node, value_node in mapping.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                # merges may override; a non-scalar key cannot be hashed, and construction says so
                children.append((value_node, where))
                continue
            key = self.construct_object(key_node)
            dotted = _dotted(where, key)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise ConstructorError(
                    problem=f"line {line}: key {dotted} is given twice, first on line {first_line[key]}; "
                    "allowed: each key once per mapping"
                )
            first_line[key] = line
            children.append((value_node, dotted))
        return children


def _check_expansion(root: yaml.Node) -> None:
    """Raise unless the document under ``root``, every alias expanded, holds at most ``MAX_NODES`` values
    nested at most ``MAX_DEPTH`` deep (a node that contains itself expands without end).

    An alias is its anchor's node object, so the composed document is a graph whose size stays small while
    its expansion grows exponentially ("billion laughs"); sizes and depths are summed over that graph,
    each node once, without recursion.
    """
    size: dict[yaml.Node, int] = {}
    depth: dict[yaml.Node, int] = {}
    open_nodes: set[yaml.Node] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if children_done:
            open_nodes.discard(node)
            size[node] = 1 + sum(size[child] for child in children)
            depth[node] = 1 + max((depth[child] for child in children), default=0)
            line = node.start_mark.line + 1
            if size[node] > MAX_NODES:
                raise ConstructorError(
                    problem=f"line {line}: more than {MAX_NODES} values once its aliases are expanded; "
                    f"allowed: {MAX_NODES} at most"
                )
            if depth[node] > MAX_DEPTH:
                raise ConstructorError(
                    problem=f"line {line}: nested deeper than {MAX_DEPTH} levels once its aliases are "
                    f"expanded; allowed: {MAX_DEPTH} at most"
                )
            continue
        if node in size:
            continue
        if node in open_nodes:
            raise ConstructorError(
                problem=f"line {node.start_mark.line + 1}: an alias refers to a node that contains it; "
                "allowed: aliases of finished nodes"
            )
        open_nodes.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child in children if child not in size)


# YAML 1.2 floats: an exponent needs neither a dot nor a sign (PyYAML's YAML 1.1 rule reads `1e-3` as text)
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str) -> Any:
    """``text`` read as the params file is (:class:`UniqueKeyLoader`); raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=UniqueKeyLoader)


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> Any:
    """:func:`parse_yaml`, remembered: a run reads one file many times (every section, every stage's
    outputs), and PyYAML takes a good part of a second for a profile. Callers get a deep copy."""
    return parse_yaml(text)


def yaml_problem(err: yaml.YAMLError) -> str:
    """What a YAML error says went wrong, and on which line, cut to a readable length."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if problem and mark is not None:
        text = f"line {mark.line + 1}: {problem}"
    else:
        text = problem or (str(err).splitlines() or [type(err).__name__])[0]
    return short_repr(text, limit=200, quote=False)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path}: params file not found (pass --params FILE or create params.yaml)")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); allowed: a UTF-8 "
            "YAML file"
        ) from None
    try:
        data = copy.deepcopy(_parsed(text)) or {}
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({yaml_problem(err)})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _missing(path: Path, name: str) -> UserError:
    return UserError(
        f"{path}: no {name!r} section (every stage reads its own section; see {MICRO_PROFILE} for a "
        "complete example)"
    )


# YAML's names for what it gave, so `'4'` or `true` in a number's place reads as what it is
YAML_KINDS: dict[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    list: "a list",
    dict: "a mapping",
    type(None): "null",
}
# a number that YAML gave as text, because it was quoted
NUMBER_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


# reprs cut while they are made: a value may be huge (a list of a million items), and only its start is read
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 3, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40
REPR_LIMIT = 80


def short_repr(value: Any, *, limit: int = REPR_LIMIT, quote: bool = True) -> str:
    """``repr(value)`` (``str`` if not ``quote``) on one line of at most ``limit`` characters, cut by "…"."""
    text = _REPR.repr(value) if quote else str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _got(error_type: str, value: Any) -> str:
    """What YAML gave instead of the expected type, in YAML's words, and how to write a number as one."""
    got = f"got {YAML_KINDS.get(type(value), type(value).__name__)}"
    if error_type in {"int_type", "float_type"} and isinstance(value, str) and NUMBER_TEXT.fullmatch(value):
        return f"{got} (write numbers unquoted)"
    return got


def _one_line(path: Path, section: str, err: ValidationError) -> str:
    first = err.errors()[0]
    key = short_repr(".".join(str(part) for part in (section, *first["loc"])), limit=120, quote=False)
    if first["type"] == "extra_forbidden":
        allowed = ", ".join(SECTIONS[section].model_fields) if len(first["loc"]) == 1 else None
        hint = f"unknown key (allowed: {allowed})" if allowed else "unknown key"
        return f"{path}: {key}: {hint}"
    msg = short_repr(first["msg"].removeprefix("Value error, "), limit=400, quote=False)
    if first["type"].endswith("_type"):
        msg = f"{msg}, {_got(first['type'], first['input'])}"
    if first["type"] in {"missing"} or first["loc"] == ():
        return f"{path}: {key}: {msg}"
    return f"{path}: {key} = {short_repr(first['input'])}: {msg}"


def validate_section(name: str, raw: Any, path: Path = Path("params.yaml")) -> Section:
    """Validate the mapping ``raw`` as section ``name`` (``None``: all defaults); raise :class:`UserError`
    (one line) if bad."""
    if name not in SECTIONS:
        raise UserError(f"{path}: unknown section {name!r} (allowed: {', '.join(SECTIONS)})")
    try:
        return SECTIONS[name].model_validate(raw if raw is not None else {})
    except ValidationError as err:
        raise UserError(_one_line(path, name, err)) from None


def load_section(name: str, path: str | os.PathLike = "params.yaml") -> Any:
    """Read ``path`` and return its validated section ``name``, which must be present (defaults fill absent
    keys)."""
    path = Path(path)
    data = _read_yaml(path)
    if name in SECTIONS and name not in data:
        raise _missing(path, name)
    return validate_section(name, data.get(name), path)


def load_all(path: str | os.PathLike = "params.yaml") -> dict[str, Section]:
    """Validate every section of ``path``: an unknown or a missing section is an error, reported before any
    value."""
    path = Path(path)
    data = _read_yaml(path)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise UserError(f"{path}: unknown section {unknown[0]!r} (allowed: {', '.join(SECTIONS)})")
    missing = [name for name in SECTIONS if name not in data]
    if missing:
        raise _missing(path, missing[0])
    return {name: validate_section(name, data[name], path) for name in SECTIONS}
