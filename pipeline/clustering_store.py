"""Fit and score k-means centroids for every layer of a graph store, in the learned projected space.

The file format (``save_centroids`` / ``load_centroids``): one safetensors file, tensors named
``layer{L}.centroids{B}`` of float32 (heads, B, r), and JSON metadata under ``"centroids"``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.atomic import atomic_path
from pipeline.clustering import fit_layer_centroids, resolve_backend
from pipeline.errors import UserError
from pipeline.graphs.batches import iter_batches
from pipeline.graphs.store import GraphStore
from pipeline.params import Cluster
from pipeline.predictors.kmeans import kmeans_mask
from pipeline.predictors.metrics import GraphScoreSums, graph_scores, summarize
from pipeline.projection.model import HeadProjections

METADATA_KEY = "centroids"


def save_centroids(
    path: str | os.PathLike, centroids: dict[int, dict[int, torch.Tensor]], meta: dict
) -> None:
    """Write ``{layer: {B: (heads, B, r)}}`` atomically."""
    tensors = {
        f"layer{layer}.centroids{b}": c.contiguous()
        for layer, by_b in centroids.items()
        for b, c in by_b.items()
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={METADATA_KEY: json.dumps(meta)})


def load_centroids(path: str | os.PathLike, layer: int, n_clusters: int) -> torch.Tensor:
    """float32 (heads, B, r) centroids of ``layer`` for B = ``n_clusters``."""
    name = f"layer{layer}.centroids{n_clusters}"
    with safe_open(str(path), framework="pt") as handle:
        if name not in handle.keys():  # noqa: SIM118 (safe_open has keys() but no __contains__)
            available = ", ".join(sorted(handle.keys())) or "none"
            raise UserError(
                f"{path} has no {name} (layer {layer}, {n_clusters} buckets); it has: {available}"
            )
        return handle.get_tensor(name).float()


@torch.no_grad()
def _projected(store: GraphStore, kind: str, layer: int, module: HeadProjections, indices: list[int]):
    """Projected queries/keys of ``indices`` padded to one length: (S, H, n, r), (S, H, m, r), masks."""
    batches = list(iter_batches(store, kind=kind, layer=layer, indices=indices, batch_size=256))
    n = max(b["q"].shape[2] for b in batches)
    m = max(b["k"].shape[2] for b in batches)
    qs, ks, qv, kv = [], [], [], []
    for b in batches:
        q_proj, k_proj = module(b["q"], b["k"])
        qs.append(torch.nn.functional.pad(q_proj, (0, 0, 0, n - q_proj.shape[2])))
        ks.append(torch.nn.functional.pad(k_proj, (0, 0, 0, m - k_proj.shape[2])))
        qv.append(torch.nn.functional.pad(b["q_valid"], (0, n - q_proj.shape[2])))
        kv.append(torch.nn.functional.pad(b["k_valid"], (0, m - k_proj.shape[2])))
    return torch.cat(qs), torch.cat(ks), torch.cat(qv), torch.cat(kv)


@torch.no_grad()
def held_out_scores(
    store: GraphStore,
    kind: str,
    layer: int,
    module: HeadProjections,
    centroids: torch.Tensor,
    top_k: int,
    indices,
) -> GraphScoreSums:
    """Score sums of the k-means predictor on held-out sentences (no window, no global pattern)."""
    sums = GraphScoreSums.zeros(store.heads)
    for batch in iter_batches(store, kind=kind, layer=layer, indices=indices, batch_size=64):
        q_proj, k_proj = module(batch["q"], batch["k"])
        pred = kmeans_mask(q_proj, k_proj, centroids, top_k, batch["q_valid"], batch["k_valid"])
        sums = sums + graph_scores(
            pred, batch["gold"], batch["q_valid"], batch["k_valid"], causal=store.causal(kind)
        )
    return sums


def fit_store_centroids(
    store: GraphStore, layers: dict[int, HeadProjections], extra: dict[str, Any], params: Cluster
) -> tuple[dict[int, dict[int, torch.Tensor]], dict[str, Any]]:
    """Centroids ``{layer: {B: (heads, B, r)}}`` fitted on the projections' training split, and a report."""
    kind, split = extra["kind"], extra["split"]
    backend = resolve_backend(params.backend)
    centroids, report_layers = {}, []
    for layer, module in sorted(layers.items()):
        q_proj, k_proj, q_valid, k_valid = _projected(store, kind, layer, module, split["train"])
        started = time.perf_counter()
        centroids[layer] = fit_layer_centroids(
            q_proj,
            k_proj,
            q_valid,
            k_valid,
            params.bucket_counts,
            seed=params.seed,
            backend=backend,
            n_iter=params.iterations,
            max_points_per_centroid=params.max_points_per_centroid,
        )
        seconds = time.perf_counter() - started
        held_out = {
            str(b): summarize([held_out_scores(store, kind, layer, module, c, params.top_k, split["valid"])])
            for b, c in centroids[layer].items()
        }
        report_layers.append({"layer": layer, "fit_seconds": round(seconds, 3), "held_out": held_out})
    report = {"kind": kind, "backend": backend, "top_k": params.top_k, "layers": report_layers}
    return centroids, report
