"""benchmarks.fused_kernel: the fused kernel and the path it replaces, side by side, on tiny shapes."""

from __future__ import annotations

import json

import pytest

from attention_kernels.bucketed import id_sets
from attention_kernels.bucketed.block_attention import fused_kernel
from benchmarks import fused_kernel as bench


def test_the_two_paths_run_side_by_side_and_agree(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(id_sets, "MIN_QUERIES_PER_CLASS", 1)  # two ids per token: the id-set classes
    argv = ["--sizes", "256", "--buckets", "4", "--top", "2", "--reps", "2", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    report = json.loads((tmp_path / "fused_kernel.json").read_text())
    rows = report["results"]
    assert [(r["causal"], r["alpha"]) for r in rows] == [(False, 1.0), (False, 1.5), (True, 1.0), (True, 1.5)]
    for row in rows:
        assert row["fused_ran"] == (fused_kernel() is not None)
        assert row["max_abs_deviation"] < 1e-5  # the same attention, summed in another order
        assert row["unfused_over_fused"] == pytest.approx(row["unfused_ms"] / row["fused_ms"])
        assert row["efficiency_fused"] == pytest.approx(row["sdpa_ms"] / row["fused_ms"] * row["density"])
        assert 0.5 < row["density"] < 1  # top-2 of 4 buckets
    assert report["settings"]["top"] == 2 and report["settings"]["buckets"] == 4
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| n | causal |") and len(table) == 2 + len(rows) + 1


@pytest.mark.usefixtures("slots_at_any_share")
def test_a_pattern_joins_the_pairs_and_the_fused_kernel_still_runs(tmp_path):
    """Top-1 of 8 buckets (density 1/8), a window of 9 and a global token: the pattern adds its pairs
    outside the buckets (the global row and column: under 2 · 256 pairs a head)."""
    argv = ["--sizes", "256", "--buckets", "8", "--window", "9", "--global-tokens", "1", "--reps", "1"]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "fused_kernel.json").read_text())
    assert report["settings"]["window"] == 9 and report["settings"]["global_tokens"] == 1
    for row in report["results"]:
        assert row["fused_ran"] == (fused_kernel() is not None)
        assert row["max_abs_deviation"] < 1e-5
        assert 0.125 < row["density"] < 0.125 + 9 / 256 + 2 / 128  # less the pairs in a shared bucket


@pytest.mark.parametrize(
    "argv",
    [
        ["--top", "5", "--buckets", "4"],
        ["--reps", "0"],
        ["--sizes", "x"],
        ["--window", "4"],
        ["--global-tokens", "-1"],
    ],
)
def test_bad_options_are_refused_in_one_line(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        bench.main([*argv, "--out", str(tmp_path)])
    assert stopped.value.code == 2 and not (tmp_path / "fused_kernel.json").exists()
    assert len([line for line in capsys.readouterr().err.splitlines() if "error" in line]) == 1
