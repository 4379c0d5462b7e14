"""Device facts and the closing summary of the GPU day-one script, ``bash benchmarks/gpu_day_one.sh [--smoke]
[--steps facts,tests,bench,tune] [OUT_DIR]`` (OUT_DIR: ``$OUT`` when set, else ``artifacts/gpu_day_one``).

The script is what to run the first time a GPU machine is at hand (one H100 or H200, minutes of device time):
from the repository root, four steps, each under its own ``timeout`` (so that one hang cannot eat the device
time; ``DAY_ONE_*_S`` override them) and each writing under OUT_DIR, then this module's summary:

1. ``facts`` (:func:`device_facts`): ``nvidia-smi -L``, the CUDA devices torch sees (name, compute capability,
   memory), the torch, CUDA, Triton and Python versions and the CPU count: ``facts.json``, ``facts.log``.
   It also imports what the later steps import (the benchmarks, the kernel test files): a package missing
   there (:func:`missing_packages`) stops the script here, with exit status 4 and the packages named, rather
   than minutes later in each step. The benchmarks need torch, Triton, entmax, tqdm and matplotlib only,
   not the pipeline's own dependencies (pydantic, datasets, DVC), which a bare GPU image lacks. Without a
   CUDA device the script stops here too (``--smoke`` is the rehearsal on a CPU).
2. ``tests``: the kernel tests that run on CUDA tensors when a GPU is present (the files of ``tests/kernels``
   that ask ``torch.cuda.is_available()``, but the tuning's, whose sweep the tune step runs; there they add
   bf16 and the large cases), with pytest-xdist when
   installed: ``kernel_tests.xml`` (JUnit) and ``kernel_tests.log``, one line per test as it ends. With
   pytest-timeout installed the session stops itself before the step's timeout, so that pytest still writes
   its XML; where it was killed all the same, the summary counts the outcomes from the log
   (:func:`kernel_tests_from_log`). Failures are recorded and the benchmarks still run.
3. ``bench``: ``python -m benchmarks.attention --suite gpu --sizes 16384 --buckets 16 --index-inputs
   local``: bucketed attention top-1 and top-2 (α = 1.5 and 1), indexed attention certified and approximate,
   flash SDPA, FlexAttention with the same block mask, dense α-entmax, forward and forward+backward medians
   of CUDA-event times: ``bench/bench.json`` (saved after each causality), ``bench/bench.png``, ``bench.log``
   and, from the JSON, ``speed_table.md`` (:func:`speed_table`).
4. ``tune``: ``python -m benchmarks.tune --sizes 16384 --budget-s 60``: ``tune/tune.json`` (saved after
   every pass, so a timeout keeps the passes done), ``tune.log`` and, from the JSON, ``tune.md``. Last: its
   default tiles are the bench's, compiled by then, and it is the step a short run can best lose.

The summary (:func:`summarize`) reads those files, writes ``summary.json`` and ``summary.md`` (the step
lines, then the speed table and the tuning table of the steps that ran, so that one file holds every figure:
:func:`summary_markdown`), prints one line per step and exits 1 when anything failed: a step whose exit
status is not 0 (124: its timeout), a kernel test that failed or errored, a tuning candidate that computes
something other than the default tiles (``wrong``) or default tiles that did not run, a row of our own
kernels (bucketed or indexed) that did not run. A competitor that cannot run (AdaSplash not installed,
FlexAttention's missing backward on CPU tensors, dense entmax out of memory) is a result: listed, not a
failure.

``--smoke`` runs the same steps on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``, CUDA hidden)
at tiny sizes (n = 64 for the speed table, 32 for the tuning), a few of the kernel tests and a tuning budget
of seconds: the script's own test, about a minute and a half on two cores. Its times mean nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

STEPS = ("facts", "tests", "tune", "bench")
# what each step leaves in OUT_DIR
OUTPUTS = {
    "facts": ["facts.log", "facts.json"],
    "tests": ["kernel_tests.log", "kernel_tests.xml"],
    "tune": ["tune.log", "tune/tune.json", "tune.md"],
    "bench": ["bench.log", "bench/bench.json", "bench/bench.png", "speed_table.md"],
}
# a failed row of these fails the run
OURS = ("ours_entmax", "ours_softmax", "ours_torch", "indexed_certified", "indexed_approximate")
# what each method of the speed table is
PROVIDERS = {
    "sdpa_flash": "dense softmax, torch SDPA restricted to the flash backend",
    "ours_entmax": "bucketed attention, α = 1.5 (the Triton kernel on CUDA)",
    "ours_softmax": "bucketed attention, α = 1 (softmax; the Triton kernel on CUDA)",
    "ours_torch": "bucketed softmax through the PyTorch path (top-1, not causal): on CUDA, each bucket's "
    "queries and keys gathered into blocks, one flash SDPA call per class of equal blocks",
    "flex": "FlexAttention (softmax) with the same block mask as the bucketed rows",
    "indexed_certified": "indexed attention, certified (exact): its forward is the Triton kernel on CUDA",
    "indexed_approximate": "indexed attention, α-entmax over the predicted sets only (PyTorch path)",
    "dense_entmax": "dense α-entmax (the entmax package), α = 1.5",
    "adasplash": "AdaSplash, when installed",
}
TIMEOUT = 124  # timeout(1)'s exit status when it stopped the command


def device_facts() -> dict[str, Any]:
    """What the day-one run ran on: ``nvidia-smi -L`` (None where it is missing), the CUDA devices torch sees
    (name, compute capability, memory), the torch, CUDA, Triton and Python versions, the CPU count, and
    whether Triton's interpreter is on."""
    import torch

    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
        nvidia_smi = (smi.stdout or smi.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        nvidia_smi = None if isinstance(err, FileNotFoundError) else f"failed: {err}"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    devices = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "multiprocessors": props.multi_processor_count,
                }
            )
    return {
        "nvidia_smi": nvidia_smi,
        "cuda_available": bool(devices),
        "devices": devices,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def facts_text(facts: dict[str, Any]) -> str:
    """The facts as the script prints them."""
    lines = [f"nvidia-smi -L: {facts['nvidia_smi'] or 'not installed'}"]
    for index, device in enumerate(facts["devices"]):
        lines.append(
            f"cuda:{index}: {device['name']}, compute capability {device['capability']}, "
            f"{device['memory_gib']} GiB, {device['multiprocessors']} SMs"
        )
    if not facts["devices"]:
        lines.append(f"no CUDA device: CPU tensors ({facts['machine']})")
    lines.append(
        f"torch {facts['torch']} (CUDA {facts['torch_cuda'] or 'none'}), "
        f"triton {facts['triton'] or 'missing'}, python {facts['python']}, {facts['cpu_count']} CPU cores"
        + (", TRITON_INTERPRET=1" if facts["triton_interpret"] else "")
    )
    return "\n".join(lines)


def missing_packages(modules: list[str]) -> dict[str, str]:
    """For each of ``modules`` that cannot be imported for want of a package, that package's name
    ({module: package}). Import errors of other kinds are raised: they are bugs, not a bare machine."""
    missing = {}
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            name = (err.name or "").split(".")[0]
            if not name or name == module.split(".")[0]:
                raise  # the module itself is not there: a wrong name, not a missing package
            missing[module] = name
    return missing


# --------------------------------------------------------------------------------------------- readers


def kernel_tests(xml: Path) -> dict[str, Any] | None:
    """Counts of the JUnit XML pytest wrote (passed, failed, errors, skipped, tests) and the ids of the
    tests that failed or errored (``path::name[params]``); None where there is no such file."""
    if not xml.is_file():
        return None
    outcomes = []
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        tag = next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), "passed")
        module = case.get("classname", "").replace(".", "/")
        outcome = {"failure": "failed", "error": "errors"}.get(tag, tag)
        outcomes.append((f"{module}.py::{case.get('name')}", outcome))
    return _tally(outcomes)


