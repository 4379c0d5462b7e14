"""The ``report`` section: the Pareto fronts, figures and markdown report from the evaluation."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from pipeline.params.base import Section

OpenFraction = Annotated[float, Field(gt=0.0, lt=1.0)]


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
