"""Fit every layer's projections on a graph store, holding out a validation part of its sentences."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from pipeline.errors import UserError
from pipeline.graphs.batches import epoch_batches, iter_batches
from pipeline.graphs.store import GraphStore
from pipeline.params.project import Project
from pipeline.predictors.distance import DistancePredictor
from pipeline.predictors.metrics import summarize
from pipeline.predictors.quantization import QuantizationPredictor
from pipeline.predictors.scoring import Setting, score_settings
from pipeline.projection.model import HeadProjections
from pipeline.projection.train import held_out_loss, train_layer_projections


def split_sentences(count: int, valid_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Seeded (train, valid) index lists over ``count`` sentences; valid gets ⌈fraction·count⌉, at least 1."""
    if count < 2:
        raise UserError(f"the graph store has {count} sentence(s); holding some out needs at least 2")
    order = np.random.default_rng(seed).permutation(count)
    n_valid = min(max(1, math.ceil(valid_fraction * count)), count - 1)
    return sorted(order[n_valid:].tolist()), sorted(order[:n_valid].tolist())


def fit_store_projections(
    store: GraphStore, params: Project
) -> tuple[dict[int, HeadProjections], dict[str, Any], list[dict[str, float]]]:
    """Train one :class:`HeadProjections` per layer of ``params.kind`` (linear, or a tanh MLP when
    ``params.hidden`` is set).

    Returns (modules by layer, a JSON-ready report with the split, held-out loss and per-head scores,
    loss curve rows ``{layer, step, loss}``).
    """
    if params.kind not in store.kinds:
        raise UserError(
            f"project.kind = {params.kind!r}: {params.graphs} holds only {', '.join(store.kinds)}"
        )
    causal = store.causal(params.kind)
    train, valid = split_sentences(len(store), params.valid_fraction, params.seed)
    positives = store.edge_counts(params.kind)[:, :, train].sum(axis=(1, 2))  # (layers,)
    settings = [
        Setting(DistancePredictor(params.eval_threshold)),
        Setting(QuantizationPredictor(params.eval_bins)),
    ]
    layers, curve, per_layer = {}, [], []
    for layer in range(store.layers):
        started = time.perf_counter()
        module, losses = train_layer_projections(
            epoch_batches(store, kind=params.kind, layer=layer, indices=train),
            n_heads=store.heads,
            head_dim=store.head_dim,
            causal=causal,
            rank=params.rank,
            shared=params.shared,
            hidden=params.hidden,
            epochs=params.epochs,
            lr=params.lr,
            batch_size=params.batch_size,
            grad_clip=params.grad_clip,
            seed=params.seed,
            omega=params.omega,
        )
        seconds = time.perf_counter() - started
        loss = held_out_loss(
            module,
            iter_batches(store, kind=params.kind, layer=layer, indices=valid, batch_size=params.batch_size),
            causal=causal,
            omega=params.omega,
            seed=params.seed,
        )
        # the projections alone: no window, no global tokens
        distance, quantization = score_settings(
            store, params.kind, layer, settings, valid, projections=module, batch_size=params.batch_size
        )
        layers[layer] = module
        curve += [{"layer": layer, "step": step, "loss": loss} for step, loss in enumerate(losses)]
        per_layer.append(
            {
                "layer": layer,
                "train_loss_last": losses[-1],
                "valid_loss": loss,
                "seconds": round(seconds, 2),
                "positive_pairs_per_second": round(params.epochs * int(positives[layer]) / seconds),
                "distance": summarize([distance]),
                "quantization": summarize([quantization]),
            }
        )
    report = {
        "kind": params.kind,
        "projector": {"rank": params.rank, "shared": params.shared, "hidden": params.hidden},
        "train_sentences": len(train),
        "valid_sentences": len(valid),
        "valid_loss": float(np.mean([row["valid_loss"] for row in per_layer])),
        "layers": per_layer,
    }
    return layers, {"split": {"train": train, "valid": valid}, **report}, curve
