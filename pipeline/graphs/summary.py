"""What a graph store holds: counts, bytes, and per kind/layer/head gold sparsity and mean degree.

Sparsity counts valid pairs only (a real query and a real key, and key j ≤ query i when causal, so a causal
sentence of length L has L(L+1)/2 pairs): sparsity = 1 − |G| / |V| per sentence, averaged over sentences;
the mean degree of a head is its number of gold edges per query.
"""

from __future__ import annotations

from typing import Any

from pipeline.attention_kinds import valid_pair_count
from pipeline.graphs.store import GraphStore


def summarize(store: GraphStore) -> dict[str, Any]:
    """Split, counts, bytes and per kind/layer/head gold sparsity and mean degree, JSON-ready."""
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
        "split": store.split,
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
        f"graph store {summary['folder']} ({summary['split']} split)",
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
