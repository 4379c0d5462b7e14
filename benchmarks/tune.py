"""Tile tuning of the Triton bucketed kernel: ``python -m benchmarks.tune [--device auto|cpu|cuda]
[--sizes 16384] [--tiles 64x64/w8/s2,...] [--budget-s 480] [--out DIR]``

Every workload of the grid (balanced buckets as in :mod:`benchmarks.attention`: 16 buckets, top-1 and top-2,
α = 1 and 1.5, causal or not; 8 heads, d = 64, bf16 on CUDA) runs first with the tiles
:func:`~attention_kernels.bucketed.triton_kernel.default_tiles` picks, then with each candidate
(:class:`~attention_kernels.bucketed.triton_kernel.Tiles`: block shape, warps, pipeline stages) in turn. Tiles
change only the order of the fp32 sums, so a candidate is timed only once its output and gradients match the
default tiles' to rounding (:func:`deviation` ≤ ``TOLERANCE`` for each of out, dq, dk, dv); a larger gap is a
bug (a race, a mask that depends on the block) and the row says so. Times are forward (no grad) and
forward+backward medians as :func:`benchmarks.attention.measure_gpu` takes them (CUDA events after warm-up);
on CPU tensors the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``), on a tiny grid, as a smoke
test of the sweep itself.

The default candidates are tiles that ``python -m benchmarks.build_report --dtype bf16 --tiles ...`` built for
sm_90 within its spill budget at d = 64, T ≤ 2 (that check needs no GPU). Compiling a candidate's
kernels costs seconds per (α, T, causal), so ``--budget-s`` bounds the candidates' sweep, which follows the
default tiles' pass (the references every candidate is checked and timed against, always measured): a
candidate runs only when the time the candidates took so far plus its estimate (its workloads times the most
seconds a measured workload has taken on average over a pass) fits in the budget, else its rows are marked
skipped; as candidates run one at a time over every workload, those measured are
measured everywhere. ``tune.json`` is written atomically after each
candidate; the table printed at the end gives, per workload, the default's times and the fastest tiles
forward and forward+backward, then every candidate's geometric-mean time over the default's across the
workloads. ``benchmarks/gpu_day_one.sh`` runs it at n = 16384 with a budget of 60 s
(:mod:`benchmarks.gpu_day_one`).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from benchmarks.attention import (
    balanced_buckets,
    count_pairs,
    density,
    failure_status,
    measure_gpu,
    number_column,
    sizes_list,
    table_lines,
    text_column,
)
from pipeline.evaluation.table_text import DASH

if TYPE_CHECKING:  # imported where used, so that tests can replace the kernel's entry point
    from attention_kernels.bucketed.triton_kernel import Tiles

CUDA_GRID = {
    "sizes": [16384],
    "buckets": 16,
    "tops": [1, 2],
    "alphas": [1.0, 1.5],
    "causal": [False, True],
    "heads": 8,
    "dim": 64,
    "warmup": 3,
    "reps": 10,
}
# the interpreter: a few tiny workloads, one repetition (the times mean nothing there)
CPU_GRID = {
    "sizes": [64],
    "buckets": 4,
    "tops": [1, 2],
    "alphas": [1.5],
    "causal": [False, True],
    "heads": 2,
    "dim": 32,
    "warmup": 0,
    "reps": 1,
}
# Within build_report's spill budget at d = 64, T ≤ 2 (sm_90, bf16); tiles that load every tile first: only
# they get pipelined loads. Pipeline stages change nothing where tiles are skipped (identical builds). The
# first two are the defaults with and without a causal mask: each workload is measured with the other's
# (a candidate equal to a workload's default is not measured twice).
CUDA_CANDIDATES = [
    "64x64/w8/s3/all", "64x64/w8/s2", "64x32/w8/s3/all", "32x64/w8/s3/all", "64x64/w8/s2/all",
    "64x32/w8/s2", "32x64/w8/s2", "32x32/w8/s2", "64x32/w4/s2",
]  # fmt: skip
CPU_CANDIDATES = ["16x16/w1/s1", "16x32/w1/s1"]
# allowed deviation from the default tiles' results (see ``deviation``): the outputs are rounded to the
# input dtype, so two orders of fp32 sums may differ by an ulp of it in many elements, each at most an ulp
# of the largest; a wrong row or block moves its elements by a sizeable share of the largest
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}

STICKY_ERRORS = ("CUDA error", "Triton Error [CUDA]")  # how torch and Triton's launcher report one


def leaves_device_unusable(err: BaseException) -> bool:
    """Whether ``err`` is a CUDA error (an illegal address, say), after which the device is unusable; a
    compiler's refusal or running out of memory is not one."""
    return any(mark in str(err) for mark in STICKY_ERRORS)


