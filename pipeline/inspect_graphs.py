"""Looking into a graph store: summary tables, one head's graph as a picture, and predicted masks.

Sparsity counts valid pairs only (a real query and a real key, and key j ≤ query i when causal, so a causal
sentence of length L has L(L+1)/2 pairs): sparsity = 1 − |G| / |V| per sentence, averaged over sentences;
the mean degree of a head is its number of gold edges per query.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from pipeline.atomic import atomic_path
from pipeline.clustering_store import load_centroids
from pipeline.errors import UserError
from pipeline.graphs.kinds import valid_pair_count
from pipeline.graphs.store import GraphStore
from pipeline.predictors.buckets import predicted_graph
from pipeline.predictors.distance import distance_mask
from pipeline.predictors.kmeans import kmeans_mask
from pipeline.predictors.quantization import quantization_mask
from pipeline.projection.model import load_projections

METHODS = ("window", "global", "distance", "quantization", "kmeans")
LEARNED_METHODS = ("distance", "quantization", "kmeans")


def summarize(store: GraphStore) -> dict[str, Any]:
    """Counts, bytes and per kind/layer/head gold sparsity and mean degree, JSON-ready."""
    manifest = store.manifest
    kinds = {}
    for kind in store.kinds:
        q_side, k_side = store.sides_of(kind)
        n, m = store.lengths(q_side), store.lengths(k_side)  # (S,)
        valid = valid_pair_count(n, m, causal=store.causal(kind))  # (S,)
        edges = store.edge_counts(kind)  # (L, H, S)
        sparsity = (1.0 - edges / valid).mean(axis=2)  # (L, H), sentences weigh equally
        degree = edges.sum(axis=2) / n.sum()  # (L, H), edges per query
        kinds[kind] = {
            "causal": store.causal(kind),
            "edges": int(edges.sum()),
            "valid_pairs": int(valid.sum()) * store.layers * store.heads,
            "sparsity": float(sparsity.mean()),
            "mean_degree": float(degree.mean()),
            "per_layer_head": {"sparsity": sparsity.tolist(), "mean_degree": degree.tolist()},
        }
    return {
        "folder": str(store.folder),
        "teacher": manifest["teacher"],
        "sentences": len(store),
        "tokens": manifest["counts"]["tokens"],
        "shards": len(manifest["shards"]),
        "bytes": store.nbytes,
        "layers": store.layers,
        "heads": store.heads,
        "head_dim": store.head_dim,
        "dtype": manifest["dtype"],
        "kinds": kinds,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A plain-text report of :func:`summarize`: header lines, then a layer × head table per kind."""
    tokens = ", ".join(f"{count} {side}" for side, count in summary["tokens"].items())
    teacher = ", ".join(f"{key}={value}" for key, value in summary["teacher"].items())
    lines = [
        f"graph store {summary['folder']}",
        f"  {summary['sentences']} sentences, tokens: {tokens}; {summary['shards']} shard(s), "
        f"{summary['bytes'] / 1e6:.2f} MB",
        f"  {summary['layers']} layers x {summary['heads']} heads, head dim {summary['head_dim']}, "
        f"q/k stored as {summary['dtype']}",
        f"  teacher: {teacher}",
    ]
    for kind, stats in summary["kinds"].items():
        causal = "causal" if stats["causal"] else "bidirectional"
        lines += [
            "",
            f"{kind} ({causal}): {stats['edges']} gold edges, sparsity {stats['sparsity']:.4f}, "
            f"mean degree {stats['mean_degree']:.2f}",
            "  sparsity / mean degree, layer x head:",
            "  layer " + "".join(f"{f'head {h}':>16}" for h in range(summary["heads"])),
        ]
        table = stats["per_layer_head"]
        for layer, (sparsity, degree) in enumerate(zip(table["sparsity"], table["mean_degree"], strict=True)):
            cells = "".join(f"{f'{s:.4f} / {g:.2f}':>16}" for s, g in zip(sparsity, degree, strict=True))
            lines.append(f"  {layer:>5} {cells}")
    return "\n".join(lines)


def predicted_mask_for(
    store: GraphStore,
    sentence: int,
    layer: int,
    head: int,
    kind: str,
    method: str,
    *,
    window: int = 0,
    buckets: int = 8,
    threshold: float = 1.0,
    top_k: int = 1,
    projections: str | os.PathLike | None = None,
    centroids: str | os.PathLike | None = None,
) -> np.ndarray:
    """(n, m) bool predicted graph Ĝ of one head: the method's pairs ∪ window ∪ global, ∩ valid pairs.

    ``window`` (full size w, 0 for none) is OR-ed into every method; ``global`` adds the first token's row
    and column. ``distance`` (‖q′ − k′‖ ≤ ``threshold``), ``quantization`` (``buckets`` bins per dimension)
    and ``kmeans`` (top-``top_k`` of ``buckets`` centroids) work on queries and keys projected by the
    layer's projections from ``projections``; ``kmeans`` also reads ``centroids`` (:func:`load_centroids`).
    """
    if method not in METHODS:
        raise UserError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    q, k, _ = store.layer_arrays(sentence, layer, kind)  # (H, n, d), (H, m, d)
    q_t, k_t = torch.from_numpy(q)[None], torch.from_numpy(k)[None]  # (1, H, n | m, d)
    q_valid = torch.ones(1, q.shape[1], dtype=torch.bool)
    k_valid = torch.ones(1, k.shape[1], dtype=torch.bool)
    learned = None
    if method in LEARNED_METHODS:
        q_proj, k_proj = _project(store, layer, projections, method, q_t, k_t)  # (1, H, n | m, r)
        if method == "distance":
            learned = distance_mask(q_proj, k_proj, threshold)
        elif method == "quantization":
            learned = quantization_mask(q_proj, k_proj, buckets, q_valid, k_valid)
        else:
            if centroids is None:
                raise UserError("method kmeans needs a centroids file (--centroids FILE)")
            learned = kmeans_mask(
                q_proj, k_proj, load_centroids(centroids, layer, buckets), top_k, q_valid, k_valid
            )
        learned = learned[:, head : head + 1]
    graph = predicted_graph(
        learned, q_valid, k_valid, causal=store.causal(kind), window=window, global_first=method == "global"
    )
    return graph[0, 0].numpy()


