"""The section "Associative recall" of an mqar evaluation: every model's accuracy at the answers, overall and
by how far back the queried key lies, each with its 95 % interval, and its paired difference from the
teacher.

An answer is *near* when its key lies at most ``far_gap`` positions back (the median distance over the
test examples' answers), *far* otherwise: a predictor that keeps only nearby keys loses the far half first.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.evaluation.report.cells import num
from pipeline.evaluation.report.evidence import row_head
from pipeline.evaluation.report.verdicts import difference_text, judge, value_text
from pipeline.evaluation.table_text import DASH, table_row

SPLITS = ("accuracy", "accuracy_near", "accuracy_far")


def recall_section(evaluation: Mapping, tolerances: Mapping[str, float]) -> str | None:
    """The table of every evidence row's accuracy (all, near, far) with intervals, and the Δ accuracy vs
    the teacher with its verdict; None for another task or an evaluation without evidence."""
    evidence = evaluation.get("evidence")
    if evaluation.get("task") != "mqar" or not evidence:
        return None
    gap = evaluation["far_gap"]
    header = [
        "model",
        "kind",
        "sparsity",
        "graph recall",
        "at answers",
        "accuracy [95 % CI]",
        f"near (key ≤ {gap} back)",
        f"far (key > {gap} back)",
        "Δ accuracy vs teacher",
        "Δ far vs teacher",
        "verdict",
    ]
    lines = [table_row(header), table_row(["---"] * len(header))]
    for row in evidence["rows"]:
        versus = row.get("vs_teacher") or {}
        lines.append(
            table_row(
                [
                    *row_head(row),
                    num(row.get("answer_recall", 1.0 if row["kind"] == "teacher" else None), 3),
                    *(value_text(row[key], "accuracy") if key in row else DASH for key in SPLITS),
                    *(
                        difference_text(versus[key], "accuracy") if key in versus else DASH
                        for key in ("accuracy", "accuracy_far")
                    ),
                    judge(versus["accuracy"], "accuracy", tolerances) if "accuracy" in versus else DASH,
                ]
            )
        )
    count = evidence["rows"][0]["sentences"]
    lines += [
        "",
        f"Accuracy is the share of the answers (the value after each repeated key) whose most likely token "
        f"is right, over {count} test examples; intervals and differences are the Evidence section's paired "
        f"bootstrap over examples. An answer is near when its key occurs at most {gap} positions before the "
        f"query (the median over the test answers), far otherwise. The verdict is on Δ accuracy, with the "
        f"tolerance ±{tolerances['accuracy']:g}. Graph recall is over every query of the test store's "
        "examples; at answers, over the queries that answer alone: whether the key an answer needs is kept.",
    ]
    return "\n".join(lines)
