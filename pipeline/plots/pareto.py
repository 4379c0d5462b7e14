"""Figures of the evaluation: sparsity–recall and sparsity–quality Pareto fronts (students as labelled points
on the latter), a per-layer/head recall map.

Figures are drawn on matplotlib's Agg canvas (no display needed) and saved as PNG; the CSV tables beside them
are what ``dvc plots show`` renders. Every file is written atomically.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pipeline.atomic import atomic_path, write_text
from pipeline.evaluation.pareto import finite_number, pareto_front
from pipeline.evaluation.report import (
    ACCURACY,
    BLEU,
    METHOD_ORDER,
    finite_points,
    num,
    operating_point,
    rows_by_method,
    student_rows,
    task_scores,
    teacher_quality,
)
from pipeline.plots.canvas import new_figure, save_png
from pipeline.plots.speed import plot_speedup

COLORS = matplotlib.colormaps["tab10"].colors
# baselines in muted tab10 colours, the learned predictors in strong ones
COLOR_INDEX = {
    "window": 7,
    "bigbird": 8,
    "longformer": 9,
    "reformer": 5,
    "routing": 6,
    "distance": 0,
    "quantization": 2,
    "kmeans": 3,
    "indexer": 4,
}
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "h", "<", ">")
# students: one marker no method uses, black-edged, a colour of their own each (by position, cycled) from a
# palette apart from the methods' tab10, and their name written beside the point
STUDENT_MARKER = "d"
STUDENT_COLORS = matplotlib.colormaps["Dark2"].colors
QUALITY_METRICS = {
    "bleu": ("BLEU", True),
    "perplexity": ("perplexity (lower is better)", False),
    "accuracy": ("accuracy at the answers", True),
}
FILES = {
    "sparsity_recall": "sparsity_recall.png",
    "sparsity_bleu": "sparsity_bleu.png",
    "sparsity_perplexity": "sparsity_perplexity.png",
    "sparsity_accuracy": "sparsity_accuracy.png",
    "recall_heatmap": "recall_heatmap.png",
    "speed_bleu": "speed_bleu.png",
    "speedup": "speedup.png",
    "pareto_recall": "pareto_recall.csv",
    "quality": "quality.csv",
}
CAPTIONS = {
    "sparsity_recall": "Sparsity–recall Pareto fronts",
    "sparsity_bleu": "Sparsity–BLEU with predicted graphs and students",
    "sparsity_perplexity": "Sparsity–perplexity with predicted graphs and students",
    "sparsity_accuracy": "Sparsity–accuracy at the answers with predicted graphs and students",
    "recall_heatmap": "Recall per layer and head at the operating point",
    "speed_bleu": "Decoding time–BLEU of the students (PAR: the share of attention sublayers kept)",
    "speedup": "Speed-up over softmax SDPA against the context, forward and forward + backward",
}


def write_report_plots(
    evaluation: dict, out_dir: str | os.PathLike, *, recall_target: float
) -> dict[str, Path]:
    """Write every figure and CSV of the report into the folder ``out_dir``, replacing it as a whole.

    Returns the final path of each file written, keyed as :data:`FILES` (the BLEU figures only for a
    translation evaluation). The heatmap shows the setting
    :func:`~pipeline.evaluation.report.operating_point` picks for ``recall_target``.
    """
    out_dir = Path(out_dir)
    translation = BLEU in task_scores(evaluation)  # the BLEU figures need decoded translations
    recall = task_scores(evaluation)[0] == ACCURACY  # mqar: accuracy at the answers is the measure
    timed = bool(evaluation.get("speed"))  # the speed table's models at several contexts
    written = [
        name
        for name in FILES
        if (translation or "bleu" not in name)
        and (recall or "accuracy" not in name)
        and (timed or name != "speedup")
    ]
    with atomic_path(out_dir, directory=True) as tmp:
        plot_sparsity_recall(evaluation, tmp / FILES["sparsity_recall"])
        if translation:
            plot_quality(evaluation, "bleu", tmp / FILES["sparsity_bleu"])
            plot_speed_quality(evaluation, tmp / FILES["speed_bleu"])
        plot_quality(evaluation, "perplexity", tmp / FILES["sparsity_perplexity"])
        if recall:
            plot_quality(evaluation, "accuracy", tmp / FILES["sparsity_accuracy"])
        plot_recall_heatmap(
            evaluation, operating_point(evaluation, recall_target), tmp / FILES["recall_heatmap"]
        )
        if timed:
            plot_speedup(evaluation, tmp / FILES["speedup"])
        write_pareto_csv(evaluation, tmp / FILES["pareto_recall"])
        write_quality_csv(evaluation, tmp / FILES["quality"])
    return {name: out_dir / FILES[name] for name in written}


# ----------------------------------------------------------------------------------------------------------
# style


def method_style(method: str) -> tuple[tuple[float, float, float], str]:
    """A method's colour and marker: fixed for the methods of :data:`METHOD_ORDER`, cycled for others."""
    if method in METHOD_ORDER:
        return COLORS[COLOR_INDEX[method]], MARKERS[METHOD_ORDER.index(method)]
    # an unknown method's slot comes from its name, so its style does not depend on which others are present
    slot = sum(method.encode())
    return COLORS[slot % len(COLORS)], MARKERS[slot % len(MARKERS)]


