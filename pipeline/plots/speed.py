"""The figure "speed-up against the context": each model's speed over softmax SDPA's at every context the
evaluation timed (forward solid, forward + backward dashed), the ratios the report's speed table holds."""

from __future__ import annotations

import os
from collections.abc import Sequence

from pipeline.evaluation.pareto import finite_number
from pipeline.evaluation.report.speed import SDPA_MODEL as SDPA
from pipeline.plots.canvas import new_figure, save_png


def speedups(rows: Sequence[dict], key: str) -> dict[str, list[tuple[int, float]]]:
    """Per model other than SDPA, (context, SDPA's seconds / the model's) at each context where both have a
    positive ``key`` (``forward_seconds`` or ``forward_backward_seconds``), in increasing context."""
    reference = {row["context"]: finite_number(row.get(key)) for row in rows if row.get("model") == SDPA}
    lines: dict[str, list[tuple[int, float]]] = {}
    for row in sorted(rows, key=lambda row: row["context"]):
        if row.get("model") == SDPA:
            continue
        mine, base = finite_number(row.get(key)), reference.get(row["context"])
        if mine is not None and mine > 0 and base is not None and base > 0:
            lines.setdefault(row["model"], []).append((row["context"], base / mine))
    return lines


def plot_speedup(evaluation: dict, path: str | os.PathLike) -> None:
    """Draw the figure from ``evaluation["speed"]`` into ``path`` (PNG); a figure saying so when no ratio to
    SDPA exists."""
    rows = evaluation.get("speed") or []
    forward = speedups(rows, "forward_seconds")
    both = speedups(rows, "forward_backward_seconds")
    figure = new_figure(8.0, 5.0)
    ax = figure.add_subplot()
    ax.set_title("Speed-up over softmax SDPA against the context (same weights, one sequence)", fontsize=10)
    if not forward and not both:
        ax.axis("off")
        ax.text(0.5, 0.5, "no model was timed beside softmax SDPA", ha="center", va="center")
        save_png(figure, path)
        return
    for i, model in enumerate(dict.fromkeys([*forward, *both])):
        color = f"C{i % 10}"  # one colour per model, its two phases told apart by the line style
        for lines, style, phase in ((forward, "-", "forward"), (both, "--", "forward + backward")):
            if model in lines:
                x, y = zip(*lines[model], strict=True)
                ax.plot(x, y, style, marker="o", color=color, label=f"{model}, {phase}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    contexts = sorted({n for lines in (forward, both) for points in lines.values() for n, _ in points})
    ax.set_xticks(contexts, [str(n) for n in contexts])
    ax.set_xlabel("context n (tokens)")
    ax.set_ylabel("× softmax SDPA (above 1: faster)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save_png(figure, path)
