"""The section "τ-indexer: rank and fitting": per rank and fitting, recall near the gold sparsity and
sparsity at the indexer's recall goal, and which fitting wins each rank."""

from __future__ import annotations

from typing import Any

from pipeline.evaluation.pareto import finite_number
from pipeline.evaluation.report.cells import quality_cell, score_header, setting_cell
from pipeline.evaluation.report.points import field, quality_at, recall_at_sparsity, sparsity_at_recall
from pipeline.evaluation.table_text import table_row

# The τ-indexer's goal: recall ≥ INDEXER_RECALL at sparsity ≥ gold − INDEXER_SLACK.
INDEXER_RECALL, INDEXER_SLACK = 0.99, 0.03


def indexer_table(evaluation: dict) -> str:
    """Per rank and fitting of the τ-indexer: recall at sparsity ≥ gold − slack and sparsity at recall ≥ the
    goal, with the task's measures where run, and which fitting wins each rank ("" without indexer rows)."""
    rows = [row for row in evaluation["graphs"] if row["method"] == "indexer"]
    gold = finite_number(evaluation["gold_sparsity"])
    if not rows or gold is None:
        return ""
    level = gold - INDEXER_SLACK
    variants: dict[tuple[Any, Any], list[dict]] = {}
    for row in rows:
        knobs = row.get("knobs") or {}
        variants.setdefault((knobs.get("rank"), knobs.get("fitting")), []).append(row)
    header = [
        "rank",
        "fitting",
        f"recall @ sparsity ≥ {level:.3f}",
        score_header(evaluation),
        f"sparsity @ recall ≥ {INDEXER_RECALL:g}",
        score_header(evaluation),
    ]
    lines = [table_row(header), table_row(["---"] * len(header))]
    winners = {}
    by_rank = sorted(variants.items(), key=lambda item: (finite_number(item[0][0]) or 0.0, str(item[0][1])))
    for (rank, fitting), group in by_rank:
        at_level = recall_at_sparsity(group, level)
        at_goal = sparsity_at_recall(group, INDEXER_RECALL)
        lines.append(
            table_row(
                [
                    str(rank),
                    str(fitting),
                    setting_cell(at_level, "recall"),
                    quality_cell(evaluation, quality_at(evaluation, at_level)),
                    setting_cell(at_goal, "sparsity"),
                    quality_cell(evaluation, quality_at(evaluation, at_goal)),
                ]
            )
        )
        recall = field(at_level, "recall")
        if recall is not None and (rank not in winners or recall > winners[rank][1]):
            winners[rank] = (fitting, recall)
    verdict = ", ".join(f"rank {rank}: {fitting}" for rank, (fitting, _) in winners.items())
    if verdict:
        lines += ["", f"Higher recall at sparsity ≥ {level:.3f} (gold − {INDEXER_SLACK:g}): {verdict}."]
    return "\n".join(lines)