def _tally(outcomes: list[tuple[str, str]]) -> dict[str, Any]:
    """(test id, outcome) pairs (outcome: passed, failed, errors, skipped) as the counts of
    :func:`kernel_tests`: tests, each outcome's count, and the ids that failed or errored."""
    counts = {"tests": len(outcomes)} | {key: 0 for key in ("passed", "failed", "errors", "skipped")}
    for _, outcome in outcomes:
        counts[outcome] += 1
    failed = [test for test, outcome in outcomes if outcome in ("failed", "errors")]
    return {**counts, "failed_tests": failed}


# a test's outcome in pytest's verbose lines, with xdist ("[gw3] [ 45%] PASSED path::name") or without
# ("path::name PASSED [ 45%]"), and in the short summary ("FAILED path::name - reason")
_OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}
_OUTCOME_LINE = re.compile(
    r"(?:\b(?P<before>PASSED|FAILED|ERROR|SKIPPED) (?P<id1>\S+\.py::\S+))"
    r"|(?:(?P<id2>\S+\.py::\S+) (?P<after>PASSED|FAILED|ERROR|SKIPPED)\b)"
)


def kernel_tests_from_log(log: Path) -> dict[str, Any] | None:
    """The counts of :func:`kernel_tests` from pytest's verbose log, for a run killed before it wrote its
    XML: each test id once, with the last outcome the log gives it (a test that passed and then errored in
    its teardown is an error). None where there is no log or no outcome in it."""
    if not log.is_file():
        return None
    outcome_of: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        if match := _OUTCOME_LINE.search(line):
            test = match["id1"] or match["id2"]
            outcome_of[test] = _OUTCOMES[match["before"] or match["after"]]
    return _tally(list(outcome_of.items())) if outcome_of else None


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def tune_findings(report: dict[str, Any]) -> dict[str, Any]:
    """Of a ``tune.json``: workloads, candidates, the rows measured, skipped and failed, and the failures
    (a candidate that computes something else, or default tiles that did not run)."""
    rows = report["results"]
    defaults = [r for r in rows if r["default"]]
    candidates = [r for r in rows if not r["default"]]
    bugs = [
        r for r in rows if r.get("status", "").startswith("wrong") or (r["default"] and r["status"] != "ok")
    ]
    return {
        "device_name": report["device_name"],
        "workloads": len(defaults),
        "defaults_ok": sum(r["status"] == "ok" for r in defaults),
        "candidates": len(report["candidates"]),
        "candidate_rows": len(candidates),
        "measured": sum(r["status"] == "ok" for r in candidates),
        "skipped": sum(r["status"].startswith("skipped") for r in candidates),
        "unbuilt": sum(r["status"].startswith("failed") for r in candidates),
        "failures": [
            f"n={r['n']} top={r['top']} α={r['alpha']} causal={r['causal']} {r['tiles']}: {r['status']}"
            for r in bugs
        ],
    }