def _figure(width: float = 8.0, height: float = 5.0) -> tuple[Figure, Axes]:
    figure = new_figure(width, height)
    return figure, figure.add_subplot()


def _message(path: str | os.PathLike, title: str, text: str) -> None:
    """A small PNG saying why a figure has nothing to show."""
    figure, ax = _figure(5.0, 2.0)
    ax.set_axis_off()
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, transform=ax.transAxes)
    save_png(figure, path)


def _subtitle(evaluation: dict) -> str:
    store = evaluation["store"] or {}
    return f"{evaluation['kind']}, {store.get('split', '?')} split, {store.get('sentences', '?')} sentences"


def _gold_line(ax: Axes, evaluation: dict) -> None:
    gold = finite_number(evaluation["gold_sparsity"])
    if gold is not None:
        ax.axvline(gold, color="0.35", linestyle="--", linewidth=1.0, label=f"gold sparsity {gold:.3f}")


def _fronts(ax: Axes, rows: Sequence[dict], x: str, y: str, maximize: tuple[bool, bool]) -> None:
    """Every setting of each method as a faint point, and the method's Pareto front as a line with markers."""
    for method, method_rows in rows_by_method(rows).items():
        points, _ = finite_points(method_rows, x, y)
        if not points:
            continue
        color, marker = method_style(method)
        xs, ys = np.array(points).T
        ax.scatter(xs, ys, s=16, color=color, alpha=0.25, linewidths=0)
        front = pareto_front(points, maximize=maximize)
        ax.plot(xs[front], ys[front], color=color, marker=marker, markersize=5, linewidth=1.4, label=method)


def _students(
    ax: Axes,
    students: Sequence[dict],
    metric: str,
    x_of: Callable[[dict], Any] = lambda row: row["sparsity"],
    label: Callable[[dict], str] = lambda row: row["student"],
) -> None:
    """Each student with an x (its sparsity) and a ``metric`` as one black-edged diamond, named beside it
    and in the legend as ``student: NAME``."""
    for i, row in enumerate(students):
        x, y = finite_number(x_of(row)), finite_number(row.get(metric))
        if x is None or y is None:
            continue
        ax.scatter(
            [x],
            [y],
            marker=STUDENT_MARKER,
            s=110,
            color=STUDENT_COLORS[i % len(STUDENT_COLORS)],
            edgecolors="black",
            linewidths=1.0,
            zorder=5,
            label=f"student: {row['student']}",
        )
        ax.annotate(label(row), (x, y), xytext=(7, 5), textcoords="offset points", fontsize=8)


def _error_bars(ax: Axes, rows: Sequence[dict], metric: str) -> None:
    """The 95 % interval of ``metric`` of each row that carries its evidence (the report attaches it), as
    a vertical bar through the evidence's own value (the point drawn is the row's, rounded); rows without
    evidence are left as points."""
    for row in rows:
        entry = (row.get("evidence") or {}).get(metric)
        x = finite_number(row.get("sparsity"))
        if entry is None or x is None:
            continue
        y, (low, high) = entry["value"], entry["ci95"]
        below, above = max(y - low, 0.0), max(high - y, 0.0)
        ax.errorbar([x], [y], yerr=[[below], [above]], fmt="none", ecolor="0.35", elinewidth=0.8, capsize=2)


