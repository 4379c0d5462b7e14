"""Smoke test of ``python -m benchmarks.attention --device cpu --quick``: the report's fields and the
figure."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks import attention as bench
from pipeline.evaluation.report import DASH


def test_balanced_buckets_hold_equal_counts():
    ids = bench.balanced_buckets(2, 3, 96, 8, 2, seed=0)
    assert ids.shape == (2, 3, 96, 2) and ids.dtype == torch.int32
    counts = torch.nn.functional.one_hot(ids.long(), 8).sum(2)  # (2, 3, 2, 8) tokens per bucket
    assert (counts == 96 // 8).all()
    assert not torch.equal(ids[..., 0], ids[..., 1])  # two independent assignments


def test_density_counts_valid_pairs():
    assert bench.density(32, 1, 2, 8, causal=False) == pytest.approx(32 / 128)
    assert bench.density(36, 1, 1, 8, causal=True) == pytest.approx(1.0)


def clocked_calls(monkeypatch, durations_ms: list[float]) -> tuple[Callable[[], None], list[float]]:
    """The wall clock (:mod:`pipeline.timer`'s) made one that only the returned call advances: its i-th call
    takes ``durations_ms[i]`` milliseconds (the last one again past the end). Also returns the durations
    taken so far, one per call."""
    now, taken = [0.0], []

    def perf_counter() -> float:
        return now[0]

    monkeypatch.setattr(time, "perf_counter", perf_counter)

    def call() -> None:
        taken.append(durations_ms[min(len(taken), len(durations_ms) - 1)])
        now[0] += taken[-1] / 1e3

    return call, taken


def test_cpu_timings_are_the_median_after_a_warm_up_repeating_quick_calls_within_the_budget(monkeypatch):
    # three repetitions after a slow warm-up: their median (not their mean, 7/3, nor one with the warm-up, 3)
    call, taken = clocked_calls(monkeypatch, [50.0, 4.0, 1.0, 2.0])
    assert bench._median_wall_ms(call, 3, budget_s=0.0) == pytest.approx(2.0)
    assert len(taken) == 1 + 3  # no time to spare: the given count
    # quick calls repeat while they have taken less than the budget, up to the most repetitions
    call, taken = clocked_calls(monkeypatch, [3.0])
    assert bench._median_wall_ms(call, 1, budget_s=0.010) == pytest.approx(3.0)
    assert len(taken) == 1 + 4  # 3, 6 and 9 ms are under 10 ms: a fourth call
    call, taken = clocked_calls(monkeypatch, [50.0, *range(1, 40)])
    assert bench._median_wall_ms(call, 3, budget_s=60.0) == pytest.approx((1 + bench.CPU_MAX_REPS) / 2)
    assert len(taken) == 1 + bench.CPU_MAX_REPS  # the warm-up, then the most repetitions (1 … 25 ms)
    # slow calls keep the given count, and at least one call is timed
    call, taken = clocked_calls(monkeypatch, [50.0, 40e3, 10e3, 30e3])
    assert bench._median_wall_ms(call, 3, budget_s=60.0) == pytest.approx(30e3)
    assert len(taken) == 1 + 3
    call, taken = clocked_calls(monkeypatch, [50.0, 7.0])
    assert bench._median_wall_ms(call, 0, budget_s=0.0) == pytest.approx(7.0)
    assert len(taken) == 2


def test_the_cpu_table_lists_every_row_in_order_with_ratios_of_its_times():
    """The printed table: every column's title, a line per row in the order of the lengths, and speed-up,
    efficiency and ent/sm cells that are the ratios of the times (and densities) in the same table."""
    rows = []
    for n, sdpa_ms in [(1024, 20.0), (2048, 80.0)]:
        base = {"n": n, "causal": False, "status": "ok", "top": 1, "pattern": False, "density": 1 / 16}
        rows += [
            {**base, "method": "sdpa", "alpha": 1.0, "forward_ms": sdpa_ms, "top": None, "density": 1.0},
            {**base, "method": "ours", "alpha": 1.0, "forward_ms": 4.0},
            {**base, "method": "ours", "alpha": 1.5, "forward_ms": 5.0},
        ]
    bench.add_ratios(rows)
    header, *lines = bench.cpu_table({"results": rows}).splitlines()
    titles = ("n", "method", "alpha", "density", "fwd ms", "x sdpa", "eff fwd", "ent/sm", "overhead")
    assert all(f" {title} " in f" {header} " for title in (*titles, "status"))
    cells = [line.split() for line in lines]  # one word a cell: a dash where the row has no value
    assert [(int(c[0]), c[4], float(c[5])) for c in cells] == [
        (n, method, alpha)
        for n in (1024, 2048)
        for method, alpha in (("sdpa", 1), ("ours", 1), ("ours", 1.5))
    ]
    for sdpa, softmax, entmax in (cells[:3], cells[3:]):
        assert sdpa[9] == sdpa[10] == sdpa[13] == DASH  # no ratios on the baseline's own row
        for ours in (softmax, entmax):
            density, forward, speedup, efficiency = (float(ours[i]) for i in (6, 7, 9, 10))
            assert speedup == pytest.approx(float(sdpa[7]) / forward, abs=0.005)  # 2 decimals printed
            assert efficiency == pytest.approx(speedup * density, abs=0.005)
        assert float(entmax[13]) == pytest.approx(float(entmax[7]) / float(softmax[7]), abs=0.005)


@pytest.mark.parametrize("wide", [True, False])
def test_the_cpu_report_names_the_processor_and_the_products_its_blocks_ran_on(monkeypatch, wide):
    """Ratios against SDPA differ by processor and path (the C++ products on AVX-512, else torch.bmm):
    the report says which ran, as the dispatch decides it, and the table prints it below the rows."""
    import attention_kernels.bucketed.block_products as products
    import attention_kernels.native as native

    monkeypatch.setattr(native, "_cpuinfo", lambda: ["processor\t: 0", "model name\t: Example CPU 9000"])
    monkeypatch.setattr(products, "wide_kernel", lambda: "the wide library" if wide else None)
    facts = bench.cpu_facts()
    assert facts["device_name"] == "Example CPU 9000"
    assert facts["block_products"] == ("C++ on 512-bit vectors" if wide else "torch.bmm of gathered rows")
    built = native.library("block_products")
    assert facts["vector_bits"] == (None if built is None else 8 * built.vector_bytes())
    last = bench.cpu_table({"results": [], **facts}).splitlines()[-1]
    assert last.startswith("on Example CPU 9000 (") and last.endswith(facts["block_products"])


def test_processor_name_falls_back_to_the_platform_without_a_model_name(monkeypatch):
    import platform

    import attention_kernels.native as native

    monkeypatch.setattr(native, "_cpuinfo", lambda: ["processor\t: 0"])
    assert native.processor_name() == (platform.processor() or platform.machine())


def test_quick_cpu_run_writes_report_and_figure(tmp_path, capsys):
    assert bench.main(["--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["device"] == "cpu" and report["quick"] is True and report["settings"]["threads"] == 1
    assert report["block_products"] in ("C++ on 512-bit vectors", "torch.bmm of gathered rows")
    assert report["settings"]["buckets"] == 16 and report["settings"]["alphas"] == [1.0, 1.5]
    rows = report["results"]
    cfg = bench.CPU_QUICK
    expected = {
        (n, c, m, None, None, a)
        for n in cfg["sizes"]
        for c in (False, True)
        for m, a in (("sdpa", 1.0), ("dense_entmax", 1.5))
    }
    expected |= {
        (n, c, "ours", t, p, a)
        for n in cfg["sizes"]
        for c in (False, True)
        for t in cfg["tops"]
        for p in (False, True)
        for a in (1.0, 1.5)
    }
    assert {(r["n"], r["causal"], r["method"], r["top"], r["pattern"], r["alpha"]) for r in rows} == expected
    sdpa = {(r["n"], r["causal"]): r for r in rows if r["method"] == "sdpa"}
    for row in rows:
        assert row["status"] == "ok", row
        assert row["forward_ms"] > 0 and row["forward_backward_ms"] > 0
        assert row["extra_mb_forward_backward"] >= 0 and row["peak_rss_mb_forward_backward"] > 0
        if row["method"] != "ours":
            assert row["density"] == 1.0
            continue
        assert 0 < row["density"] < 1
        if row["top"] == 1 and not row["pattern"]:
            per_head = row["n"] ** 2 // 16 if not row["causal"] else None
            assert per_head is None or row["pairs"] == per_head * report["settings"]["heads"]
        dense = sdpa[(row["n"], row["causal"])]
        for phase in ("forward", "forward_backward"):
            assert row[f"speedup_{phase}"] == pytest.approx(dense[f"{phase}_ms"] / row[f"{phase}_ms"])
            assert row[f"efficiency_{phase}"] == pytest.approx(row[f"speedup_{phase}"] * row["density"])
            assert row[f"entmax_over_softmax_{phase}"] > 0
        assert row["predict_ms"] > 0 and row["predict_linear_ms"] > 0 and row["plan_ms"] > 0
        for overhead, predict in bench.OVERHEADS.items():
            added = row[predict] + row["plan_ms"]
            assert row[overhead] == pytest.approx(added / row["forward_ms"])
    png = (tmp_path / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left
    printed = capsys.readouterr().out
    assert all(title in printed for title in ("dense_entmax", "eff f+b", "overhead", "ovh lin"))
    sizes = bench.INDEX_SIZES["quick"]
    indexed = report["indexed"]
    assert indexed["settings"]["rank"] == bench.INDEX_RANK and indexed["settings"]["threads"] == 1
    indexed_methods = [
        f"indexed_{mode}{suffix}"
        for mode in ("certified", "approximate")
        for suffix in ("", "_blocks", "_clustered")
    ]
    methods = ("sdpa", "dense_entmax", *indexed_methods)
    assert {(r["inputs"], r["n"], r["causal"], r["method"]) for r in indexed["results"]} == {
        (kind, n, c, m)
        for kind in ("local", "scattered")
        for n in sizes
        for c in (False, True)
        for m in methods
    }
    for row in indexed["results"]:
        assert row["status"] == "ok", row
        assert row["forward_ms"] > 0
        if row["method"].startswith("indexed"):
            assert row["forward_backward_ms"] > 0 and 0 <= row["blocks_skipped"] <= 1
            assert row["sparse_ms"] > 0 and row["bounds_ms"] >= 0
            if row["method"].endswith(("_blocks", "_clustered")):  # the block path's pass 1 is timed
                assert row["indexer_ms"] > 0
            assert row["speedup_forward_vs_sdpa"] > 0 and row["speedup_forward_vs_dense_entmax"] > 0
        if row["method"].startswith("indexed_certified"):
            assert row["max_abs_error"] < 1e-4  # exact up to float32 round-off
    assert "indexed_certified" in printed


def test_only_indexed_runs_just_the_indexed_comparison(tmp_path, capsys):
    assert bench.main(["--device", "cpu", "--quick", "--only", "indexed", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["results"] == []
    assert {r["status"] for r in report["indexed"]["results"]} == {"ok"}
    printed = capsys.readouterr().out
    assert "indexed_certified" in printed and "eff f+b" not in printed
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--suite", "gpu", "--only", "indexed", "--out", str(tmp_path)])


def test_only_bucketed_at_chosen_sizes(tmp_path, capsys, monkeypatch):
    # the options' plumbing: each measurement in this process (the test above runs them in their own)
    monkeypatch.setattr(bench, "_spawn_cpu_worker", bench.cpu_worker)
    args = ["--device", "cpu", "--quick", "--only", "bucketed", "--sizes", "64", "--out", str(tmp_path)]
    assert bench.main([*args, "--buckets", "4"]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert "indexed" not in report and {r["n"] for r in report["results"]} == {64}
    assert report["settings"]["buckets"] == 4
    top1 = [r for r in report["results"] if r["method"] == "ours" and r["top"] == 1 and not r["pattern"]]
    assert top1 and all(r["pairs"] == 2 * 64 * 64 // 4 for r in top1 if not r["causal"])  # 4 buckets of 16
    assert bench.sizes_list("1024,4096") == [1024, 4096]
    assert "indexed attention" not in capsys.readouterr().out
    for bad in ("8", "64,x", ""):
        with pytest.raises(SystemExit):
            bench.main(["--device", "cpu", "--sizes", bad, "--out", str(tmp_path)])
    with pytest.raises(SystemExit):  # the CPU suite takes one bucket count
        bench.main(["--device", "cpu", "--buckets", "8,16", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--suite", "gpu", "--buckets", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):  # the CPU suite runs both kinds of inputs
        bench.main(["--device", "cpu", "--index-inputs", "local", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main(
            ["--device", "cpu", "--suite", "gpu", "--index-inputs", "local,random", "--out", str(tmp_path)]
        )
    assert bench.inputs_list("scattered,local") == ["scattered", "local"]


def test_structured_inputs_have_small_local_support():
    from entmax import entmax15

    q, k, v, qi, ki = bench.structured_inputs(1, 2, 256, 64, 8, seed=0)
    assert q.shape == k.shape == v.shape == (1, 2, 256, 64) and qi.shape == ki.shape == (1, 2, 256, 8)
    support = (entmax15(q @ k.transpose(-1, -2) / 8, dim=-1) > 0).sum(-1)
    assert support.min() >= 1 and support.max() <= 64


def test_gpu_suite_runs_on_cpu_tensors(tmp_path, capsys, monkeypatch):
    """The GPU comparison's plumbing (every method, speedups, efficiencies, table, figure) on CPU tensors, at
    the length and bucket count ``--sizes`` and ``--buckets`` name, the results so far saved as they come."""
    from pipeline import atomic

    saved = []
    write_json = atomic.write_json
    monkeypatch.setattr(atomic, "write_json", lambda path, obj: saved.append(json.loads(json.dumps(obj))))
    args = ["--device", "cpu", "--suite", "gpu", "--sizes", "48", "--buckets", "3", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    # after n = 48 without, then with causality, then the indexed rows of each, then the final report
    assert len(saved) == 5
    assert {r["causal"] for r in saved[0]["results"]} == {False}
    assert not any(r["method"].startswith("indexed") for r in saved[1]["results"])
    assert {r["causal"] for r in saved[2]["results"] if r["method"].startswith("indexed")} == {False}
    assert saved[3]["results"] == saved[4]["results"]
    write_json(tmp_path / "bench.json", saved[-1])
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["suite"] == "gpu" and report["device"] == "cpu" and report["settings"]["dtype"] == "float32"
    rows = report["results"]
    cfg = {**bench.GPU_ON_CPU, "buckets": [3]}
    assert {r["n"] for r in rows} == {48} and {r["buckets"] for r in rows} == {None, 3}
    n = 48
    for causal in (False, True):
        here = {
            (r["method"], r["buckets"], r["top"]): r for r in rows if (r["n"], r["causal"]) == (n, causal)
        }
        sdpa = here[("sdpa_flash", None, None)]
        assert sdpa["status"] == "ok" and here[("dense_entmax", None, None)]["status"] == "ok"
        assert here[("adasplash", None, None)]["status"].startswith("failed")  # not installed on CPU
        for buckets in cfg["buckets"]:
            for top in cfg["tops"]:
                entmax = here[("ours_entmax", buckets, top)]
                softmax = here[("ours_softmax", buckets, top)]
                assert entmax["status"] == softmax["status"] == "ok"
                assert 0 < entmax["density"] < 1
                for row in (entmax, softmax):
                    assert row["speedup_forward"] == pytest.approx(sdpa["forward_ms"] / row["forward_ms"])
                    assert row["predict_ms"] > 0 and row["predict_linear_ms"] > 0 and row["plan_ms"] > 0
                    assert row["overhead_forward"] == pytest.approx(
                        (row["predict_ms"] + row["plan_ms"]) / row["forward_ms"]
                    )
                    assert row["efficiency_forward"] == pytest.approx(row["speedup_forward"] * row["density"])
                assert entmax["entmax_over_softmax_forward"] == pytest.approx(
                    entmax["forward_ms"] / softmax["forward_ms"]
                )
                flex = here[("flex", buckets, top)]
                assert flex["forward_ms"] > 0  # FlexAttention compiles its forward on CPU, not its backward
                assert "backward on CPU" in flex["status"]
                # the PyTorch path beside the Triton kernel: top-1 softmax without a causal mask only
                torch_row = here.get((bench.TORCH_PATH, buckets, top))
                assert (torch_row is not None) == (top == 1 and not causal)
                if torch_row is not None:
                    assert torch_row["status"] == "ok" and torch_row["density"] == softmax["density"]
                    assert torch_row["efficiency_forward_backward"] == pytest.approx(
                        sdpa["forward_backward_ms"] / torch_row["forward_backward_ms"] * torch_row["density"]
                    )
        dense = here[("dense_entmax", None, None)]
        for mode in bench.INDEX_MODES:  # on the default inputs, beside the same SDPA and dense entmax
            indexed = here[(f"indexed_{mode}", None, None)]
            assert indexed["status"] == "ok" and indexed["inputs"] == "local"
            assert indexed["speedup_forward"] == pytest.approx(sdpa["forward_ms"] / indexed["forward_ms"])
            assert indexed["speedup_forward_backward_vs_dense_entmax"] == pytest.approx(
                dense["forward_backward_ms"] / indexed["forward_backward_ms"]
            )
            assert 0 <= indexed["blocks_skipped"] <= 1 and indexed["predicted_mean"] > 0
            assert indexed["sparse_ms"] > 0
        assert here[("indexed_certified", None, None)]["max_abs_error"] < 1e-4  # exact up to fp32 round-off
    assert (tmp_path / "bench.png").read_bytes().startswith(b"\x89PNG")
    printed = capsys.readouterr().out
    assert "ours_entmax" in printed and "indexed_approximate" in printed


@pytest.mark.parametrize(("top", "pattern", "causal"), [(1, False, True), (2, True, False)])
def test_flex_on_sorted_tokens_computes_our_softmax_attention(top, pattern, causal):
    """The FlexAttention baseline attends the same pairs as ours (sorting, the block mask and unsorting
    included), so the two differ by round-off only."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, 16, generator=gen) for _ in range(3))
    ids = bench.balanced_buckets(1, 2, 96, 4, top, seed=top)
    options = {"window": 9, "global_tokens": 2} if pattern else {}
    with torch.no_grad():
        flex = bench._flex_sorted(causal, options)(q, k, v, ids)
        ours = bench._ours(1.0, causal, options)(q, k, v, ids)
    torch.testing.assert_close(flex, ours, rtol=1e-4, atol=1e-5)


def test_the_cpu_worker_measures_flex_beside_ours():
    spec = {
        "n": 64,
        "heads": 2,
        "dim": 16,
        "reps": 1,
        "budget_s": 0.0,
        "causal": True,
        "top": 1,
        "buckets": 16,
    }
    spec["method"] = bench.FLEX
    [row] = bench.cpu_worker({**spec, "pattern": False})
    assert row["status"] == "ok" and row["alpha"] == 1.0
    assert row["forward_ms"] > 0 and 0 < row["density"] < 1
    assert row["pair_gflops_forward"] == pytest.approx(4 * 16 * row["pairs"] / (row["forward_ms"] * 1e6))
    assert "forward_backward_ms" not in row  # FlexAttention has no backward on CPU tensors
    sdpa = {**row, "method": "sdpa", "top": None, "pattern": None, "density": 1.0}
    report = {"results": [sdpa, row]}
    bench.add_ratios(report["results"])
    assert row["efficiency_forward"] == pytest.approx(sdpa["forward_ms"] / row["forward_ms"] * row["density"])
    figure, axes = plt.subplots(2, 2, squeeze=False)
    bench.cpu_plot(report, axes)  # the figure draws a row without a backward
    assert [line.get_label() for line in axes[1][0].lines] == ["flex α=1", "sdpa"]  # causal: second row
    speedup = {line.get_label(): line.get_ydata() for line in axes[1][1].lines if line.get_label()[0] != "_"}
    assert speedup["flex α=1"] == pytest.approx([row["speedup_forward"]])
    assert not axes[0][0].lines  # no full-attention rows
    plt.close(figure)


def test_the_cpu_figure_sets_each_speed_up_beside_its_ideal():
    """Per top, ours' forward speed-up over SDPA against n, beside 1/density (window and global apart)."""

    def row(n: int, method: str, ms: float, **spec) -> dict:
        base = {"n": n, "causal": False, "status": "ok", "forward_ms": ms, "top": None, "pattern": None}
        return {**base, "method": method, "alpha": 1.0, "density": 1.0, **spec}

    rows = []
    for n, sdpa_ms in [(1024, 20.0), (2048, 80.0)]:
        rows += [
            row(n, "sdpa", sdpa_ms),
            row(n, "ours", 4.0, top=1, pattern=False, density=1 / 16),
            row(n, "ours", 8.0, top=1, pattern=True, density=1 / 8),
        ]
    bench.add_ratios(rows)
    figure, axes = plt.subplots(2, 2, squeeze=False)
    bench.cpu_plot({"results": rows}, axes)
    lines = {
        line.get_label(): list(line.get_ydata()) for line in axes[0][1].lines if line.get_label()[0] != "_"
    }
    assert lines["ours α=1"] == pytest.approx([5.0, 20.0])
    assert lines["ours α=1 +pattern"] == pytest.approx([2.5, 10.0])
    assert lines["ideal"] == pytest.approx([16.0, 16.0])
    assert lines["ideal +pattern"] == pytest.approx([8.0, 8.0])
    plt.close(figure)
