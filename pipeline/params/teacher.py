"""The ``teacher`` section: a checkpoint fine-tuned with α-entmax attention."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from pipeline.params.base import Section
from pipeline.params.training import Evaluation, Training, UnigramMargin


class Teacher(Section):
    init: str = "artifacts/models/pretrain"
    alpha: Annotated[float, Field(ge=1.0, le=4.0)] = 1.5
    learn_alpha: bool = False
    train: Training = Training(max_steps=300, lr=2e-4, warmup_steps=50)
    eval: Evaluation = Evaluation()
    # the validation loss must lie this fraction below the unigram entropy of the training labels (null:
    # not checked)
    unigram_margin: UnigramMargin | None = 0.1
    data: str = "artifacts/data"
    out: str = "artifacts/models/teacher"
    run_dir: str = "artifacts/runs/teacher"
    metrics: str = "artifacts/metrics/teacher.json"

    @model_validator(mode="after")
    def _learned_alpha_above_one(self) -> Teacher:
        if self.learn_alpha and self.alpha <= 1.0:
            raise ValueError(f"learn_alpha = true needs alpha > 1 to start from, got alpha = {self.alpha}")
        return self
