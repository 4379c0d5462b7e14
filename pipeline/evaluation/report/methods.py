"""The section "Sparsity and recall per method": recall at each sparsity level and sparsity at the recall
target per method, with the task's measures at those settings, and the teacher's gold graph last."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.evaluation.pareto import finite_number
from pipeline.evaluation.report.cells import num, quality_cell, score_header, setting_cell
from pipeline.evaluation.report.points import (
    quality_at,
    recall_at_sparsity,
    rows_by_method,
    sparsity_at_recall,
    teacher_quality,
)
from pipeline.evaluation.table_text import DASH, table_row


def method_table(evaluation: dict, levels: Sequence[float], target: float) -> str:
    scores = score_header(evaluation)
    header = ["method"]
    for level in levels:
        header += [f"recall @ sparsity ≥ {level:g}", scores]
    header += [f"sparsity @ recall ≥ {target:g}", scores]
    lines = [table_row(header), table_row(["---"] * len(header))]
    for method, rows in rows_by_method(evaluation["graphs"]).items():
        cells = [method]
        for level in levels:
            row = recall_at_sparsity(rows, level)
            cells += [setting_cell(row, "recall"), quality_cell(evaluation, quality_at(evaluation, row))]
        row = sparsity_at_recall(rows, target)
        cells += [setting_cell(row, "sparsity"), quality_cell(evaluation, quality_at(evaluation, row))]
        lines.append(table_row(cells))
    lines.append(table_row(_teacher_cells(evaluation, levels)))
    return "\n".join(lines)


def _teacher_cells(evaluation: dict, levels: Sequence[float]) -> list[str]:
    """The gold graph has recall 1 at the gold sparsity; the teacher decodes with it."""
    gold = finite_number(evaluation["gold_sparsity"])
    quality = quality_cell(evaluation, teacher_quality(evaluation))
    cells = ["teacher (gold graph)"]
    for level in levels:
        reached = gold is not None and gold >= level
        cells += ["1.000 (gold)", quality] if reached else [DASH, DASH]
    cells += [f"{num(gold, 3)} (gold)", quality]
    return cells