def bench_findings(report: dict[str, Any]) -> dict[str, Any]:
    """Of a GPU-suite ``bench.json``: its lengths, the rows, our rows that did not run (failures) and the
    competitors' rows that are not ok (results: one that cannot run, or has no backward)."""
    rows = report["results"]
    not_ok = [r for r in rows if r["status"] != "ok"]
    return {
        "device_name": report["device_name"],
        "sizes": sorted({r["n"] for r in rows}),
        "rows": len(rows),
        "ok": len(rows) - len(not_ok),
        "failures": [_row_name(r) + f": {r['status']}" for r in not_ok if r["method"] in OURS],
        "competitors_not_ok": sorted(
            {f"{r['method']}: {r['status']}" for r in not_ok if r["method"] not in OURS}
        ),
    }


def _row_name(row: dict[str, Any]) -> str:
    """A speed row in words: method, length, causality, then its top-T or its inputs."""
    causal = "causal" if row["causal"] else "full"
    detail = f" top-{row['top']}" if row.get("top") else f" {row['inputs']}" if row.get("inputs") else ""
    return f"{row['method']}{detail} n={row['n']} {causal}"


# --------------------------------------------------------------------------------------------- tables


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    from pipeline.evaluation.table_text import cell, table_row

    return [
        table_row(header),
        table_row(["---"] * len(header)),
        *(table_row([cell(text) for text in row]) for row in rows),
    ]


