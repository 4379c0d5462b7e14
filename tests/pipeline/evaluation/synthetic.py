"""A hand-made evaluation in the evaluate stage's schema: two learned methods and two baselines.

Graph settings (sparsity, recall); ``*`` marks a point off its method's Pareto front:

    kmeans    (0.75, 0.99) (0.85, 0.96) (0.92, 0.94) (0.80, 0.90)*
    distance  (0.82, 0.97) (0.91, 0.93) (0.95, 0.70)
    window    (0.70, 0.80) (0.85, 0.60) (0.93, 0.40)
    bigbird   (0.60, 0.97) (0.81, 0.85) (0.90, 0.55) (0.70, 0.80)* and one with recall null

So the best recall at sparsity ≥ 0.8 is distance's 0.97, at ≥ 0.9 kmeans's 0.94; the sparsest setting with
recall ≥ 0.95 is kmeans at 0.85. Distance's front dominates both baselines'; kmeans's only bigbird's (it has
nothing as sparse as window's 0.93). Three settings were decoded: kmeans buckets=4, distance threshold=2 and
window w=5.
"""

from __future__ import annotations

import copy

LAYERS, HEADS = 2, 3
TEACHER = {
    "bleu": 20.0,
    "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0",
    "perplexity": 5.0,
    "sparsity": 0.87,
    "forward_seconds": 1.0,
    "decode_seconds": 10.0,
}


def label(method: str, knobs: dict, window: int) -> str:
    inside = ", ".join(f"{k}={v}" for k, v in knobs.items())
    return f"{method}({inside}) w={window}"


def graph(method: str, knobs: dict, window: int, sparsity: float, recall: float | None) -> dict:
    """One graph setting; its per-head recall spreads around the mean, with one undefined head."""
    grid = [[None if (layer, head) == (1, 2) else recall for head in range(HEADS)] for layer in range(LAYERS)]
    if recall is not None:
        grid[0][0] = round(recall - 0.1, 3)
    return {
        "method": method,
        "knobs": knobs,
        "window": window,
        "global_tokens": 0,
        "label": label(method, knobs, window),
        "sparsity": sparsity,
        "recall": recall,
        "precision": 0.3,
        "exact": 0.2,
        "per_layer_head": {
            "sparsity": [[sparsity] * HEADS for _ in range(LAYERS)],
            "recall": grid,
            "precision": [[0.3] * HEADS for _ in range(LAYERS)],
            "exact": [[0.2] * HEADS for _ in range(LAYERS)],
        },
    }


def point(row: dict, sparsity: float, bleu: float, perplexity: float, forward: float, decode: float) -> dict:
    """A quality point decoded with the graph setting ``row``."""
    keys = ("method", "knobs", "window", "global_tokens", "label")
    return {
        **{k: copy.deepcopy(row[k]) for k in keys},
        "graph_sparsity": row["sparsity"],
        "graph_recall": row["recall"],
        "sparsity": sparsity,
        "bleu": bleu,
        "signature": TEACHER["signature"],
        "perplexity": perplexity,
        "forward_seconds": forward,
        "decode_seconds": decode,
    }


def synthetic_evaluation() -> dict:
    graphs = [
        graph("window", {}, 7, 0.70, 0.80),
        graph("window", {}, 5, 0.85, 0.60),
        graph("window", {}, 3, 0.93, 0.40),
        graph("bigbird", {"random": 3}, 3, 0.60, 0.97),
        graph("bigbird", {"random": 2}, 3, 0.81, 0.85),
        graph("bigbird", {"random": 1}, 3, 0.90, 0.55),
        graph("bigbird", {"random": 4}, 1, 0.70, 0.80),
        graph("bigbird", {"random": 5}, 1, 0.50, None),
        graph("kmeans", {"buckets": 2, "top_k": 1}, 3, 0.75, 0.99),
        graph("kmeans", {"buckets": 4, "top_k": 1}, 3, 0.85, 0.96),
        graph("kmeans", {"buckets": 8, "top_k": 1}, 3, 0.92, 0.94),
        graph("kmeans", {"buckets": 6, "top_k": 1}, 3, 0.80, 0.90),
        graph("distance", {"threshold": 2.0}, 3, 0.82, 0.97),
        graph("distance", {"threshold": 1.0}, 3, 0.91, 0.93),
        graph("distance", {"threshold": 0.5}, 3, 0.95, 0.70),
    ]
    by_label = {row["label"]: row for row in graphs}
    points = [
        point(by_label["kmeans(buckets=4, top_k=1) w=3"], 0.86, 19.25, 5.5, 1.5, 12.0),
        point(by_label["distance(threshold=2.0) w=3"], 0.83, 19.5, 5.25, 2.0, 15.0),
        point(by_label["window() w=5"], 0.84, 12.0, 9.0, 0.8, 8.0),
    ]
    return {
        "kind": "decoder_self",
        "store": {
            "path": "artifacts/graphs/test",
            "split": "test",
            "sentences": 40,
            "layers": LAYERS,
            "heads": HEADS,
        },
        "gold_sparsity": 0.87,
        "gold_sparsity_per_layer_head": [[0.87] * HEADS for _ in range(LAYERS)],
        "graphs": graphs,
        "quality": {"teacher": dict(TEACHER), "points": points},
    }
