"""The speed-up figure and the speed table's ratios to softmax SDPA, from hand-made speed rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.evaluation.report.speed import speed_table
from pipeline.plots.pareto import write_report_plots
from pipeline.plots.speed import plot_speedup, speedups
from tests.pipeline.evaluation.synthetic import synthetic_evaluation
from tests.pipeline.plots.test_pareto_plots import assert_picture


def speed_rows() -> list[dict]:
    """SDPA, the dense teacher and a certified indexer at two contexts (listed out of order), one row with no
    backward timing and one model never timed beside SDPA at 4096."""
    rows = []
    for n, sdpa, dense, certified in (
        (2048, (0.4, 1.2), (0.8, 2.0), (0.2, 0.4)),
        (1024, (0.1, 0.3), (0.2, 0.6), (0.08, 0.1)),
    ):
        rows += [
            {
                "context": n,
                "model": "softmax (sdpa)",
                "forward_seconds": sdpa[0],
                "forward_backward_seconds": sdpa[1],
            },
            {
                "context": n,
                "model": "entmax (dense)",
                "forward_seconds": dense[0],
                "forward_backward_seconds": dense[1],
            },
            {
                "context": n,
                "model": "indexer certified",
                "forward_seconds": certified[0],
                "forward_backward_seconds": certified[1],
            },
        ]
    rows.append({"context": 4096, "model": "indexer certified", "forward_seconds": 1.0})
    rows.append(
        {"context": 1024, "model": "kmeans", "forward_seconds": 0.05, "forward_backward_seconds": None}
    )
    return rows


def test_speedups_are_sdpa_over_the_model_per_context_in_order():
    forward = speedups(speed_rows(), "forward_seconds")
    assert forward["indexer certified"] == [(1024, pytest.approx(1.25)), (2048, pytest.approx(2.0))]
    assert forward["entmax (dense)"] == [(1024, pytest.approx(0.5)), (2048, pytest.approx(0.5))]
    assert forward["kmeans"] == [(1024, pytest.approx(2.0))]
    both = speedups(speed_rows(), "forward_backward_seconds")
    assert both["indexer certified"] == [(1024, pytest.approx(3.0)), (2048, pytest.approx(3.0))]
    assert "kmeans" not in both and "softmax (sdpa)" not in both  # no backward timing; the reference itself


def test_the_figure_is_drawn_or_says_why_not(tmp_path: Path):
    evaluation = synthetic_evaluation() | {"speed": speed_rows()}
    plot_speedup(evaluation, tmp_path / "drawn.png")
    drawn = assert_picture(tmp_path / "drawn.png")
    plot_speedup(
        {"speed": [{"context": 1024, "model": "kmeans", "forward_seconds": 0.1}]}, tmp_path / "no.png"
    )
    empty = assert_picture(tmp_path / "no.png", min_height=50, min_width=100)
    assert drawn.size > empty.size
    files = write_report_plots(evaluation, tmp_path / "report", recall_target=0.95)
    assert files["speedup"] == tmp_path / "report" / "speedup.png" and files["speedup"].is_file()


def test_the_speed_table_gives_both_phases_against_sdpa():
    table = speed_table({"speed": speed_rows()})
    certified = next(line for line in table.splitlines() if line.startswith("| 2048 | indexer certified |"))
    cells = [cell.strip() for cell in certified.strip("|").split("|")]
    # forward: × dense 4.00, × SDPA 2.00; forward + backward: × dense 5.00, × SDPA 3.00
    assert cells[6:8] == ["4.00×", "2.00×"] and cells[9:11] == ["5.00×", "3.00×"]


def test_the_ratio_to_sdpa_gives_the_range_of_the_rounds_paired_ratios():
    """Where both rows kept their passes, × SDPA is followed by the range of the k-th passes' ratios; rows
    without passes, or with unequal counts, keep the ratio of medians alone."""
    rows = speed_rows()
    sdpa = next(row for row in rows if row["context"] == 2048 and row["model"] == "softmax (sdpa)")
    certified = next(row for row in rows if row["context"] == 2048 and row["model"] == "indexer certified")
    sdpa["pass_seconds"] = {"forward_seconds": [0.4, 0.5, 0.3], "forward_backward_seconds": [1.2, 1.2]}
    certified["pass_seconds"] = {
        "forward_seconds": [0.2, 0.2, 0.25],
        "forward_backward_seconds": [0.4, 0.4, 0.4],
    }
    line = next(
        line
        for line in speed_table({"speed": rows}).splitlines()
        if line.startswith("| 2048 | indexer certified |")
    )
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    # rounds: 0.4 / 0.2 = 2.00, 0.5 / 0.2 = 2.50, 0.3 / 0.25 = 1.20; backward passes unequal in number
    assert cells[7] == "2.00× (1.20–2.50)" and cells[10] == "3.00×"
    line = next(
        line for line in speed_table({"speed": rows}).splitlines() if line.startswith("| 2048 | softmax")
    )
    assert [cell.strip() for cell in line.strip("|").split("|")][7] == "1.00×"  # the reference: no range
