"""The ``report`` section: the Pareto fronts, figures and markdown report from the evaluation."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from pipeline.params.base import Section

OpenFraction = Annotated[float, Field(gt=0.0, lt=1.0)]
Tolerance = Annotated[float, Field(ge=0.0)]


class Tolerances(Section):
    """How close to its reference a difference's whole 95 % interval must stay for the report to say a model
    keeps the reference's quality: BLEU and chrF in points, perplexity relative (0.01 = 1 %), KL in nats per
    token, top-1 agreement and mlm accuracy as fractions of the tokens."""

    bleu: Tolerance = 0.5
    chrf: Tolerance = 0.5
    perplexity: Tolerance = 0.01
    kl: Tolerance = 0.01
    agreement: Tolerance = 0.01
    accuracy: Tolerance = 0.01


class Report(Section):
    evaluation: str = "artifacts/evaluation/evaluate.json"
    timings: str = "artifacts/evaluation/evaluate.timings.json"
    evidence: str = "artifacts/evaluation/quality.json"
    sparsity_levels: Annotated[list[OpenFraction], Field(min_length=1)] = [0.8, 0.9]
    recall_target: Annotated[float, Field(gt=0.0, le=1.0)] = 0.95
    tolerances: Tolerances = Tolerances()
    out: str = "artifacts/report.md"
    plots: str = "artifacts/plots/report"
    metrics: str = "artifacts/metrics/report.json"
    # the Results table, one small JSON per row, so that `dvc metrics show` prints one line per model
    results: str = "artifacts/metrics/results"

    @model_validator(mode="after")
    def _unique_levels(self) -> Report:
        if len(set(self.sparsity_levels)) != len(self.sparsity_levels):
            raise ValueError(f"sparsity_levels {self.sparsity_levels} lists a level twice")
        return self
