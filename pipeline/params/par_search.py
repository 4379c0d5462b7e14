"""The ``par_search`` section: PAR's architecture search on the teacher."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from pipeline.params.base import NonNegativeSteps, Section
from pipeline.params.training import Distillation, Evaluation, Training


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
