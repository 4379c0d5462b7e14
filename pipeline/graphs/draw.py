"""One head's attention graph as a picture: gold edges as stars over the cells a predictor selects."""

from __future__ import annotations

import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from pipeline.atomic import atomic_path
from pipeline.graphs.store import GraphStore


def draw_head(
    store: GraphStore,
    sentence: int,
    layer: int,
    head: int,
    kind: str,
    predicted_mask: np.ndarray | None,
    png_path: str | os.PathLike,
    title: str,
    software: str | None = None,
) -> None:
    """Save one head's attention graph as a PNG: gold edges as stars over shaded predicted cells.

    Rows are queries and columns keys, labelled with the sentence's tokens. Stars grow with the gold
    probability; a gold edge outside the predicted mask is drawn in red (a recall miss). Pairs the head
    may not attend (the future, when causal) are hatched grey. ``software`` goes in the PNG's Software
    text chunk (matplotlib's name by default), so that the program that drew it knows it again.
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
        figure.savefig(tmp, format="png", metadata={"Software": software} if software else None)


def _label(token: str) -> str:
    """A tick label that matplotlib shows literally (a ``$`` would start mathtext)."""
    return token.replace("$", r"\$")
