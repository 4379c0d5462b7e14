"""The ``project`` section: the per-head low-rank projections of queries and keys."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pipeline.params.base import AttentionKindName, BatchSize, Hidden, Rank, Section, Seed, Steps


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