def _legend(ax: Axes) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


# ----------------------------------------------------------------------------------------------------------
# figures


def plot_sparsity_recall(evaluation: dict, path: str | os.PathLike) -> None:
    """Graph sparsity against recall: each method's settings and Pareto front, and the gold sparsity."""
    figure, ax = _figure()
    _fronts(ax, evaluation["graphs"], "sparsity", "recall", (True, True))
    _gold_line(ax, evaluation)
    ax.set_xlabel("graph sparsity (share of valid pairs not attended)")
    ax.set_ylabel("recall (share of gold edges kept)")
    ax.set_title(f"Sparsity–recall Pareto fronts\n{_subtitle(evaluation)}", fontsize=10)
    ax.grid(alpha=0.3)
    _legend(ax)
    save_png(figure, path)


def plot_quality(
    evaluation: dict, metric: Literal["bleu", "perplexity", "accuracy"], path: str | os.PathLike
) -> None:
    """Decoding sparsity against BLEU, perplexity or (mqar) accuracy with predicted graphs and students,
    beside the teacher's.

    Each method's points and Pareto front (BLEU and accuracy maximised, perplexity minimised; sparsity
    maximised), each
    student as a labelled diamond, the teacher as a star and the gold sparsity as a dashed line; with the
    evaluation's evidence, each of them with its 95 % interval as an error bar. Without quality points or
    students the PNG says so.
    """
    name, larger_is_better = QUALITY_METRICS[metric]
    points = evaluation["quality"]["points"]
    students = student_rows(evaluation)
    shown = "predicted graphs and students" if students else "predicted graphs"
    title = f"Sparsity–{name.split()[0]} with {shown}\n{_subtitle(evaluation)}"
    if (
        not finite_points(points, "sparsity", metric)[0]
        and not finite_points(students, "sparsity", metric)[0]
    ):
        _message(path, title, "no quality points")
        return
    figure, ax = _figure()
    _fronts(ax, points, "sparsity", metric, (True, larger_is_better))
    _students(ax, students, metric)
    teacher = teacher_quality(evaluation)
    _error_bars(ax, [*points, *students, teacher], metric)
    teacher_x, teacher_y = finite_number(teacher.get("sparsity")), finite_number(teacher.get(metric))
    if teacher_x is not None and teacher_y is not None:
        ax.scatter([teacher_x], [teacher_y], marker="*", s=220, color="black", zorder=4, label="teacher")
    _gold_line(ax, evaluation)
    ax.set_xlabel("decoding sparsity (share of valid pairs not attended)")
    ax.set_ylabel(name)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    _legend(ax)
    save_png(figure, path)


def _relative(value: Any, reference: float) -> float | None:
    value = finite_number(value)
    return None if value is None else value / reference


def _speed_label(row: dict) -> str:
    par = row.get("par")
    return row["student"] if not par else f"{row['student']} (attention ×{par['attention_fraction']:.2f})"


def plot_speed_quality(evaluation: dict, path: str | os.PathLike) -> None:
    """Each student's decoding time relative to the teacher's against its BLEU, the teacher at 1 as a star;
    a PAR student's label gives its self-attention sublayers as a share of the teacher's."""
    title = f"Decoding time–BLEU of the students\n{_subtitle(evaluation)}"
    teacher = teacher_quality(evaluation)
    reference = finite_number(teacher.get("decode_seconds"))
    students = student_rows(evaluation)

    def speed(row: dict) -> float | None:
        return None if reference is None else _relative(row.get("decode_seconds"), reference)

    if not finite_points([{"x": speed(row), "y": row.get("bleu")} for row in students], "x", "y")[0]:
        _message(path, title, "no timed students")
        return
    figure, ax = _figure()
    _students(ax, students, "bleu", x_of=speed, label=_speed_label)
    teacher_bleu = finite_number(teacher.get("bleu"))
    if teacher_bleu is not None:
        ax.scatter([1.0], [teacher_bleu], marker="*", s=220, color="black", zorder=4, label="teacher")
    ax.set_xlabel("decoding time relative to the teacher's (lower is faster)")
    ax.set_ylabel("BLEU")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    _legend(ax)
    save_png(figure, path)


