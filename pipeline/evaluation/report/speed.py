"""The section "Speed inside the model": tokens per second of each model at each context, its ratios to
the dense α-entmax teacher and to softmax SDPA, and its attention share."""

from __future__ import annotations

from typing import Any

from pipeline.evaluation.pareto import finite_number
from pipeline.evaluation.report.cells import num, ratio
from pipeline.evaluation.table_text import DASH, cell, table_row

SDPA_MODEL = "softmax (sdpa)"
"""The speed rows' name of the same weights with softmax SDPA, the reference of every × SDPA."""
DENSE_MODEL = "entmax (dense)"
"""The speed rows' name of the dense α-entmax teacher."""


def speed_table(evaluation: dict) -> str:
    """Tokens per second of each model at each context, side by side, with its ratios to the dense α-entmax
    teacher and to softmax SDPA, and the share of its forward spent in attention."""
    header = [
        "n",
        "model",
        "graph sparsity",
        "graph recall",
        "perplexity",
        "forward tokens/s",
        "× dense entmax",
        "× softmax SDPA",
        "forward + backward tokens/s",
        "× dense entmax",
        "× softmax SDPA",
        "attention share",
    ]
    lines = [table_row(header), table_row(["---"] * len(header))]
    rows = evaluation["speed"]
    for n in sorted({row["context"] for row in rows}):
        at_n = {row["model"]: row for row in rows if row["context"] == n}
        entmax, sdpa = at_n.get(DENSE_MODEL, {}), at_n.get(SDPA_MODEL, {})
        for name, row in at_n.items():
            forward, both = row.get("forward_seconds"), row.get("forward_backward_seconds")
            lines.append(
                table_row(
                    [
                        str(n),
                        cell(name),
                        num(row.get("graph_sparsity"), 3),
                        num(row.get("graph_recall"), 3),
                        num(row.get("perplexity"), 2),
                        cell(row["status"]) if "status" in row else _per_second(n, forward),
                        ratio(entmax.get("forward_seconds"), forward),
                        _paired_ratio(sdpa, row, "forward_seconds"),
                        _per_second(n, both),
                        ratio(entmax.get("forward_backward_seconds"), both),
                        _paired_ratio(sdpa, row, "forward_backward_seconds"),
                        num(_share(row.get("attention_seconds"), row.get("attention_pass_seconds")), 2),
                    ]
                )
            )
    lines += [
        "",
        "One sequence of n test tokens, medians of timed passes, the models taking turns pass by pass at "
        "each n; × is how many times faster than the dense α-entmax teacher or the same weights with softmax "
        "SDPA; (a–b) after × softmax SDPA is the range of that ratio over the rounds, each round's pass of "
        "the model against the SDPA pass run beside it; the attention share is the part of a forward spent "
        "inside the attention function. Perplexity is the quality sweep's on the test blocks (the teacher's "
        "for dense and certified entmax; softmax SDPA's is not measured).",
    ]
    reasons = {row["chosen_by"] for row in rows if "chosen_by" in row}
    if "perplexity" in reasons:
        lines.append(
            "Each predictor runs at its sparsest quality point within the perplexity gap of the teacher's"
            + (" (or, where none is that close, by recall)." if "recall" in reasons else ".")
        )
    elif reasons:
        lines.append("Each predictor runs at its sparsest setting reaching the speed recall target.")
    return "\n".join(lines)


def _paired_ratio(reference: dict, row: dict, key: str) -> str:
    """``row``'s median ``key`` against ``reference``'s (× how many times faster), and where both kept their
    passes (two rounds or more, as many each), the range of the rounds' ratios: ``1.31× (1.22–1.40)``."""
    median = ratio(reference.get(key), row.get(key))
    if row is reference:  # SDPA against itself: 1.00× in every round
        return median
    ours, theirs = row.get("pass_seconds", {}).get(key), reference.get("pass_seconds", {}).get(key)
    if median == DASH or not ours or not theirs or len(ours) != len(theirs) or len(ours) < 2:
        return median
    pairs = []
    for their, our in zip(theirs, ours, strict=True):
        a, b = finite_number(their), finite_number(our)
        if a is None or b is None or b <= 0:
            return median
        pairs.append(a / b)
    return f"{median} ({min(pairs):.2f}–{max(pairs):.2f})"


def _per_second(tokens: int, seconds: Any) -> str:
    value = finite_number(seconds)
    return DASH if value is None or value <= 0 else f"{tokens / value:,.0f}"


def _share(part: Any, whole: Any) -> float | None:
    a, b = finite_number(part), finite_number(whole)
    return None if a is None or b is None or b <= 0 else a / b
