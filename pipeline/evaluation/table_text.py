"""The project's one way of writing a number or a dash into a table, and a markdown table's rows.

The report's tables and the kernels' benchmarks share it. It imports nothing beyond the standard library, so
the benchmarks run where only torch, Triton and entmax are installed (a bare GPU machine), without the
pipeline's parameter models.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pipeline.evaluation.pareto import finite_number

DASH = "—"


def formatted(value: Any, spec: str) -> str:
    """``value`` as a float formatted by the format spec ``spec`` (``".3f"``, ``"9.2f"``, ``"+.1f"``,
    ``"8.1e"``), or :data:`DASH` right-aligned to the spec's width where it is no finite number (missing,
    null, not a number, infinite)."""
    number = finite_number(value)
    if number is None:
        width = re.search(r"\d*$", spec.split(".")[0])
        return DASH.rjust(int(width.group() or 0))
    return format(number, spec)


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def table_row(cells: Sequence[str]) -> str:
    """One markdown table row of already formatted cells."""
    return "| " + " | ".join(cells) + " |"
