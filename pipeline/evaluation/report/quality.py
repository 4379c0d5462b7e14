"""The section on quality with predicted graphs: each decoded (or run) setting's sparsity, graph recall,
measures against the teacher's, and times relative to the teacher's."""

from __future__ import annotations

from typing import Any

from pipeline.evaluation.pareto import finite_number
from pipeline.evaluation.report.cells import num, ratio, versus
from pipeline.evaluation.report.points import label, rows_by_method, teacher_quality
from pipeline.evaluation.report.scores import task_scores, verbs
from pipeline.evaluation.table_text import cell, table_row


def quality_table(evaluation: dict) -> str:
    teacher = teacher_quality(evaluation)
    points = evaluation["quality"]["points"]
    if not points:
        return "No setting was decoded with its predicted graphs."
    scores = task_scores(evaluation)
    primary = scores[0]
    decodes = evaluation.get("task", "translation") == "translation"
    header = [
        "setting",
        f"{verbs(scores)[0]} sparsity",
        "graph recall",
        primary.name,
        f"Δ {primary.name}",
        *(score.name for score in scores[1:]),
        "forward",
        *(["decode"] if decodes else []),
    ]
    lines = [table_row(header), table_row(["---"] * len(header))]

    def numbers(point: dict, recall: Any) -> list[str]:
        cells = [
            num(point.get("sparsity"), 3),
            num(recall, 3),
            *versus(point, teacher, scores, deltas=1, against="teacher"),
        ]
        cells.append(ratio(point.get("forward_seconds"), teacher.get("forward_seconds")))
        if decodes:
            cells.append(ratio(point.get("decode_seconds"), teacher.get("decode_seconds")))
        return cells

    if teacher:
        lines.append(table_row(["teacher", *numbers(teacher, 1.0)]))
    for rows in rows_by_method(points).values():
        for point in sorted(rows, key=lambda p: (finite_number(p["sparsity"]) or 0.0, label(p))):
            lines.append(table_row([cell(label(point)), *numbers(point, point.get("graph_recall"))]))
    lines.append("")
    times = (
        "forward and decode are times" if decodes else "forward is the time of a pass over the test blocks"
    )
    paired = " (paired, with its 95 % interval; see Evidence)" if teacher.get("evidence") else ""
    lines.append(f"Δ {primary.name} is against the teacher{paired}; {times} relative to the teacher's.")
    return "\n".join(lines)
