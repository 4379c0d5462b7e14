"""The one way numbers are written in tables: a number by its format, or a dash as wide."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.evaluation.report import DASH, formatted, num
from pipeline.evaluation.report.cells import signed


@pytest.mark.parametrize(
    ("value", "spec", "text"),
    [
        (1.23456, ".3f", "1.235"),
        (3, "3.0f", "  3"),
        (2.5, "9.2f", "     2.50"),
        (-0.25, "+.1f", "-0.2"),
        (1.5e-7, "8.1e", " 1.5e-07"),
        (np.float64(0.125), ".2f", "0.12"),
        (None, "9.2f", DASH.rjust(9)),
        (math.nan, "8.1e", DASH.rjust(8)),
        (math.inf, ".3f", DASH),
        (True, "5.1f", DASH.rjust(5)),
        ("1.0", "+.2f", DASH),
    ],
)
def test_a_finite_number_is_formatted_anything_else_is_a_dash_as_wide(value, spec, text) -> None:
    assert formatted(value, spec) == text


def test_the_report_cells_are_formatted_numbers() -> None:
    assert num(2, 3) == "2.000" and num(None, 2) == DASH
    assert signed(0.5, 2) == "+0.50" and signed(None, 2) == DASH
