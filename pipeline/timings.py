"""Metrics files without wall-clock times: run facts go to a file of their own beside them.

A stage's metrics must be a function of its inputs, so that re-running an unchanged stage rewrites them
byte for byte and ``dvc status`` stays clean. Wall times and throughputs are not: every key named
``*seconds`` or ``*_per_second`` is moved, at any depth, to ``NAME.timings.json`` beside ``NAME.json``,
with the torch thread count they were measured with. Git ignores that file; DVC tracks it (uncached) only
where a later stage reads it: the evaluation's, named in params, feeds the report's speed columns.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pipeline.atomic import write_json

TIMING_KEY = re.compile(r"(^|_)seconds$|_per_second$")
# keys that say which row a timing belongs to, copied into the timings file beside it
IDENTITY_KEYS = ("layer", "label", "predictor", "student", "samples", "model", "context")


def timings_path(metrics: str | os.PathLike) -> Path:
    """``dir/NAME.timings.json`` for the metrics file ``dir/NAME.json``."""
    metrics = Path(metrics)
    return metrics.with_name(f"{metrics.stem}.timings.json")


def metrics_files(metrics: str | os.PathLike) -> tuple[Path, Path]:
    """(the metrics file, its timings file): what :func:`write_metrics` writes, for staging them as one."""
    return Path(metrics), timings_path(metrics)


def split_timings(value: Any) -> tuple[Any, Any]:
    """(``value`` without its timing keys, those keys in the same nesting, or ``None`` if it has none)."""
    if isinstance(value, dict):
        kept, timed = {}, {}
        for key, item in value.items():
            if TIMING_KEY.search(str(key)):
                timed[key] = item
                continue
            kept[key], inner = split_timings(item)
            if inner is not None:
                timed[key] = inner
        if timed:
            timed = {key: value[key] for key in IDENTITY_KEYS if key in value} | timed
        return kept, timed or None
    if isinstance(value, list):
        pairs = [split_timings(item) for item in value]
        timed = [inner for _, inner in pairs]
        return [kept for kept, _ in pairs], None if all(t is None for t in timed) else timed
    return value, None


def merge_timings(value: Any, timed: Any) -> Any:
    """The inverse of :func:`split_timings`: ``value`` with the timing keys of ``timed`` put back."""
    if isinstance(value, dict) and isinstance(timed, dict):
        merged = {key: merge_timings(item, timed.get(key)) for key, item in value.items()}
        return merged | {key: item for key, item in timed.items() if TIMING_KEY.search(str(key))}
    if isinstance(value, list) and isinstance(timed, list) and len(timed) == len(value):
        return [merge_timings(item, inner) for item, inner in zip(value, timed, strict=True)]
    return value


def write_metrics(
    path: str | os.PathLike, metrics: dict[str, Any], timings: str | os.PathLike | None = None
) -> None:
    """Write ``metrics`` to ``path`` without its timings, and the timings to ``timings`` (by default
    :func:`timings_path`)."""
    import torch  # here, so readers of metrics (the report) do not pay for importing torch

    kept, timed = split_timings(metrics)
    write_json(path, kept)
    write_json(timings or timings_path(path), {"torch_threads": torch.get_num_threads(), **(timed or {})})
