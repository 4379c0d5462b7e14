"""``python -m benchmarks.tune``: the tile sweep on tiny workloads, in Triton's interpreter without a GPU (its
times mean nothing there; what is checked is that every candidate is run, checked against the default tiles,
timed and summarised, and that a candidate computing something else is caught)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from attention_kernels.bucketed import triton_kernel
from attention_kernels.bucketed.triton_kernel import Tiles
from benchmarks import tune

pytestmark = pytest.mark.usefixtures("one_thread")

CUDA = torch.cuda.is_available()
DEVICE, DTYPE = ("cuda", torch.bfloat16) if CUDA else ("cpu", torch.float32)
CANDIDATES = ["16x16/w1/s1", "16x32/w1/s1"]


@pytest.fixture(autouse=True)
def tiny_grid(monkeypatch):
    """The interpreter's tiny grid on whichever device runs the tests."""
    monkeypatch.setattr(tune, "CUDA_GRID", tune.CPU_GRID)


def test_tiles_print_and_parse_back_and_refuse_impossible_shapes():
    tiles = Tiles(64, 128, num_warps=8, num_stages=3)
    assert str(tiles) == "64x128/w8/s3" and Tiles.parse(str(tiles)) == tiles
    every = Tiles(64, 64, num_warps=8, num_stages=3, skip_empty=False)
    assert str(every) == "64x64/w8/s3/all" and Tiles.parse(str(every)) == every
    refusals = {
        "64x64": "expected tiles as BMxBN/wWARPS/sSTAGES[/all]",
        "64x64/w8/s3/none": "expected tiles as",
        "48x64/w8/s2": "block_m must be a power of two; got 48",
        "64x8/w4/s2": "block_m and block_n must be at least 16; got 64×8",
        "64x64/w3/s2": "num_warps must be a power of two; got 3",
        "64x64/w4/s0": "num_stages must be a positive integer; got 0",
    }
    for text, message in refusals.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            Tiles.parse(text)


def test_the_default_candidates_parse_and_hold_each_mode_s_default_for_the_other():
    cuda = torch.device("cuda")

    def defaults_of(causal: bool) -> set[Tiles]:
        """The CUDA default tiles at d = 64, bf16, α = 1.5, over T = 1, 2."""
        bf16 = torch.bfloat16
        return {triton_kernel.default_tiles(64, t, bf16, cuda, alpha=1.5, causal=causal) for t in (1, 2)}

    defaults = {causal: defaults_of(causal) for causal in (False, True)}
    assert all(len(tiles) == 1 for tiles in defaults.values()) and defaults[False] != defaults[True]
    for pattern in (dict(radius=3), dict(global_tokens=1)):  # the pattern part has empty tiles to skip
        with_pattern = triton_kernel.default_tiles(64, 1, torch.bfloat16, cuda, alpha=1.5, **pattern)
        assert {with_pattern} == defaults[True] and with_pattern.skip_empty
    candidates = [Tiles.parse(text) for text in tune.CUDA_CANDIDATES]
    assert len(set(candidates)) == len(candidates)
    assert candidates[:2] == [*defaults[False], *defaults[True]]  # each mode measured with the other's tiles
    assert any(not tiles.skip_empty for tiles in candidates)  # the pipelined loads are among them
    assert all(Tiles.parse(text) for text in tune.CPU_CANDIDATES)


def test_deviation_is_the_worst_of_spread_and_largest_error():
    ones = torch.ones(4)
    assert tune.deviation([ones, ones], [ones, ones]) == 0.0
    assert tune.deviation([ones, 1.5 * ones], [ones, ones]) == pytest.approx(0.5)
    one_wrong = torch.tensor([1.0, 1.0, 1.0, 2.0])  # the norm ratio is 0.5, the largest error 1 of 1
    assert tune.deviation([one_wrong], [ones]) == pytest.approx(1.0)
    assert tune.deviation([torch.zeros(4)], [torch.zeros(4)]) == 0.0
    assert tune.deviation([ones], [torch.zeros(4)]) == math.inf
    assert tune.deviation([torch.tensor([1.0, float("nan"), 1.0, 1.0])], [ones]) == math.inf


