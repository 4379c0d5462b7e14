"""The ``evaluate`` section: the predictors' grid on the held-out store, the quality and speed at its best
points, and the students."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from pipeline.params.base import (
    COUNT_LIMIT,
    BatchSize,
    Beams,
    Context,
    Count,
    Examples,
    Fraction,
    NonNegativeTokens,
    Section,
    Seed,
    Tokens,
    WindowSize,
    bounded,
    check_knobs,
)

# the paper's window sizes: 0 (none), 1 (the diagonal), 3, 5, ...
PAPER_WINDOWS = [0, 1, 3, 5, 7, 9, 11, 15, 19, 23, 27]


class Quality(Section):
    """Which grid points are measured, and how: the same decoding and test units for every model (the
    teacher, each point, each student and the dense control), with paired bootstrap intervals over the
    units (``resamples`` draws seeded with ``bootstrap_seed``, shared by every model)."""

    examples: Examples | None = None  # null: the whole test split
    # translation: which models are decoded for BLEU and chrF: "all", or "operating": the teacher, every
    # student and each method's operating point (its sparsest point reaching the first recall target, else
    # its highest-recall one); the other points are measured teacher-forced alone (perplexity, KL, agreement)
    decode: Literal["all", "operating"] = "all"
    beams: Beams = 1
    max_new_tokens: Tokens = 80
    batch_size: BatchSize = 32
    # each method's Pareto points at sparsity >= the teacher's gold sparsity − sparsity_margin
    sparsity_margin: Fraction = 0.1
    points_per_method: bounded(COUNT_LIMIT, least=0) = 1
    # and each method's sparsest setting there with recall >= each of these (its operating point)
    recall_targets: list[Annotated[float, Field(gt=0.0, le=1.0)]] = [0.95, 0.99]
    # students: self-ensembles of S sampled sub-models (SSA students); batches timed per model (a student's
    # training step beside the teacher's, and every model's teacher-forced forward)
    ensemble_samples: list[Count] = [1, 4]
    ensemble_seed: Seed = 0
    timing_batches: Count = 5
    resamples: bounded(100_000, least=100) = 1000
    bootstrap_seed: Seed = 0


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


class Evaluate(Section):
    graphs: str = "artifacts/graphs/test"
    projections: str = "artifacts/predictors/projections.safetensors"
    state: str = "artifacts/predictors/state.safetensors"
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
    # every quality row with its 95 % intervals and paired differences (quality.json), and the test split's
    # references and each row's outputs, one line per sentence, so anyone can recompute them
    evidence: str = "artifacts/evaluation/quality.json"
    hypotheses: str = "artifacts/evaluation/hypotheses"
    # its wall times (forward and decode, per point), kept apart so that evaluate.json is reproducible
    timings: str = "artifacts/evaluation/evaluate.timings.json"

    @model_validator(mode="after")
    def _grids(self) -> Evaluate:
        for method, grid in self.methods.items():
            check_knobs(f"methods.{method}", grid)
        for method in self.speed.methods:
            if method not in self.methods:
                raise ValueError(
                    f"speed.methods lists {method!r}, which methods does not evaluate; allowed: "
                    f"{', '.join(self.methods)}"
                )
        return self
