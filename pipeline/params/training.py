"""What the training stages share: the model's shape, the training and generation settings, and the
distillation loss (pretrain, teacher, the students, PAR's search; the models and the trainer read them
too)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.params.base import (
    BatchSize,
    Beams,
    Count,
    Examples,
    FeedForward,
    Heads,
    Layers,
    ModelWidth,
    NonNegativeExamples,
    NonNegativeSteps,
    Positions,
    Section,
    Seed,
    Steps,
    Tokens,
)

# the fraction of the unigram entropy a trained model's validation loss must lie below (0: merely below it)
UnigramMargin = Annotated[float, Field(ge=0.0, lt=1.0)]


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


class Restart(Section):
    """A warm restart of the linear schedule: at ``step`` the rate warms up again to ``lr`` and decays to 0 at
    the next restart or at ``max_steps`` (:mod:`pipeline.training.schedule`)."""

    step: Steps
    lr: Annotated[float, Field(gt=0.0, le=1.0)]


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
    # mlm only: the share of a block's tokens masked for prediction in training (evaluation predicts 15 %)
    mask_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.15
    # linear schedule only: phases after the first, each a fresh warm-up and linear decay from its own peak
    restarts: list[Restart] = []

    def phases(self) -> list[tuple[int, int, float]]:
        """(first step, end step, peak rate) of each phase of the schedule: the run, or its restarts."""
        starts = [0] + [restart.step for restart in self.restarts]
        peaks = [self.lr] + [restart.lr for restart in self.restarts]
        return list(zip(starts, [*starts[1:], self.max_steps], peaks, strict=True))

    @model_validator(mode="after")
    def _restarts_fit(self) -> Training:
        if not self.restarts:
            return self
        if self.schedule != "linear":
            raise ValueError(f"restarts need schedule 'linear', not '{self.schedule}'")
        phases = self.phases()
        if any(end - start <= self.warmup_steps for start, end, _ in phases):
            raise ValueError(
                f"restart steps must increase by more than warmup_steps ({self.warmup_steps}) and stay "
                f"below max_steps ({self.max_steps}): phases {[start for start, _, _ in phases]}"
            )
        return self


class Evaluation(Section):
    beams: Beams = 4
    max_new_tokens: Tokens = 96
    batch_size: BatchSize = 32
    # the first N test units (None: all; 0: none, leaving test quality to the evaluate stage, which scores
    # every model on the whole split the same way)
    test_examples: NonNegativeExamples | None = 500
    sparsity_examples: Examples = 200


class Distillation(Section):
    """loss = (1 − weight) · CE(labels) + weight · T² · KL(teacher_T ‖ student_T) per target token."""

    weight: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    temperature: Annotated[float, Field(gt=0.0)] = 2.0