def _phases(row: dict[str, Any]) -> str:
    """An indexed row's forward phases, "indexer / bounds / exact" ms; a dash for other rows."""
    from pipeline.evaluation.table_text import DASH

    times = [row.get(f"{phase}_ms") for phase in ("indexer", "bounds", "sparse")]
    return DASH if None in times else " / ".join(f"{t:.1f}" for t in times)


def speed_table(report: dict[str, Any], partial: bool = False) -> str:
    """The GPU suite's rows as markdown, one table per length: every provider, forward and forward+backward
    median ms, the planning's ms and density (bucketed), the speedup over flash SDPA, the share of key blocks
    skipped, the forward's phases and the speedup over and deviation from dense α-entmax (indexed), peak
    memory above the inputs, status; then what each method is. ``partial``: the run was stopped before its
    end (the rows saved so far)."""
    from pipeline.evaluation.table_text import DASH, formatted

    settings = report["settings"]
    clock = "CUDA-event" if report["device"] == "cuda" else "wall-clock (CPU tensors: a smoke test)"
    lines = []
    for n in sorted({r["n"] for r in report["results"]}):
        lines += [
            f"## n = {n}" + (" (partial: the run was stopped)" if partial else ""),
            "",
            f"{report['device_name']}, torch {report['torch']}; {settings['dtype']}, "
            f"batch {settings['batch']}, {settings['heads']} heads, d = {settings['dim']}; "
            f"medians of {settings['reps']} {clock} times after {settings['warmup']} warm-up calls; "
            "× flash = flash SDPA's time over the row's, × entmax = dense α-entmax's; plan ms = our "
            "bucketed rows' planning timed alone (their fwd ms includes it); phases ms = the indexer / "
            "bounds / exact passes of one more indexed forward, as the call reports them.",
            "",
        ]
        header = ["causal", "method", "B", "top", "inputs", "density", "skipped"]
        header += ["fwd ms", "fwd+bwd ms", "plan ms", "phases ms"]
        header += ["× flash fwd", "× flash f+b", "× entmax fwd", "max err", "f+b MiB", "status"]
        body = []
        for r in report["results"]:
            if r["n"] != n:
                continue
            body.append(
                [
                    "yes" if r["causal"] else "no",
                    r["method"],
                    formatted(r.get("buckets"), ".0f"),
                    formatted(r.get("top"), ".0f"),
                    r.get("inputs", DASH),
                    formatted(r.get("density") if r.get("buckets") else None, ".4f"),
                    formatted(r.get("blocks_skipped"), ".3f"),
                    formatted(r.get("forward_ms"), ".3f"),
                    formatted(r.get("forward_backward_ms"), ".3f"),
                    formatted(r.get("plan_ms"), ".3f"),
                    _phases(r),
                    formatted(r.get("speedup_forward"), ".2f"),
                    formatted(r.get("speedup_forward_backward"), ".2f"),
                    formatted(r.get("speedup_forward_vs_dense_entmax"), ".2f"),
                    formatted(r.get("max_abs_error"), ".1e"),
                    formatted(r.get("peak_mb_forward_backward"), ".0f"),
                    r["status"],
                ]
            )
        lines += [*_markdown(header, body), ""]
    methods = dict.fromkeys(r["method"] for r in report["results"])
    lines += ["Methods:", ""] + [f"- `{m}`: {PROVIDERS.get(m, m)}" for m in methods]
    return "\n".join(lines) + "\n"