def plot_recall_heatmap(evaluation: dict, setting: dict | None, path: str | os.PathLike) -> None:
    """Recall of one setting per layer (rows) and head (columns), cells annotated; undefined cells grey."""
    title = "Recall per layer and head"
    grid = ((setting or {}).get("per_layer_head") or {}).get("recall")
    if not grid:
        _message(path, title, "no per-layer/head recall")
        return
    values = np.array([[np.nan if v is None else float(v) for v in layer] for layer in grid])
    layers, heads = values.shape
    figure, ax = _figure(max(4.5, 1.9 + 0.75 * heads), max(3.0, 1.6 + 0.55 * layers))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.8")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    for layer in range(layers):
        for head in range(heads):
            value = values[layer, head]
            color = "black" if np.isnan(value) else _ink(value)
            ax.text(head, layer, num(value, 2), ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    figure.colorbar(image, ax=ax, label="recall")
    ax.set_title(
        f"{title}: {setting.get('label') or setting['method']}\n"
        f"sparsity {num(setting.get('sparsity'), 3)}, recall {num(setting.get('recall'), 3)}",
        fontsize=10,
    )
    save_png(figure, path)


def _ink(value: float) -> str:
    """Text colour readable on viridis: white on its dark low end, black on its light high end."""
    return "white" if value < 0.6 else "black"


# ----------------------------------------------------------------------------------------------------------
# CSV tables


def _csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([["" if value is None else value for value in row] for row in rows])
    return buffer.getvalue()


def _sorted_by_sparsity(rows: Sequence[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (finite_number(r.get("sparsity")) or 0.0, r.get("label") or ""))


def pareto_recall_rows(evaluation: dict) -> list[tuple[str, str, float, float, str]]:
    """(method, label, sparsity, recall, on_front) of every setting with both numbers.

    Methods in :func:`~pipeline.evaluation.report.method_order`, settings by sparsity then label; ``on_front``
    is "true" for the settings on their method's sparsity–recall Pareto front.
    """
    table = []
    for method, rows in rows_by_method(evaluation["graphs"]).items():
        points, kept = finite_points(rows, "sparsity", "recall")
        front = {id(kept[i]) for i in pareto_front(points)}
        for row in _sorted_by_sparsity(kept):
            on_front = "true" if id(row) in front else "false"
            table.append((method, row.get("label") or method, row["sparsity"], row["recall"], on_front))
    return table


def write_pareto_csv(evaluation: dict, path: str | os.PathLike) -> None:
    """``pareto_recall.csv``: method, label, sparsity, recall, on_front (see :func:`pareto_recall_rows`)."""
    header = ("method", "label", "sparsity", "recall", "on_front")
    write_text(path, _csv_text(header, pareto_recall_rows(evaluation)))


def quality_rows(evaluation: dict) -> list[tuple[str, str, Any, Any, Any]]:
    """(method, label, sparsity, bleu, perplexity): the teacher first, then every quality point, then every
    student (method ``student``, labelled with its name, in the evaluation's order).

    Points are grouped by method in :func:`~pipeline.evaluation.report.method_order`, by decoding sparsity
    then label within a method; undefined numbers are None.
    """
    teacher = teacher_quality(evaluation)
    table = []
    if teacher:
        table.append(
            ("teacher", "teacher", teacher.get("sparsity"), teacher.get("bleu"), teacher.get("perplexity"))
        )
    for method, points in rows_by_method(evaluation["quality"]["points"]).items():
        for point in _sorted_by_sparsity(points):
            label = point.get("label") or method
            table.append((method, label, point["sparsity"], point.get("bleu"), point.get("perplexity")))
    for row in student_rows(evaluation):
        table.append(("student", row["student"], row["sparsity"], row.get("bleu"), row.get("perplexity")))
    return table


def write_quality_csv(evaluation: dict, path: str | os.PathLike) -> None:
    """``quality.csv``: method, label, sparsity, bleu, perplexity (see :func:`quality_rows`)."""
    header = ("method", "label", "sparsity", "bleu", "perplexity")
    write_text(path, _csv_text(header, quality_rows(evaluation)))
