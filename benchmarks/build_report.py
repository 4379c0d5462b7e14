"""Ahead-of-time build of every Triton kernel variant for a GPU architecture, with its resource usage.

``python -m benchmarks.build_report [--arch 90] [--json] [--tiles 64x64/w8/s2,...]`` compiles each variant the
dispatcher can launch (the query-major pass in every mode, the key-major pass, the τ step kernel), with the
tiles ``default_tiles`` picks for CUDA tensors or with each of ``--tiles`` (candidates for
``python -m benchmarks.tune``, screened here before any GPU time is spent on them; the α > 2 passes, whose
products with the gradient weights run in fp32, keep their own 32×32 tiles), and prints registers per thread,
spilled bytes (local memory) and shared memory per block. No GPU is needed: Triton lowers to PTX,
its bundled ``ptxas`` assembles a cubin and ``cuobjdump`` reads the usage back. The interpreter that runs the
numerical tests on CPU accepts code the GPU compiler rejects and says nothing about registers; this report
covers both. Exits 1 when a variant spills more than ``SPILL_BUDGET`` bytes per thread or needs more shared
memory than the architecture offers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attention_kernels.bucketed import triton_kernel as tb
from attention_kernels.bucketed import triton_plan

TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SHARED_LIMIT = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}  # opt-in shared memory per block

# argument types by name (everything not listed is an int32 scalar)
_INPUTS = {"Q", "K", "V", "DO"}
_FP32_TENSORS = {"ROW_STAT", "ROW_DELTA", "ACC", "ACC2", "STATS", "DK", "DV", "SUMS", "TAU", "LO", "HI"}
_INT_TENSORS = {
    "Q_IDS",
    "K_IDS",
    "Q_TOK",
    "Q_BKT",
    "Q_RANK",
    "K_TOK",
    "K_BKT",
    "K_RANK",
    "P_RANGES",
    "B_RANGES",
}
_INT64_TENSORS = {"KEY", "ORDER", "BUCKET_KEY", "GATHER", "COUNT", "ROW_KEY", "ROW_COUNT", "COL_KEY"}
_INT_TENSORS |= {"IDS", "IDS_OUT", "TOK", "BKT", "RANK", "ROW_TOK", "COL_TOK", "OUT"}  # the plan's
_FP32_SCALARS = {"qk_scale", "p_exp", "g_exp", "alpha", "tau_tol", "f_tol"}
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}

# (mode, α, NEED_U): every pass of the forward and backward, softmax, the three τ update rules, and α > 2,
# whose products with g and ds run in fp32
ROW_PASSES = [
    ("softmax_fwd", tb._SOFTMAX_FWD, 1.0, False),
    ("entmax_max", tb._ENTMAX_MAX, 1.5, False),
    ("entmax_tau", tb._ENTMAX_TAU, 1.5, False),
    ("entmax_tau", tb._ENTMAX_TAU, 1.25, False),
    ("entmax_out", tb._ENTMAX_OUT, 1.5, True),
    ("entmax_out", tb._ENTMAX_OUT, 1.25, True),
    ("entmax_out", tb._ENTMAX_OUT, 3.0, True),
    ("entmax_solve", tb._ENTMAX_SOLVE, 1.5, True),
    ("entmax_solve", tb._ENTMAX_SOLVE, 3.0, True),
    ("dq", tb._DQ, 1.0, False),
    ("dq", tb._DQ, 1.5, False),
    ("dq", tb._DQ, 3.0, False),
]
COL_ALPHAS = [1.0, 1.5, 1.25, 3.0]
# (dtype, head dim, buckets per token): every tile configuration; fp16 shares bf16's tiles and code path
SHAPES = [
    (torch.bfloat16, 64, 1),
    (torch.bfloat16, 64, 2),
    (torch.bfloat16, 64, 4),
    (torch.bfloat16, 128, 2),
    (torch.float32, 64, 1),
    (torch.float32, 64, 4),
]
# a few spilled bytes per thread stay in L1 and cost less than halving the tile; hundreds do not
SPILL_BUDGET = 128


def variants(tiles: list[tb.Tiles] | None = None, dtype_name: str | None = None) -> list[dict[str, Any]]:
    """Every (kernel, constants, launch options) to build, with a readable label: with the default tiles of
    each shape, or with each of ``tiles`` (then labelled with them); only the shapes of ``dtype_name``
    ("bf16", "fp32") when given."""
    out = []
    for dtype, head_dim, t in SHAPES:
        if dtype_name not in (None, _DTYPES[dtype]):
            continue
        # the default tiles with a causal mask, then without one where they differ (every tile attended)
        for each, causal in [(each, True) for each in tiles] if tiles else [(None, True), (None, False)]:
            shape = f"{_DTYPES[dtype]} d={head_dim} T={t}" + (f" {each}" if tiles else "")
            shape += "" if causal else " non-causal"
            for name, mode, alpha, need_u in ROW_PASSES:
                if mode == tb._ENTMAX_SOLVE and t > 1:
                    continue  # the in-kernel τ search serves one bucket per query
                if not _takes_tiles(alpha, each) or not _own_build(alpha, dtype, head_dim, t, causal, each):
                    continue
                cfg = _config(alpha, dtype, head_dim, t, each, causal)
                modes = dict(MODE=mode.value, NEED_U=need_u, TAU_METHOD=cfg.tau_method)
                out.append(_variant("_rows_kernel", f"rows {name} α={alpha} {shape}", dtype, cfg, t, modes))
            for alpha in COL_ALPHAS:
                if not _takes_tiles(alpha, each) or not _own_build(alpha, dtype, head_dim, t, causal, each):
                    continue
                cfg = _config(alpha, dtype, head_dim, t, each, causal)
                out.append(_variant("_cols_kernel", f"cols α={alpha} {shape}", dtype, cfg, t, {}))
    out += _plan_variants()
    for start in (True, False):
        constants = dict(START=start, METHOD=tb._TAU_HALLEY.value, BLOCK=tb.TAU_BLOCK)
        out.append(
            dict(
                kernel="_tau_kernel",
                label=f"tau start={start}",
                dtype="fp32",
                constants=constants,
                num_warps=4,
                num_stages=1,
            )
        )
    return out


def _plan_variants() -> list[dict[str, Any]]:
    """The plan's kernels (``triton_plan``) at T = 1 and 2, with and without the pattern part, causal or
    not, query- or key-major, as ``build_side`` and ``bucket_ranges`` launch them (default launch options)."""
    block = triton_plan.BLOCK
    found = []
    for t in (1, 2):
        found.append(dict(kernel="_keys_kernel", label=f"plan keys T={t}", constants=dict(T=t, BLOCK=block)))
        for pattern in (False, True):
            constants = dict(T=t, S=t + pattern, PATTERN=pattern, BLOCK=block)
            label = f"plan entries T={t}" + (" pattern" if pattern else "")
            found.append(dict(kernel="_entries_kernel", label=label, constants=constants))
    for causal in (False, True):
        for key_major in (False, True):
            constants = dict(CAUSAL=causal, KEY_MAJOR=key_major, BLOCK=block)
            label = f"plan ranges causal={causal} key_major={key_major}"
            found.append(dict(kernel="_ranges_kernel", label=label, constants=constants))
    return [dict(v, dtype="i32", num_warps=4, num_stages=3) for v in found]


def _takes_tiles(alpha: float, tiles: tb.Tiles | None) -> bool:
    """Whether a kernel at ``alpha`` is built with ``tiles`` (None: its default ones): α > 2 always takes
    its default tiles (fp32 products: 32×32)."""
    return tiles is None or alpha <= 2.0


def _own_build(
    alpha: float, dtype: torch.dtype, head_dim: int, t: int, causal: bool, tiles: tb.Tiles | None
) -> bool:
    """Whether a variant needs building: named tiles always; without a causal mask, only the default tiles
    that differ from the causal ones (the same tiles use the same registers either way)."""
    if causal or tiles is not None:
        return True
    cuda = torch.device("cuda")
    return tb.default_tiles(head_dim, t, dtype, cuda, alpha=alpha) != tb.default_tiles(
        head_dim, t, dtype, cuda, alpha=alpha, causal=True
    )


def _config(
    alpha: float, dtype: torch.dtype, head_dim: int, t: int, tiles: tb.Tiles | None, causal: bool = True
) -> tb._Config:
    """The kernel's config for these tiles, or for the ones ``default_tiles`` picks on CUDA when None (a
    causal mask and a window: the paths with the most code)."""
    pattern = dict(causal=causal, radius=0 if causal else -1)
    tiles = tiles or tb.default_tiles(head_dim, t, dtype, torch.device("cuda"), alpha=alpha, **pattern)
    return tb._make_config(alpha, head_dim**-0.5, causal, pattern["radius"], 0, head_dim, tiles, dtype)


def _variant(
    kernel: str, label: str, dtype: torch.dtype, cfg: tb._Config, t: int, modes: dict[str, object]
) -> dict[str, Any]:
    """A variant launched exactly as the dispatcher would: the config's tile constants plus ``modes``."""
    constants = {**cfg.tile_constants(t, t), **modes}
    options = {key: constants.pop(key) for key in ("num_warps", "num_stages")}
    return dict(kernel=kernel, label=label, dtype=_DTYPES[dtype], constants=constants, **options)


