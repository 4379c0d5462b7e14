"""The fused C++ block kernel against the unfused block path it replaces, side by side:
``python -m benchmarks.fused_kernel [--sizes 2048,4096] [--buckets 16] [--top 1] [--window 0]
[--global-tokens 0] [--reps 5] [--out DIR]``

For each n, causal or not, α = 1 (softmax) and α = 1.5: the forward without gradients of
:func:`attention_kernels.bucketed.torch_path.torch_bucketed_attention` on one thread, 8 heads, d = 64, batch
1, float32, ``--buckets`` balanced buckets with ``--top`` ids per token (the workload of
``benchmarks.attention``) and a window band of size ``--window`` (0: none) and ``--global-tokens``, once as it
runs (the fused kernel, on one-id queries or on the id-set classes of
:mod:`attention_kernels.bucketed.id_sets`, where its plan takes the call) and once with ``fused=False`` (the
unfused blocks, or blocks of SDPA for softmax without a causal mask where the 512-bit block products are
missing), beside softmax SDPA; medians of ``--reps`` rounds, each round calling the three in turn. Prints each
one's milliseconds and efficiency (SDPA time / its time × density) and the unfused time over the fused one,
and whether the fused kernel ran; checks the two outputs agree; writes ``fused_kernel.json`` to ``--out``
(``artifacts/bench``).

The kernels are built for the machine's widest vectors. To measure the AVX2 build on an AVX-512 machine,
give it a compiler that adds ``-mno-avx512f`` (``CXX``: a two-line wrapper script) and hold torch to AVX2 as
well: ``ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from attention_kernels.attended import window_radius
from attention_kernels.bucketed import torch_path
from attention_kernels.bucketed.block_attention import fused_kernel
from benchmarks.attention import ROOT, balanced_buckets, count_pairs, density, sizes_list
from pipeline.atomic import write_json
from pipeline.evaluation.table_text import table_row

HEADS, DIM, ALPHAS = 8, 64, (1.0, 1.5)


def measure(
    n: int,
    buckets: int,
    top: int,
    causal: bool,
    alpha: float,
    reps: int,
    window: int = 0,
    global_tokens: int = 0,
) -> dict[str, Any]:
    """One configuration: median ms of the fused call, the unfused one and SDPA, and what they did."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, n, DIM, generator=gen) for _ in range(3))
    ids = balanced_buckets(1, HEADS, n, buckets, top, seed=top)
    pattern = dict(alpha=alpha, causal=causal, radius=window_radius(window), global_tokens=global_tokens)
    calls = {
        "fused": lambda: torch_path.torch_bucketed_attention(q, k, v, ids, ids, **pattern),
        "unfused": lambda: torch_path.torch_bucketed_attention(q, k, v, ids, ids, **pattern, fused=False),
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    with torch.no_grad():
        deviation = (calls["fused"]() - calls["unfused"]()).abs().max().item()  # (also the warm-up)
        calls["sdpa"]()
        for _ in range(reps):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    share = density(count_pairs(ids, causal, window, global_tokens), 1, HEADS, n, causal)
    ran = torch_path.fused_plan(ids, ids, **pattern) is not None
    return {
        "n": n,
        "causal": causal,
        "alpha": alpha,
        "density": share,
        "fused_ran": ran,
        **{f"{name}_ms": value for name, value in ms.items()},
        "unfused_over_fused": ms["unfused"] / ms["fused"],
        "efficiency_fused": ms["sdpa"] / ms["fused"] * share,
        "efficiency_unfused": ms["sdpa"] / ms["unfused"] * share,
        "max_abs_deviation": deviation,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_list, default=[2048, 4096], help="lengths (default 2048,4096)")
    parser.add_argument("--buckets", type=int, default=16, help="balanced buckets (default 16)")
    parser.add_argument("--top", type=int, default=1, help="ids per token (default 1)")
    parser.add_argument("--window", type=int, default=0, help="window size, 0 or odd (default 0: none)")
    parser.add_argument("--global-tokens", type=int, default=0, help="global tokens (default 0)")
    parser.add_argument("--reps", type=int, default=5, help="rounds timed (default 5)")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "bench", help="where the JSON goes")
    args = parser.parse_args(argv)
    for name in ("buckets", "top", "reps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer ≥ 1; got {getattr(args, name)}")
    if args.global_tokens < 0:
        parser.error(f"--global-tokens must be an integer ≥ 0; got {args.global_tokens}")
    try:
        window_radius(args.window)
    except ValueError as error:
        parser.error(f"--window: {error}")
    if args.top > args.buckets:
        parser.error(f"--top must be at most --buckets ({args.buckets}); got {args.top}")
    torch.set_num_threads(1)
    kernel = fused_kernel()
    rows = [
        measure(n, args.buckets, args.top, causal, alpha, args.reps, args.window, args.global_tokens)
        for n in args.sizes
        for causal in (False, True)
        for alpha in ALPHAS
    ]
    report = {
        "settings": {
            "heads": HEADS,
            "dim": DIM,
            "buckets": args.buckets,
            "top": args.top,
            "window": args.window,
            "global_tokens": args.global_tokens,
            "reps": args.reps,
        },
        "fused_vector_bits": 8 * kernel.vector_bytes() if kernel is not None else None,
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "results": rows,
    }
    header = [
        "n",
        "causal",
        "α",
        "density",
        "fused ran",
        "fused ms",
        "unfused ms",
        "SDPA ms",
        "unfused/fused",
    ]
    header += ["eff fused", "eff unfused", "max |Δ|"]
    print(table_row(header) + "\n" + table_row(["---"] * len(header)))
    for r in rows:
        cells = [str(r["n"]), "yes" if r["causal"] else "no", f"{r['alpha']:.1f}", f"{r['density']:.4f}"]
        cells += ["yes" if r["fused_ran"] else "no"]
        cells += [f"{r[key]:.1f}" for key in ("fused_ms", "unfused_ms", "sdpa_ms")]
        cells += [f"{r['unfused_over_fused']:.2f}", f"{r['efficiency_fused']:.2f}"]
        cells += [f"{r['efficiency_unfused']:.2f}", f"{r['max_abs_deviation']:.1e}"]
        print(table_row(cells))
    bits = report["fused_vector_bits"]
    print(f"fused kernel on {bits}-bit vectors" if bits else "no fused kernel on this machine", end="")
    pattern = f"window {args.window}, {args.global_tokens} global tokens"
    print(f"; ATen {report['aten_capability']}; {args.buckets} buckets, top-{args.top}, {pattern}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "fused_kernel.json", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
