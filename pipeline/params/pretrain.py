"""The ``pretrain`` section: a softmax model from scratch, or fine-tuned from a named checkpoint."""

from __future__ import annotations

from pydantic import model_validator

from pipeline.params.base import Section
from pipeline.params.training import Evaluation, ModelShape, Training, UnigramMargin


class Pretrain(Section):
    init: str | None = None
    model: ModelShape = ModelShape()
    train: Training = Training()
    eval: Evaluation = Evaluation()
    # the validation loss must lie this fraction below the unigram entropy of the training labels (null:
    # not checked)
    unigram_margin: UnigramMargin | None = 0.1
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
