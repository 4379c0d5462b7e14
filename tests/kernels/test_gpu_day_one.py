"""The GPU day-one script (``benchmarks/gpu_day_one.sh``) in its smoke mode: CPU tensors, Triton's
interpreter, tiny sizes. The whole run, what its files say (kernel tests run, tuning candidates checked
against the default tiles, a speed-table row per provider), and that a failure or a timeout fails the run
without stopping the steps after it; then the summary's rules on hand-made outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_day_one as day_one
from benchmarks import tune
from pipeline.evaluation.table_text import formatted

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_day_one.sh"
PROVIDERS = ["sdpa_flash", "ours_entmax", "ours_softmax", "flex", "indexed_certified", "indexed_approximate"]


# the pipeline's own dependencies, which a bare GPU image lacks: the day-one steps must not need them
PIPELINE_ONLY = ("pydantic", "datasets", "dvc", "sklearn", "faiss", "sacrebleu", "transformers", "tokenizers")


def without_packages(folder: Path, packages: tuple[str, ...]) -> Path:
    """A folder whose ``sitecustomize.py``, on PYTHONPATH, makes ``packages`` missing in every interpreter
    started with it: ``import`` raises ModuleNotFoundError, ``importlib.util.find_spec`` gives None, as on a
    machine without them."""
    folder.mkdir(parents=True)
    lines = [f"sys.modules[{name!r}] = None" for name in packages]
    (folder / "sitecustomize.py").write_text("import sys\n" + "\n".join(lines) + "\n")
    return folder


def run_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The script under this interpreter, one intra-op thread, none of the caller's day-one settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DAY_ONE_") and k != "OUT"}
    base.update(PYTHON=sys.executable, OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=base, capture_output=True, text=True, timeout=900
    )


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the markdown tables in ``text``, each as {column: cell} (the header row gives the keys)."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("| "):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if header is None:
            header = cells
        elif set(cells) != {"---"}:
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def cuda_test_files() -> list[str]:
    """The kernel test files that switch to CUDA tensors where a GPU is: those the script runs."""
    files = sorted((ROOT / "tests" / "kernels").glob("test_*.py"))
    return [
        str(f.relative_to(ROOT))
        for f in files
        if "cuda.is_available" in f.read_text() and f != Path(__file__)
    ]


@pytest.mark.slow
def test_smoke_run_writes_the_kernel_tests_the_tuning_and_the_speed_table(tmp_path):
    out = tmp_path / "day one"  # a space in the path
    # as on a bare GPU image: none of the pipeline's own dependencies
    done = run_script("--smoke", str(out), PYTHONPATH=str(without_packages(tmp_path / "bare", PIPELINE_ONLY)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    facts = json.loads((out / "facts.json").read_text())
    assert facts["cuda_available"] is False and facts["triton_interpret"] is True and facts["triton"]

    # one test of every file that runs on CUDA tensors, each named in the log and the JUnit XML
    tests = day_one.kernel_tests(out / "kernel_tests.xml")
    files = cuda_test_files()
    assert len(files) >= 4 and tests["tests"] == tests["passed"] == len(files)
    log = (out / "kernel_tests.log").read_text()
    for path in files:
        assert f"PASSED {path}::" in log

    # the tuning: default tiles on every workload, each candidate checked against them before it is timed
    report = json.loads((out / "tune" / "tune.json").read_text())
    assert report["candidates"] == tune.CPU_CANDIDATES and report["device"] == "cpu"
    defaults = [r for r in report["results"] if r["default"]]
    assert len(defaults) == len(tune.workloads({**tune.CPU_GRID, "sizes": [32]}))
    assert all(r["status"] == "ok" and r["deviation"] == 0 and r["forward_ms"] > 0 for r in defaults)
    candidates = [r for r in report["results"] if not r["default"]]
    assert {r["tiles"] for r in candidates} == set(tune.CPU_CANDIDATES)
    for row in candidates:
        if row["status"] == "ok":
            assert row["deviation"] <= tune.TOLERANCE[torch.float32] and row["forward_backward_ms"] > 0
        else:
            assert row["status"] == "skipped: the time budget is spent"
    assert any(r["status"] == "ok" for r in candidates)
    tune_md = (out / "tune.md").read_text()
    assert "best f+b" in tune_md and all(tiles in tune_md for tiles in tune.CPU_CANDIDATES)

    # the speed table: every provider, full and causal, its cells those of bench.json
    bench = json.loads((out / "bench" / "bench.json").read_text())
    assert bench["suite"] == "gpu" and bench["device"] == "cpu" and {r["n"] for r in bench["results"]} == {64}
    table = markdown_rows((out / "speed_table.md").read_text())
    assert len(table) == len(bench["results"])
    for cell, row in zip(table, bench["results"], strict=True):
        assert cell["method"] == row["method"] and cell["status"] == row["status"]
        assert cell["fwd ms"] == formatted(row.get("forward_ms"), ".3f")
        assert cell["fwd+bwd ms"] == formatted(row.get("forward_backward_ms"), ".3f")
    for causal in ("no", "yes"):
        here = [c for c in table if c["causal"] == causal]
        for method in PROVIDERS:
            assert any(c["method"] == method for c in here), (causal, method)
        for method in ("ours_entmax", "ours_softmax", "flex"):  # bucketed: top-1 and top-2
            assert {c["top"] for c in here if c["method"] == method} == {"1", "2"}
        torch_tops = [c["top"] for c in here if c["method"] == "ours_torch"]  # the PyTorch path's row
        assert torch_tops == (["1"] if causal == "no" else [])
        for c in here:
            if c["method"] in day_one.OURS:
                assert c["status"] == "ok" and c["fwd+bwd ms"] != "—"
            if c["method"].startswith("indexed"):
                assert c["inputs"] == "local" and 0 <= float(c["skipped"]) <= 1
            if c["method"] == "flex":
                assert c["fwd ms"] != "—"  # FlexAttention has a forward on CPU tensors, not a backward
        certified = next(c for c in here if c["method"] == "indexed_certified")
        assert float(certified["max err"]) < 1e-4  # exact up to fp32 round-off

    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["smoke"] and summary["failed"] == []
    assert {step: entry["status"] for step, entry in summary["steps"].items()} == dict.fromkeys(
        day_one.STEPS, "ok"
    )
    assert summary["steps"]["bench"]["competitors_not_ok"]  # adasplash, FlexAttention's CPU backward
    assert "status: ok" in done.stdout and "speed_table.md" in done.stdout
    summary_md = (out / "summary.md").read_text()
    assert summary_md.count("status: ok") == 1
    # one file with every figure: the step lines, the speed table, the tuning's table
    assert markdown_rows(summary_md) == table and "## Tile tuning" in summary_md and "best f+b" in summary_md


@pytest.mark.slow
def test_a_failing_kernel_test_or_a_timeout_fails_the_run_yet_the_later_steps_run(tmp_path):
    """A kernel test fails: the tuning still runs; the benchmark hits its timeout before it saves anything:
    the run ends with the summary, which names both (not an earlier run's speed table), and exits 1."""
    tests = tmp_path / "test_day_one_failure.py"
    tests.write_text("def test_passes():\n    pass\n\n\ndef test_fails():\n    assert 1 == 2\n")
    out = tmp_path / "out"
    (out / "bench").mkdir(parents=True)
    (out / "bench" / "bench.json").write_text(json.dumps(_bench_report([])))  # an earlier run's
    env = {"DAY_ONE_TESTS": str(tests), "DAY_ONE_TUNE_BUDGET_S": "0", "DAY_ONE_BENCH_S": "2"}
    done = run_script("--smoke", "--steps", "tests,tune,bench", str(out), **env)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"]
    assert summary["failed"] == ["tests", "bench"]
    assert steps["facts"]["status"] == "not run" and not steps["facts"]["failed"]
    assert steps["tests"]["exit"] == 1 and steps["tests"]["tests"]["passed"] == 1
    # named from pytest's root, which a file outside the project gets from its folders
    (failure,) = steps["tests"]["failures"]
    assert failure == "test_day_one_failure.py::test_fails" or failure.endswith(
        "/test_day_one_failure.py::test_fails"
    )
    assert steps["tune"]["status"] == "ok" and not steps["tune"]["failed"]
    assert steps["tune"]["defaults_ok"] == steps["tune"]["workloads"] > 0  # a budget of 0: the defaults only
    assert steps["tune"]["skipped"] == steps["tune"]["candidate_rows"] > 0
    assert steps["bench"]["status"] == "timed out" and steps["bench"]["exit"] == day_one.TIMEOUT
    assert steps["bench"]["failures"] == ["no bench/bench.json: see bench.log"]
    assert not (out / "speed_table.md").exists() and "| method |" not in (out / "summary.md").read_text()
    assert "FAILED (tests, bench)" in done.stdout and "test_day_one_failure.py::test_fails" in done.stdout


def test_a_step_with_too_little_of_the_run_s_time_left_is_not_started(tmp_path):
    """DAY_ONE_TOTAL_S bounds the whole run: a step whose share would be under 15 s is not started and
    counts as timed out, so that the run still ends, with its summary, inside one device call."""
    done = run_script("--smoke", "--steps", "tune", str(tmp_path), DAY_ONE_TOTAL_S="30")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "not started, the run's 30 s are spent" in (tmp_path / "tune.log").read_text()
    tune = json.loads((tmp_path / "summary.json").read_text())["steps"]["tune"]
    assert tune["status"] == "timed out" and tune["failed"]
    assert not (tmp_path / "tune" / "tune.json").exists()


def test_without_a_cuda_device_the_gpu_run_stops_after_the_facts(tmp_path):
    done = run_script("--steps", "facts,bench", str(tmp_path), CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 3 and "run with --smoke" in done.stdout
    assert json.loads((tmp_path / "facts.json").read_text())["cuda_available"] is False
    assert not (tmp_path / "bench.log").exists()
    for args in (["--steps", "facts,train"], ["--fast"], ["a", "b"]):
        bad = run_script(*args)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_kernel_tests_counts_each_outcome_and_names_the_failures(tmp_path):
    xml = tmp_path / "tests.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.kernels.test_a" name="test_ok" />'
        '<testcase classname="tests.kernels.test_a" name="test_bad[n17]"><failure message="x" /></testcase>'
        '<testcase classname="tests.kernels.test_b" name="test_broken"><error message="y" /></testcase>'
        '<testcase classname="tests.kernels.test_b" name="test_gpu"><skipped message="z" /></testcase>'
        "</testsuite></testsuites>"
    )
    counts = day_one.kernel_tests(xml)
    assert counts == {
        "tests": 4,
        "passed": 1,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
        "failed_tests": ["tests/kernels/test_a.py::test_bad[n17]", "tests/kernels/test_b.py::test_broken"],
    }
    assert day_one.kernel_tests(tmp_path / "missing.xml") is None


def test_kernel_tests_from_the_log_of_a_killed_run(tmp_path):
    """pytest killed before its XML: each test's outcome from the verbose lines, with xdist's prefix or
    without, counted once even where the short summary names it again."""
    log = tmp_path / "kernel_tests.log"
    log.write_text(
        "bringing up nodes...\n"
        "[gw0] [ 10%] PASSED tests/kernels/test_a.py::test_ok[cuda-bf16]\n"
        "[gw1] [ 20%] FAILED tests/kernels/test_a.py::test_bad[n17]\n"
        "tests/kernels/test_b.py::test_gpu SKIPPED (no GPU)                  [ 30%]\n"
        "tests/kernels/test_b.py::test_fine PASSED                           [ 40%]\n"
        "[gw1] [ 50%] ERROR tests/kernels/test_b.py::test_broken\n"
        "FAILED tests/kernels/test_a.py::test_bad[n17] - AssertionError: assert 1 == 2\n"
        "SKIPPED [1] tests/kernels/test_b.py:12: no GPU\n"
    )
    counts = day_one.kernel_tests_from_log(log)
    assert counts == {
        "tests": 5,
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
        "failed_tests": ["tests/kernels/test_a.py::test_bad[n17]", "tests/kernels/test_b.py::test_broken"],
    }
    summary = day_one.summarize(tmp_path, {"tests": day_one.TIMEOUT}, smoke=False)
    tests = summary["steps"]["tests"]
    assert tests["tests_from_log"] and tests["tests"] == counts and tests["failed"]
    assert "2 passed, 1 failed, 1 errors, 1 skipped (from the log" in day_one.summary_text(summary)
    # stopped by pytest-timeout's session timeout: the status says why the step failed
    stop = "!!! xdist.dsession.Interrupted: session-timeout: 125.0 sec exceeded !!!\n"
    log.write_text(log.read_text() + stop)
    stopped = day_one.summarize(tmp_path, {"tests": 2}, smoke=False)["steps"]["tests"]
    assert stopped["failed"] and stopped["status"].startswith("stopped by its session timeout")
    log.write_text("bringing up nodes...\n")
    assert day_one.kernel_tests_from_log(log) is None
    assert day_one.kernel_tests_from_log(tmp_path / "missing.log") is None


def _missing_without(blocked: tuple[str, ...], modules: list[str], tmp_path: Path) -> dict[str, str]:
    """:func:`missing_packages` of ``modules`` in a fresh interpreter where ``blocked`` cannot be imported."""
    code = "import json, sys; from benchmarks.gpu_day_one import missing_packages as m; "
    code += "print(json.dumps(m(sys.argv[1:])))"
    done = subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{without_packages(tmp_path, blocked)}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_day_one_steps_need_none_of_the_pipelines_own_dependencies(tmp_path):
    """What the steps import, the modules the benchmarks import inside their functions too, imports where
    only torch, Triton, entmax, tqdm, matplotlib and pytest are; and the check names a package that is
    missing for each module that needs it."""
    tests = [path.removesuffix(".py").replace("/", ".") for path in cuda_test_files()]
    lazy = ["pipeline.projection.model", "pipeline.atomic", "benchmarks.build_report"]
    steps = ["benchmarks.attention", "benchmarks.tune", "benchmarks.gpu_day_one", *lazy, *tests]
    assert _missing_without(PIPELINE_ONLY, steps, tmp_path / "bare") == {}
    modules = ["tests.kernels.test_tune", "pipeline.atomic"]
    assert _missing_without(("entmax",), modules, tmp_path / "no entmax") == {
        "tests.kernels.test_tune": "entmax"
    }


def test_the_facts_step_stops_where_a_package_is_missing(tmp_path, monkeypatch, capsys):
    (tmp_path / "needs_a_package.py").write_text("import a_package_nobody_installed  # noqa: F401\n")
    monkeypatch.syspath_prepend(tmp_path)
    assert (
        day_one.main(["facts", str(tmp_path / "out"), "--imports", "benchmarks.tune", "needs_a_package"]) == 4
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a_package_nobody_installed (needed by needs_a_package)" in err
    facts = json.loads((tmp_path / "out" / "facts.json").read_text())
    assert facts["missing_packages"] == {"needs_a_package": "a_package_nobody_installed"}
    with pytest.raises(ModuleNotFoundError):  # a module that is not there at all is a wrong name
        day_one.missing_packages(["no_module_by_this_name"])


def _bench_report(rows: list[dict]) -> dict:
    settings = {"dtype": "bfloat16", "batch": 1, "heads": 8, "dim": 64, "warmup": 3, "reps": 10}
    return {"device": "cuda", "device_name": "GPU", "torch": "2", "settings": settings, "results": rows}


def test_our_failed_rows_fail_the_summary_a_competitors_do_not(tmp_path):
    """A row of ours that did not run fails the bench step; AdaSplash missing does not. A tuning candidate
    that computes something else fails the tune step. A timeout is a failure even with the files in place,
    whose tables say they are partial."""
    from pipeline.atomic import write_json

    row = {"n": 16384, "causal": False, "buckets": None, "top": None, "forward_ms": 1.0}
    rows = [
        {**row, "method": "sdpa_flash", "status": "ok", "forward_backward_ms": 3.0},
        {**row, "method": "adasplash", "status": "failed: adasplash is not installed"},
        {**row, "method": "ours_entmax", "buckets": 16, "top": 2, "status": "oom"},
    ]
    write_json(tmp_path / "bench" / "bench.json", _bench_report(rows))
    tuned = {"n": 32, "buckets": 4, "top": 1, "alpha": 1.5, "causal": False}
    tune_report = {
        "device_name": "GPU",
        "settings": {"dtype": "bfloat16"},
        "candidates": ["64x64/w8/s2"],
        "budget_s": 90,
        "results": [
            {**tuned, "tiles": "64x32/w4/s2", "default": True, "status": "ok", "deviation": 0.0},
            {
                **tuned,
                "tiles": "64x64/w8/s2",
                "default": False,
                "status": "wrong: deviation 0.3 from the default",
            },
        ],
    }
    write_json(tmp_path / "tune" / "tune.json", tune_report)
    summary = day_one.summarize(tmp_path, {"tune": 0, "bench": 124}, smoke=False)
    assert summary["failed"] == ["tune", "bench"]
    bench = summary["steps"]["bench"]
    assert bench["status"] == "timed out" and bench["failures"] == ["ours_entmax top-2 n=16384 full: oom"]
    assert bench["competitors_not_ok"] == ["adasplash: failed: adasplash is not installed"]
    assert summary["steps"]["tune"]["failures"] == [
        "n=32 top=1 α=1.5 causal=False 64x64/w8/s2: wrong: deviation 0.3 from the default"
    ]
    assert "partial" in (tmp_path / "speed_table.md").read_text()
    assert "partial" not in (tmp_path / "tune.md").read_text()  # its step ended by itself
    table = markdown_rows((tmp_path / "speed_table.md").read_text())
    assert [c["method"] for c in table] == ["sdpa_flash", "adasplash", "ours_entmax"]
    text = day_one.summary_text(summary)
    assert "bench  FAILED (timed out)" in text and text.endswith("status: FAILED (tune, bench)")

    quiet = day_one.summarize(tmp_path, {"bench": 0}, smoke=False)  # an OOM of ours fails even so
    assert quiet["failed"] == ["bench"] and quiet["steps"]["tune"]["status"] == "not run"
    assert "workloads" not in quiet["steps"]["tune"]  # an earlier run's files are not read
    write_json(tmp_path / "bench" / "bench.json", _bench_report(rows[:2]))
    assert day_one.summarize(tmp_path, {"bench": 0}, smoke=False)["ok"]