def deviation(got: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The worst, over pairs of tensors, of ‖a − b‖ / ‖b‖ (drift spread over many elements) and
    max |a − b| / max |b| (a few wrong rows); 0 where both are zero, inf where only b is or where a is not
    finite."""
    worst = 0.0
    for a, b in zip(got, reference, strict=True):
        a, b = a.double(), b.double()
        if not torch.isfinite(a).all():
            return math.inf
        gap = a - b
        for spread, size in ((gap.norm(), b.norm()), (gap.abs().max(), b.abs().max())):
            spread, size = spread.item(), size.item()
            worst = max(worst, spread / size if size > 0 else (0.0 if spread == 0 else math.inf))
    return worst


def _outputs_and_grads(
    attention, inputs: tuple[torch.Tensor, ...], grad_out: torch.Tensor
) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of ``attention(q, k, v)`` for the output gradient ``grad_out``."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    out = attention(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves, grad_out)]


def workloads(grid: dict[str, Any]) -> list[dict[str, Any]]:
    """The grid's workloads: every (length, top, α, causal)."""
    return [
        {"n": n, "buckets": grid["buckets"], "top": top, "alpha": alpha, "causal": causal}
        for n in grid["sizes"]
        for top in grid["tops"]
        for alpha in grid["alphas"]
        for causal in grid["causal"]
    ]


def run(
    grid: dict[str, Any],
    candidates: list[Tiles],
    device: torch.device,
    budget_s: float,
    save: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Rows of (workload, tiles) with their status, deviation from the default tiles and times.

    The default tiles run first on every workload (the references, whatever the budget), then each
    candidate on every workload in turn (but those it is the default of), as long as the candidates' time so
    far plus the candidate's estimate stays within ``budget_s``: its workloads times the most seconds a
    measured workload has taken on average over a pass (compiling dominates), so that a spent budget leaves
    whole candidates measured, not some workloads of each, and the sweep ends near its budget. ``save``
    receives the report so far after each pass, so a run cut short keeps what it measured. A CUDA error (an
    illegal address, say) leaves the device unusable: the rest of the sweep is then skipped."""
    from attention_kernels.bucketed.triton_kernel import default_tiles, triton_bucketed_attention

    on_cuda = device.type == "cuda"
    dtype = torch.bfloat16 if on_cuda else torch.float32  # the interpreter lacks bf16 products
    heads, dim = grid["heads"], grid["dim"]
    report = {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if on_cuda else platform.machine(),
        "torch": torch.__version__,
        "settings": {
            "dtype": str(dtype).removeprefix("torch."),
            "tolerance": TOLERANCE[dtype],
            **{key: grid[key] for key in ("heads", "dim", "warmup", "reps")},
        },
        "candidates": [str(t) for t in candidates],
        "budget_s": budget_s,
        "results": [],
    }
    jobs = []  # (spec, default tiles, inputs, bucket ids)
    for job in workloads(grid):
        n, causal = job["n"], job["causal"]
        gen = torch.Generator().manual_seed(n + job["top"])
        inputs = tuple(torch.randn(1, heads, n, dim, generator=gen).to(device, dtype) for _ in range(4))
        ids = balanced_buckets(1, heads, n, job["buckets"], job["top"], seed=job["top"], device=device)
        spec = {**job, "density": density(count_pairs(ids, causal), 1, heads, n, causal)}
        default = default_tiles(dim, job["top"], dtype, device, alpha=job["alpha"], causal=causal)
        jobs.append((spec, default, inputs, ids))
    references: dict[int, list[torch.Tensor]] = {}  # job index → the default tiles' [out, dq, dk, dv]
    passes = [None, *candidates]  # None: each workload's default tiles
    spent = 0.0  # seconds the candidates' passes took: the budget is theirs
    per_run = 0.0  # the most seconds a measured (workload, tiles) took on average over a pass
    broken = None  # the CUDA error that ended the sweep
    bar = tqdm(total=len(passes) * len(jobs), desc="tune", unit="run")
    for candidate in passes:
        began = time.monotonic()
        runs = sum(candidate is None or candidate != job[1] for job in jobs)  # a default is not run twice
        fits = candidate is None or spent + per_run * runs <= budget_s  # compiling dominates a run
        timed = 0
        for index, (spec, default, (q, k, v, grad_out), ids) in enumerate(jobs):
            bar.update()
            tiles = default if candidate is None else candidate
            if candidate is not None and candidate == default:
                continue  # measured in the first pass
            row = {**spec, "tiles": str(tiles), "default": candidate is None}
            report["results"].append(row)
            if broken is not None:
                row["status"] = f"skipped: an earlier CUDA error left the device unusable ({broken})"
                continue
            if not fits:
                row["status"] = "skipped: the time budget is spent"
                continue
            if candidate is not None and index not in references:
                row["status"] = "skipped: the default tiles failed, so there is nothing to check against"
                continue
            attention = functools.partial(
                triton_bucketed_attention,
                q_buckets=ids,
                k_buckets=ids,
                alpha=spec["alpha"],
                causal=spec["causal"],
                tiles=tiles,
            )
            try:
                got = _outputs_and_grads(attention, (q, k, v), grad_out)
                row["deviation"] = deviation(got, references.get(index, got))
            except Exception as err:  # a candidate the compiler or the device refuses is a result
                row["status"] = failure_status(err)
                if on_cuda and leaves_device_unusable(err):
                    broken = row["status"]
                continue
            if row["deviation"] > TOLERANCE[dtype]:  # for the default tiles: an output that is not finite
                row["status"] = f"wrong: deviation {row['deviation']:.3g} from the default tiles"
                continue
            references.setdefault(index, got)
            row.update(measure_gpu(attention, tuple(x.requires_grad_() for x in (q, k, v)), grid))
            timed += 1
        if fits:
            took = time.monotonic() - began
            per_run = max(per_run, took / max(timed, 1))  # a pass that failed fast says little
            spent += 0.0 if candidate is None else took
        report["summary"] = summarize(report["results"])
        save(report)
    bar.close()
    return report


WORKLOAD_FIELDS = ("n", "buckets", "top", "alpha", "causal")  # what tells workloads apart


def _workload_key(row: dict[str, Any]) -> tuple:
    return tuple(row[field] for field in WORKLOAD_FIELDS)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload: the default's times and the fastest measured tiles, forward and forward+backward.
    Per tiles: the geometric mean over workloads of its time over the default's, where both were measured."""
    by_workload: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        by_workload.setdefault(_workload_key(row), []).append(row)
    workloads_out, ratios = [], {}
    for key, group in by_workload.items():
        measured = [r for r in group if r.get("status") == "ok"]
        default = next((r for r in measured if r["default"]), None)
        entry = dict(zip(WORKLOAD_FIELDS, key, strict=True))
        entry["default"] = group[0]["tiles"]
        for phase in ("forward", "forward_backward"):
            timed = [r for r in measured if f"{phase}_ms" in r]
            if default is None or f"{phase}_ms" not in default or not timed:
                continue
            best = min(timed, key=lambda r: r[f"{phase}_ms"])
            entry[f"default_{phase}_ms"] = default[f"{phase}_ms"]
            entry[f"best_{phase}"] = best["tiles"]
            entry[f"best_{phase}_ms"] = best[f"{phase}_ms"]
            entry[f"speedup_{phase}"] = default[f"{phase}_ms"] / best[f"{phase}_ms"]
            for r in timed:
                ratios.setdefault((r["tiles"], phase), []).append(r[f"{phase}_ms"] / default[f"{phase}_ms"])
        workloads_out.append(entry)
    tiles_out: dict[str, dict[str, Any]] = {}
    for (tiles, phase), values in ratios.items():
        tiles_out.setdefault(tiles, {})[f"{phase}_over_default"] = math.exp(
            sum(math.log(x) for x in values) / len(values)
        )
        tiles_out[tiles][f"{phase}_workloads"] = len(values)
    return {"workloads": workloads_out, "tiles": tiles_out}


def table(report: dict[str, Any]) -> str:
    """Per workload, the default and the fastest tiles; then each tiles' time over the default's, tiles
    measured on the most workloads first."""
    per_workload = [
        {**w, "status": "ok" if "best_forward" in w else DASH} for w in report["summary"]["workloads"]
    ]
    lines = table_lines(
        per_workload,
        [
            text_column("n", "n", ">6"),
            text_column("top", "top", ">3"),
            text_column("alpha", "alpha", ">5"),
            text_column("causal", "causal", ">6"),
            text_column("default", "default", ">14"),
            number_column("fwd ms", "default_forward_ms", "8.3f"),
            text_column("best fwd", "best_forward", ">14"),
            number_column("x", "speedup_forward", "5.2f"),
            number_column("f+b ms", "default_forward_backward_ms", "8.3f"),
            text_column("best f+b", "best_forward_backward", ">14"),
            number_column("x", "speedup_forward_backward", "5.2f"),
        ],
    )
    ranked = sorted(
        ({"tiles": tiles, "status": "ok", **entry} for tiles, entry in report["summary"]["tiles"].items()),
        # a geometric mean over fewer workloads (a budget spent, a failure) is not comparable: those rank last
        key=lambda row: (
            -row.get("forward_backward_workloads", 0),
            row.get("forward_backward_over_default", math.inf),
        ),
    )
    lines.append("")
    lines += table_lines(
        ranked,
        [
            text_column("tiles", "tiles", ">14"),
            number_column("fwd / default", "forward_over_default", "13.3f"),
            number_column("f+b / default", "forward_backward_over_default", "13.3f"),
            number_column("workloads", "forward_backward_workloads", "9.0f"),
        ],
    )
    for r in report["results"]:
        if r["status"] != "ok":
            lines.append(
                f"n={r['n']} top={r['top']} α={r['alpha']} causal={r['causal']} {r['tiles']}: {r['status']}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.build_report import tiles_list

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tune", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--sizes", type=sizes_list, help="sequence lengths instead of the grid's, e.g. 16384")
    parser.add_argument(
        "--tiles", type=tiles_list, help="candidates instead of the defaults: 64x64/w8/s2,..."
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="stop measuring candidates this many seconds after the default tiles' pass",
    )
    parser.add_argument("--out", type=Path, default=Path("artifacts/tune"), help="output folder")
    args = parser.parse_args(argv)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.budget_s < 0:
        parser.error(f"--budget-s must be ≥ 0, got {args.budget_s}")
    # triton.language's own helpers are compiled or interpreted as it is first imported, before this runs
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device == "cpu" and not interpreted:
        parser.error("--device cpu runs the kernels in Triton's interpreter: run with TRITON_INTERPRET=1")
    if device == "cuda" and interpreted:
        parser.error(
            "TRITON_INTERPRET=1 would time the interpreter on CUDA tensors: unset it for --device cuda"
        )
    from attention_kernels.bucketed.triton_kernel import Tiles

    grid = CUDA_GRID if device == "cuda" else CPU_GRID
    grid = grid if args.sizes is None else {**grid, "sizes": args.sizes}
    candidates = args.tiles or [
        Tiles.parse(t) for t in (CUDA_CANDIDATES if device == "cuda" else CPU_CANDIDATES)
    ]
    from pipeline.atomic import write_json

    out = args.out / "tune.json"
    report = run(
        grid, candidates, torch.device(device), args.budget_s, lambda report: write_json(out, report)
    )
    print(table(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