def test_sweep_checks_and_times_every_candidate_on_every_workload(tmp_path, capsys):
    args = ["--device", DEVICE, "--sizes", "32", "--tiles", ",".join(CANDIDATES), "--out", str(tmp_path)]
    assert tune.main(args) == 0
    report = json.loads((tmp_path / "tune.json").read_text())
    jobs = tune.workloads({**tune.CPU_GRID, "sizes": [32]})
    candidates = [Tiles.parse(t) for t in CANDIDATES]
    default = triton_kernel.default_tiles(tune.CPU_GRID["dim"], 1, DTYPE, torch.device(DEVICE), alpha=1.5)
    assert default not in candidates and str(candidates[0]) in tune.CPU_CANDIDATES
    rows = report["results"]
    assert len(rows) == len(jobs) * (1 + len(candidates))
    assert {(r["n"], r["top"], r["alpha"], r["causal"]) for r in rows} == {
        (j["n"], j["top"], j["alpha"], j["causal"]) for j in jobs
    }
    for row in rows:
        assert row["status"] == "ok", row
        assert row["default"] == (row["tiles"] == str(default))
        assert row["deviation"] <= tune.TOLERANCE[DTYPE] == report["settings"]["tolerance"]
        assert row["deviation"] == 0.0 or not row["default"]  # the default is its own reference
        assert row["forward_ms"] > 0 and row["forward_backward_ms"] > 0
        assert 0 < row["density"] < 1
    summary = report["summary"]
    assert len(summary["workloads"]) == len(jobs)
    for entry in summary["workloads"]:
        here = [
            r
            for r in rows
            if (r["n"], r["top"], r["alpha"], r["causal"])
            == tuple(entry[key] for key in ("n", "top", "alpha", "causal"))
        ]
        fastest = min(here, key=lambda r: r["forward_backward_ms"])
        assert entry["best_forward_backward"] == fastest["tiles"]
        assert entry["speedup_forward_backward"] == pytest.approx(
            entry["default_forward_backward_ms"] / fastest["forward_backward_ms"]
        )
    tiles = summary["tiles"]
    assert set(tiles) == {str(default), *map(str, candidates)}
    assert tiles[str(default)]["forward_backward_over_default"] == pytest.approx(1.0)
    assert all(entry["forward_backward_workloads"] == len(jobs) for entry in tiles.values())
    printed = capsys.readouterr().out
    assert "best f+b" in printed and all(str(t) in printed for t in candidates)


def test_a_candidate_that_computes_something_else_is_reported_not_timed(tmp_path, monkeypatch):
    attention = triton_kernel.triton_bucketed_attention

    def off_for_narrow_tiles(*args, tiles, **options):
        out = attention(*args, tiles=tiles, **options)
        return out * 1.1 if tiles.block_m == 16 else out

    monkeypatch.setattr(triton_kernel, "triton_bucketed_attention", off_for_narrow_tiles)
    monkeypatch.setattr(tune, "CPU_GRID", {**tune.CPU_GRID, "tops": [1], "alphas": [1.0]})
    args = ["--device", DEVICE, "--sizes", "32", "--tiles", "16x32/w1/s1,64x32/w1/s1", "--out", str(tmp_path)]
    assert tune.main(args) == 0
    rows = json.loads((tmp_path / "tune.json").read_text())["results"]
    wrong = [r for r in rows if r["tiles"] == "16x32/w1/s1"]
    assert wrong and all(r["status"].startswith("wrong: deviation") for r in wrong)
    assert all(r["deviation"] == pytest.approx(0.1, abs=0.01) for r in wrong)  # bf16 rounds 1.1 on a GPU
    assert all("forward_ms" not in r for r in wrong)
    assert all(r["status"] == "ok" for r in rows if r["tiles"] != "16x32/w1/s1")


def test_a_spent_budget_skips_the_candidates_yet_measures_the_defaults(tmp_path, capsys):
    assert tune.main(["--device", DEVICE, "--budget-s", "0", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "tune.json").read_text())
    defaults = [r for r in report["results"] if r["default"]]
    assert defaults and all(r["status"] == "ok" and "forward_ms" in r for r in defaults)
    candidates = [r for r in report["results"] if not r["default"]]
    assert candidates and {r["status"] for r in candidates} == {"skipped: the time budget is spent"}
    assert set(report["summary"]["tiles"]) == {r["tiles"] for r in defaults}  # no candidate was timed
    assert all("default_forward_ms" in w for w in report["summary"]["workloads"])
    assert "skipped: the time budget is spent" in capsys.readouterr().out


def test_only_a_cuda_error_marks_the_device_unusable():
    sticky = ("CUDA error: an illegal memory access", "Triton Error [CUDA]: misaligned address")
    for text in sticky:
        assert tune.leaves_device_unusable(RuntimeError(text)), text
    for text in ("out of resource: shared memory, Required: 262144", "CUDA out of memory. Tried to allocate"):
        assert not tune.leaves_device_unusable(RuntimeError(text)), text


def test_the_report_so_far_is_saved_after_every_pass_defaults_first():
    saved = []
    grid = {**tune.CPU_GRID, "sizes": [32, 48]}
    tiles = [Tiles.parse(t) for t in CANDIDATES]
    report = tune.run(
        grid, tiles, torch.device(DEVICE), 0.0, lambda report: saved.append(len(report["results"]))
    )
    jobs = len(tune.workloads(grid))
    assert saved == [jobs * (i + 1) for i in range(1 + len(tiles))]
    assert [row["default"] for row in report["results"]] == [True] * jobs + [False] * (jobs * len(tiles))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tiles", "64x48/w4/s2"], "block_n must be a power of two; got 48"),
        (["--budget-s", "-1"], "--budget-s must be ≥ 0"),
        (["--sizes", "8"], "expected lengths ≥ 16"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        tune.main(["--device", DEVICE, "--out", str(tmp_path), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "tune.json").exists()