def _signature(kernel, dtype: str, constants: dict) -> dict[str, str]:
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in _INPUTS:
            signature[name] = f"*{dtype}"
        elif name in _FP32_TENSORS:
            signature[name] = "*fp32"
        elif name in _INT_TENSORS:
            signature[name] = "*i32"
        elif name in _INT64_TENSORS:
            signature[name] = "*i64"
        elif name == "DONE":
            signature[name] = "*i8"
        else:
            signature[name] = "fp32" if name in _FP32_SCALARS else "i32"
    return signature


def build(variant: dict[str, Any], arch: int) -> dict[str, Any]:
    """Compile one variant for ``sm_{arch}``; its registers, spill bytes and shared memory."""
    kernel = getattr(tb, variant["kernel"], None) or getattr(triton_plan, variant["kernel"])
    constants = variant["constants"]
    source = ASTSource(
        fn=kernel,
        signature=_signature(kernel, variant["dtype"], constants),
        constexprs={(kernel.arg_names.index(k),): v for k, v in constants.items()},
    )
    options = {"num_warps": variant["num_warps"], "num_stages": variant["num_stages"]}
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        report = subprocess.run(
            [str(TOOLS / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True, check=True
        ).stdout
    usage = {key.lower(): int(v) for key, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", report)}
    return {**variant, **usage, "shared": compiled.metadata.shared}


def _build_one(job: tuple[dict[str, Any], int]) -> dict[str, Any]:
    return build(*job)


def problems(row: dict[str, Any], arch: int) -> list[str]:
    """What is wrong with a built variant: spills or too much shared memory."""
    found = []
    if row["local"] + row["stack"] > SPILL_BUDGET:
        found.append(f"spills {row['local'] + row['stack']} B per thread (budget {SPILL_BUDGET} B)")
    if row["shared"] > SHARED_LIMIT.get(arch, SHARED_LIMIT[90]):
        found.append(f"needs {row['shared']} B of shared memory")
    return found


def tiles_list(text: str) -> list[tb.Tiles]:
    """A command-line list of tiles, comma-separated (``64x64/w8/s2,128x64/w8/s3``)."""
    try:
        return [tb.Tiles.parse(part) for part in text.split(",")]
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.build_report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--arch", type=int, default=90, help="compute capability ×10 (90 = Hopper)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compilations")
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    parser.add_argument(
        "--tiles", type=tiles_list, help="build with each of these instead of the defaults: 64x64/w8/s2,..."
    )
    parser.add_argument("--dtype", choices=sorted(set(_DTYPES.values()) - {"fp16"}), help="these shapes only")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        # the interpreter replaces kernels by Python functions, which cannot be compiled
        parser.error("TRITON_INTERPRET=1 is set: this report compiles for the GPU, unset it")
    jobs = [(v, args.arch) for v in variants(args.tiles, args.dtype)]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(_build_one, jobs))
    bad = [(row, problems(row, args.arch)) for row in rows]
    if args.json:
        print(json.dumps([{**row, "problems": found} for row, found in bad]))
    else:
        print(f"{'variant':<62} {'warps':>5} {'regs':>5} {'spill B':>8} {'smem B':>7}")
        for row, found in bad:
            print(
                f"{row['label']:<62} {row['num_warps']:>5} {row['reg']:>5} {row['local'] + row['stack']:>8} "
                f"{row['shared']:>7}  {'; '.join(found)}"
            )
    return 1 if any(found for _, found in bad) else 0


if __name__ == "__main__":
    raise SystemExit(main())
