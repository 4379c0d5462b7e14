"""Every Triton kernel variant the dispatcher can launch builds for Hopper (sm_90) within its register
and shared-memory budget, checked ahead of time without a GPU (``python -m benchmarks.build_report``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from benchmarks import build_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not all((build_report.TOOLS / tool).exists() for tool in ("ptxas", "cuobjdump")),
    reason="Triton's bundled ptxas and cuobjdump are missing",
)


def test_variants_cover_every_pass_and_tile_configuration():
    labels = [v["label"] for v in build_report.variants()]
    for name in ("softmax_fwd", "entmax_max", "entmax_tau", "entmax_out", "entmax_solve", "dq"):
        assert any(label.startswith(f"rows {name} ") for label in labels), name
    assert any(label.startswith("cols ") for label in labels)
    assert any(label.startswith("tau ") for label in labels)
    for kernel in ("keys", "entries", "ranges"):  # the plan's kernels
        assert any(label.startswith(f"plan {kernel} ") for label in labels), kernel
    tiles = {(v["constants"].get("BLOCK_M"), v["constants"].get("BLOCK_N")) for v in build_report.variants()}
    assert {(64, 64), (32, 64), (32, 32)} <= tiles  # the three tile shapes _make_config picks on CUDA
    # without a causal mask or a pattern, d = 64 and T ≤ 2 take pipelined tiles that all load: built too
    open_rows = [v for v in build_report.variants() if v["label"].endswith(" non-causal")]
    assert {v["label"].split(" d=64 ")[1] for v in open_rows} == {"T=1 non-causal", "T=2 non-causal"}
    assert all(not v["constants"]["CAUSAL"] and not v["constants"]["SKIP_EMPTY"] for v in open_rows)
    assert {v["num_stages"] for v in open_rows} == {3}


def test_candidate_tiles_replace_the_defaults_in_every_variant_of_the_chosen_dtype():
    from attention_kernels.bucketed import triton_kernel as tb

    candidates = [tb.Tiles(128, 64, num_warps=8, num_stages=3), tb.Tiles(64, 128, num_warps=4, num_stages=2)]
    tiled = ("_rows_kernel", "_cols_kernel")  # the τ step and the plan take no tiles
    built = [v for v in build_report.variants(candidates, "bf16") if v["kernel"] in tiled]
    defaults = [v for v in build_report.variants(None, "bf16") if v["kernel"] in tiled]
    # α > 2 keeps its own tiles (its products with the gradient weights run in fp32)
    steep = tb._KIND_ENTMAX_STEEP.value
    assert any(v["constants"]["KIND"] == steep for v in defaults)
    # named tiles are built once per pass, as the causal defaults are (with the most code)
    defaults = [v for v in defaults if v["constants"]["KIND"] != steep and v["constants"]["CAUSAL"]]
    assert len(built) == len(candidates) * len(defaults)
    for tiles in candidates:
        mine = [v for v in built if v["label"].endswith(f" {tiles}")]
        assert len(mine) == len(defaults)
        for v in mine:
            assert v["dtype"] == "bf16"
            assert (v["constants"]["BLOCK_M"], v["constants"]["BLOCK_N"]) == (tiles.block_m, tiles.block_n)
            assert (v["num_warps"], v["num_stages"]) == (tiles.num_warps, tiles.num_stages)
    with pytest.raises(SystemExit):
        build_report.main(["--tiles", "64x64/w8"])


def test_spills_past_the_budget_and_excess_shared_memory_are_problems():
    row = {"local": 0, "stack": build_report.SPILL_BUDGET, "shared": 1024}
    assert build_report.problems(row, 90) == []
    assert build_report.problems({**row, "stack": build_report.SPILL_BUDGET + 8}, 90) == [
        f"spills {build_report.SPILL_BUDGET + 8} B per thread (budget {build_report.SPILL_BUDGET} B)"
    ]
    assert build_report.problems({**row, "shared": 300 * 1024}, 90) == [
        f"needs {300 * 1024} B of shared memory"
    ]


def test_every_variant_builds_for_hopper_within_budget():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.build_report", "--json", "--arch", "90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.stdout, proc.stderr[-2000:]
    rows = json.loads(proc.stdout.splitlines()[-1])
    assert len(rows) == len(build_report.variants())
    for row in rows:
        assert row["problems"] == [], row["label"]
        assert 0 < row["reg"] <= 255, row["label"]
    assert proc.returncode == 0


def test_report_refuses_the_interpreter(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit) as exit_info:
        build_report.main([])
    assert exit_info.value.code == 2
    assert "TRITON_INTERPRET=1 is set" in capsys.readouterr().err