def tune_markdown(report: dict[str, Any], partial: bool = False) -> str:
    """``benchmarks.tune``'s own table of a ``tune.json`` in a code block, under its settings."""
    from benchmarks.tune import table

    head = f"# Tile tuning on {report['device_name']}" + (
        " (partial: the run was stopped)" if partial else ""
    )
    settings = ", ".join(f"{key} {value}" for key, value in report["settings"].items())
    candidates = ", ".join(report["candidates"])
    text = table(report) if "summary" in report else "(no pass finished)"
    return (
        f"{head}\n\n{settings}; budget {report['budget_s']} s; candidates {candidates}\n\n```\n{text}\n```\n"
    )


# --------------------------------------------------------------------------------------------- summary


def _status(code: int | None) -> str:
    if code is None:
        return "not run"
    return "ok" if code == 0 else "timed out" if code == TIMEOUT else f"exit {code}"


def summarize(out: Path, codes: dict[str, int], smoke: bool) -> dict[str, Any]:
    """Each step's exit status (``codes``: the steps that ran), what its files say and whether it failed;
    writes ``speed_table.md`` and ``tune.md`` from the JSON the steps left (also after a timeout). The files
    of steps that did not run are not read: they are an earlier run's."""
    from pipeline.atomic import write_text

    steps: dict[str, dict[str, Any]] = {}
    for step in STEPS:
        code = codes.get(step)
        entry = steps[step] = {"exit": code, "status": _status(code), "failures": [], "outputs": []}
        if code is None:
            entry["failed"] = False
            continue
        if step == "facts":
            entry["facts"] = _load(out / "facts.json")
        elif step == "tests":
            log = out / "kernel_tests.log"
            tests = kernel_tests(out / "kernel_tests.xml")
            entry["tests_from_log"] = tests is None  # killed before pytest wrote its XML
            if tests is None:
                tests = kernel_tests_from_log(log)
            entry["tests"] = tests
            entry["failures"] = tests["failed_tests"] if tests else ["no JUnit XML: see kernel_tests.log"]
            if code != 0 and log.is_file() and "session-timeout" in log.read_text(errors="replace"):
                entry["status"] = "stopped by its session timeout: some tests did not run"
        elif (report := _load(out / step / f"{step}.json")) is None:
            entry["failures"].append(f"no {step}/{step}.json: see {step}.log")
        elif step == "tune":
            entry.update(tune_findings(report))
            write_text(out / "tune.md", tune_markdown(report, partial=code != 0))
        else:
            entry.update(bench_findings(report))
            write_text(out / "speed_table.md", speed_table(report, partial=code != 0))
        entry["failed"] = code != 0 or bool(entry["failures"])
        entry["outputs"] = [name for name in OUTPUTS[step] if (out / name).exists()]
    failed = [step for step, entry in steps.items() if entry["failed"]]
    return {"smoke": smoke, "out": str(out), "steps": steps, "failed": failed, "ok": not failed}