def _project(
    store: GraphStore,
    layer: int,
    path: str | os.PathLike | None,
    method: str,
    q: torch.Tensor,
    k: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys of one layer through that layer's projections from ``path``."""
    if path is None:
        raise UserError(f"method {method} needs a projections file (--projections FILE)")
    if not Path(path).is_file():
        raise UserError(f"projections file {path} not found")
    layers, _ = load_projections(path)
    if layer not in layers:
        raise UserError(f"{path} has no projections for layer {layer}; it has layers {sorted(layers)}")
    module = layers[layer]
    if (module.n_heads, module.head_dim) != (store.heads, store.head_dim):
        raise UserError(
            f"{path} layer {layer} projects {module.n_heads} heads of dim {module.head_dim}; "
            f"the store has {store.heads} heads of dim {store.head_dim}"
        )
    with torch.no_grad():
        return module(q, k)


def draw_head(
    store: GraphStore,
    sentence: int,
    layer: int,
    head: int,
    kind: str,
    predicted_mask: np.ndarray | None,
    png_path: str | os.PathLike,
    title: str,
) -> None:
    """Save one head's attention graph as a PNG: gold edges as stars over shaded predicted cells.

    Rows are queries and columns keys, labelled with the sentence's tokens. Stars grow with the gold
    probability; a gold edge outside the predicted mask is drawn in red (a recall miss). Pairs the head
    may not attend (the future, when causal) are hatched grey.
    """
    record = store.get(sentence, layer, head, kind)
    n, m = record.n, record.m
    if predicted_mask is not None and predicted_mask.shape != (n, m):
        raise ValueError(f"predicted mask has shape {predicted_mask.shape}, expected {(n, m)}")
    valid = record.valid_mask()

    # about a quarter inch per token keeps 60 labels legible without making 10 tokens tiny
    cell = 0.26
    # the legend sits right of the axes: about 1.6 inches on top of the cells
    figure = Figure(figsize=(max(5.0, 3.8 + cell * m), max(4.5, 2.4 + cell * n)), dpi=110)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    background = np.ones((n, m, 3))
    background[~valid] = (0.85, 0.85, 0.85)
    if predicted_mask is not None:
        background[predicted_mask & valid] = (0.62, 0.78, 0.95)
    ax.imshow(background, interpolation="nearest", aspect="equal")

    rows, cols = record.edge_rows(), record.cols
    hit = np.ones(len(cols), bool) if predicted_mask is None else predicted_mask[rows, cols]
    sizes = 25 + 140 * record.probs
    ax.scatter(cols[hit], rows[hit], s=sizes[hit], marker="*", color="#1f1f1f", linewidths=0, zorder=3)
    ax.scatter(cols[~hit], rows[~hit], s=sizes[~hit], marker="*", color="#d62728", linewidths=0, zorder=3)

    ax.set_xticks(range(m), [_label(t) for t in record.key_tokens], rotation=90, fontsize=8)
    ax.set_yticks(range(n), [_label(t) for t in record.query_tokens], fontsize=8)
    ax.set_xticks(np.arange(-0.5, m), minor=True)
    ax.set_yticks(np.arange(-0.5, n), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("key")
    ax.set_ylabel("query")

    n_valid = int(valid.sum())
    subtitle = f"gold: {len(cols)} edges, sparsity {1 - len(cols) / n_valid:.3f}"
    handles = [Line2D([], [], marker="*", color="#1f1f1f", linestyle="", label="gold edge")]
    if predicted_mask is not None:
        predicted = int((predicted_mask & valid).sum())
        recall = float(hit.mean()) if len(cols) else float("nan")
        subtitle += f"   predicted: sparsity {1 - predicted / n_valid:.3f}, recall {recall:.3f}"
        handles += [
            Patch(color=(0.62, 0.78, 0.95), label="predicted"),
            Line2D([], [], marker="*", color="#d62728", linestyle="", label="missed gold edge"),
        ]
    ax.set_title(f"{title}\n{subtitle}", fontsize=10)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    figure.tight_layout()
    with atomic_path(png_path) as tmp:
        figure.savefig(tmp, format="png")


def _label(token: str) -> str:
    """A tick label that matplotlib shows literally (a ``$`` would start mathtext)."""
    return token.replace("$", r"\$")
