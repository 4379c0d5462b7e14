"""Fit predictors on the training sentences of a graph store, layer by layer, and score them held out.

Every predictor is fitted on the same training split the projections were trained on, and scored (no window,
no global tokens: the predictor alone) on the held-out split they never saw. The projected training batches
of a layer are read once and shared by every predictor fitted there.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from pipeline.graphs.store import GraphStore
from pipeline.predictors.base import Predictor
from pipeline.predictors.metrics import summarize
from pipeline.predictors.scoring import Setting, layer_inputs, score_settings
from pipeline.projection.model import HeadProjections


def fit_predictors(
    store: GraphStore,
    kind: str,
    predictors: Sequence[Predictor],
    projections: Mapping[int, HeadProjections],
    split: Mapping[str, Sequence[int]],
    *,
    seed: int,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Fit every predictor on each layer of ``projections`` (``split["train"]``); score on ``split["valid"]``.

    Returns a JSON-ready report: per layer, each predictor's fit time and held-out scores.
    """
    layers = []
    for layer, module in tqdm(sorted(projections.items()), desc="fit predictors", unit="layer"):
        train = [
            inputs
            for inputs, _ in layer_inputs(
                store, kind, layer, split["train"], projections=module, batch_size=batch_size
            )
        ]
        seconds = {}
        for predictor in tqdm(predictors, desc=f"layer {layer}", unit="predictor", leave=False):
            started = time.perf_counter()
            predictor.fit(layer, train, seed)
            seconds[predictor.state_key()] = round(time.perf_counter() - started, 3)
        scores = score_settings(
            store,
            kind,
            layer,
            [Setting(p) for p in predictors],
            split["valid"],
            projections=module,
            batch_size=batch_size,
        )
        layers.append(
            {
                "layer": layer,
                "predictors": [
                    {
                        "predictor": p.describe(),
                        "fit_seconds": seconds[p.state_key()],
                        "held_out": summarize([sums]),
                    }
                    for p, sums in zip(predictors, scores, strict=True)
                ],
            }
        )
    return {"kind": kind, "layers": layers}
