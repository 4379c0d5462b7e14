"""The ``configure`` section: the teacher with a learned predictor's graph in its attention."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from pipeline.params.base import NonNegativeTokens, Section, WindowSize, check_knobs


class Configure(Section):
    """The teacher with a learned predictor's graph in its attention (``sparsefinder configure``)."""

    teacher: str = "artifacts/models/teacher"
    projections: str = "artifacts/predictors/projections.safetensors"
    state: str = "artifacts/predictors/state.safetensors"
    method: str = "kmeans"
    knobs: dict[str, Any] = {"buckets": 8, "top_k": 1}
    window: WindowSize = 0
    global_tokens: NonNegativeTokens = 0
    out: str = "artifacts/models/sparsefinder"

    @model_validator(mode="after")
    def _knob_values(self) -> Configure:
        check_knobs("knobs", self.knobs)
        return self