def summary_text(summary: dict[str, Any]) -> str:
    """One line per step (with the failures under it), where the outputs are, and the verdict."""
    steps = summary["steps"]
    facts = steps["facts"].get("facts") or {}
    names = [(facts.get("devices") or [{}])[0].get("name"), facts.get("machine")]
    names += [steps[step].get("device_name") for step in ("bench", "tune")]
    device = next((name for name in names if name), "an unknown device")
    mode = "smoke run: CPU tensors, Triton's interpreter, tiny sizes" if summary["smoke"] else "GPU run"
    lines = [f"GPU day one ({mode}) on {device}"]
    for step, entry in steps.items():
        detail = ""
        if step == "tests" and entry.get("tests"):
            t = entry["tests"]
            detail = (
                f": {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped"
            )
            if entry.get("tests_from_log"):
                detail += " (from the log: pytest was stopped before it wrote its XML)"
        elif step == "tune" and "workloads" in entry:
            detail = (
                f": default tiles ok on {entry['defaults_ok']} of {entry['workloads']} workloads; "
                f"candidate rows {entry['measured']} measured, {entry['skipped']} skipped, "
                f"{entry['unbuilt']} not built of {entry['candidate_rows']}"
            )
        elif step == "bench" and "rows" in entry:
            sizes = ", ".join(map(str, entry["sizes"]))
            detail = f": n = {sizes}, {entry['ok']} of {entry['rows']} rows ok"
        verdict = "FAILED" if entry["failed"] else entry["status"]
        if entry["failed"] and entry["status"] != "ok":
            verdict += f" ({entry['status']})"
        lines.append(f"  {step:<6} {verdict}{detail}")
        lines += [f"         failed: {text}" for text in entry["failures"]]
        if entry.get("competitors_not_ok"):
            lines += [
                f"         not ok (a competitor: a result): {text[:140]}"
                for text in entry["competitors_not_ok"]
            ]
    outputs = [name for entry in steps.values() for name in entry["outputs"]]
    lines.append(f"outputs in {summary['out']}: {', '.join(outputs)}, summary.md, summary.json")
    lines.append("status: " + ("ok" if summary["ok"] else f"FAILED ({', '.join(summary['failed'])})"))
    return "\n".join(lines)


def summary_markdown(summary: dict[str, Any], text: str) -> str:
    """``summary.md``: the step lines (``text``), then the tables of the steps that ran and wrote them (the
    speed table, the tuning's), their headings one level down."""
    out = Path(summary["out"])
    parts = [f"# GPU day one\n\n```\n{text}\n```\n"]
    for step, name in (("bench", "speed_table.md"), ("tune", "tune.md")):
        if summary["steps"][step]["exit"] is not None and (out / name).is_file():
            parts.append(re.sub(r"^#", "##", (out / name).read_text(), flags=re.MULTILINE))
    return "\n".join(parts)


def _codes(pairs: list[str]) -> dict[str, int]:
    """``step=code`` arguments as a dict (argparse type of the summary's --status)."""
    codes = {}
    for pair in pairs:
        step, _, code = pair.partition("=")
        if step not in STEPS or not code.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(
                f"expected STEP=EXIT_CODE with STEP one of {', '.join(STEPS)}, got {pair!r}"
            )
        codes[step] = int(code)
    return codes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_day_one", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    facts = commands.add_parser("facts", help="print the device facts and write OUT/facts.json")
    facts.add_argument("out", type=Path)
    facts.add_argument("--require-cuda", action="store_true", help="exit 3 when no CUDA device is visible")
    facts.add_argument(
        "--imports", nargs="*", default=[], metavar="MODULE", help="exit 4 when one misses a package"
    )
    summary = commands.add_parser("summary", help="read the steps' outputs, write summary.md and print it")
    summary.add_argument("out", type=Path)
    summary.add_argument(
        "--status", nargs="*", default=[], metavar="STEP=CODE", help="each run step's exit status"
    )
    summary.add_argument("--smoke", action="store_true", help="the outputs are a smoke run's")
    args = parser.parse_args(argv)
    from pipeline.atomic import write_json, write_text

    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "facts":
        found = device_facts()
        found["missing_packages"] = missing = missing_packages(args.imports)
        write_json(args.out / "facts.json", found)
        print(facts_text(found))
        if args.require_cuda and not found["cuda_available"]:
            print("no CUDA device is visible: run with --smoke for the rehearsal on a CPU", file=sys.stderr)
            return 3
        if missing:
            needed = sorted(set(missing.values()))
            print(
                f"missing Python packages: {', '.join(needed)} (needed by {', '.join(sorted(missing))}); "
                f"install them (pip install {' '.join(needed)}) and run again",
                file=sys.stderr,
            )
            return 4
        return 0
    try:
        codes = _codes(args.status)
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    result = summarize(args.out, codes, args.smoke)
    text = summary_text(result)
    write_json(args.out / "summary.json", result)
    write_text(args.out / "summary.md", summary_markdown(result, text))
    print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
