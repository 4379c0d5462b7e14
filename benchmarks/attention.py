"""Benchmark of bucketed attention: ``python -m benchmarks.attention [--device auto|cpu|cuda] [--suite
auto|cpu|gpu] [--out DIR] [--quick] [--only indexed|bucketed] [--sizes 4096,16384] [--buckets 16]
[--index-inputs local,scattered]``

Workload. Balanced buckets: each of ``top`` independent assignments ranks the tokens by a random permutation
and puts rank r in bucket r·B // n, so every bucket holds n/B tokens; top-2 uses two assignments in the same
id space (a token may draw the same id twice, which counts once). Queries and keys share the ids.
Density = attended pairs / valid pairs (n² per head, n(n+1)/2 when causal).

CPU (the PyTorch path, one thread). For n ∈ {1k, 2k, 4k, 8k, 16k}, causal or not, 16 buckets (or the one count
``--buckets`` names), top-1 and top-2,
with and without the pattern (window ``CPU_WINDOW`` and ``CPU_GLOBAL`` global tokens), 8 heads, d = 64,
batch 1, float32: ours (``attention_kernels.bucketed.bucketed_attention`` with ``backend="torch"``) at
α = 1 (softmax) and α = 1.5 against SDPA (``torch.nn.functional.scaled_dot_product_attention``, dense softmax)
and the dense masked α-entmax reference ``attention_kernels.bucketed.reference.dense_bucketed_attention``
(only up to ``CPU_DENSE_MAX`` tokens: it holds n × n scores), and compiled FlexAttention (softmax; forward
only, it has no backward on CPU tensors) on the same pairs with the tokens sorted by (first bucket id,
position), sorting and block-mask building timed with it. Speed-up = SDPA time / our time; efficiency =
speed-up × density (1: ours turns sparsity into speed as well as SDPA uses dense FLOPs); pair GFLOP/s =
4·d·attended pairs / forward time (the pairs' q·k and p·v, for SDPA every valid pair): the same comparison in
the machine's units, which shows what a BLAS's own path contributes (MKL takes its AVX2 kernels on AMD
processors, for SDPA's products as for ``torch.bmm``, while the block products use AVX-512); ent/sm = our
α = 1.5 time over our α = 1 time; overhead = what a learned predictor adds (projecting q and k to rank 4
through the default profile's tanh MLP, assigning each its nearest centroids, planning the blocks) over our
forward time; ovh lin = the same with the paper's linear projector.
Forward time is measured under ``torch.no_grad`` (inference), forward+backward with gradients for q, k, v;
each is the median over repetitions after one warm-up (on CPU at least ``reps`` of them, and more, up to
``CPU_MAX_REPS``, while they take under ``budget_s`` in all: a second in the full suite).
Memory: every (configuration, method) runs in a fresh subprocess, which reads its peak resident set size
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, a high-water mark kept by the kernel, so every transient
allocation counts) once after building its inputs and a tiny warm-up call (the baseline: interpreter, torch
and inputs), and after each measurement. The figures reported are peak minus baseline, i.e. the resident
memory the attention call itself needed (ours runs α = 1 then α = 1.5 in one process, so the α = 1.5
figures are the larger of the two); the absolute peaks are saved too. Python-level tracers cannot see
torch's native allocations, hence the process-level measure.

Indexed attention (CPU suite, one thread). ``attention_kernels.indexed.attention`` in both modes against SDPA
(``torch.nn.functional.scaled_dot_product_attention``, softmax) and dense α-entmax, n ∈ INDEX_SIZES, 8 heads,
d = 64, r = 8, causal and not, on two kinds of inputs: ``local`` (:func:`structured_inputs`: smooth
positional features, so each query's α = 1.5 support is its neighbourhood: about 10 keys, never above 64)
and ``scattered`` (:func:`scattered_inputs`: the same supports with positions shuffled, so they spread over
the whole sequence, as a language model's do). Both modes run through the scanned C++ kernel (every pair
scored, the entmax on the keys near each row's maximum: what ``backend="auto"`` runs on CPU) and through the
block path in the position order and in the clustered order (``order="clustered"``: tokens laid out by the
indexer's k-d tree). Forward (no grad) and
forward+backward medians in-process; the indexer's pass 1 (the clustering included), the bounds pass and the
sparse pass are the phase times the call reports; the share of key blocks skipped; the certified output's
largest deviation from dense entmax.

GPU. For n ∈ {1k, …, 32k}, d = 64, 8 heads, bf16, B ∈ {8, 16, 32}, top-1 and top-2, causal or not: forward and
forward+backward times (CUDA events, warm-up then median) and peak allocated memory of ours (Triton, α = 1.5
and α = 1), dense SDPA restricted to the flash backend, FlexAttention with the equivalent mask (a
``mask_mod`` looking up the bucket ids), dense α-entmax through the ``entmax`` package (until it runs out
of memory) and AdaSplash when it is installed (``adasplash.adasplash`` with the package's own iteration
counts; in 0.2 that is AdaSplash-2 with one τ refinement for causal α = 1.5, and its first, block-mask
version with ten otherwise). Speedup = SDPA time / our time; efficiency = speedup × density:
1 means ours turns sparsity into speed as well as flash attention uses dense FLOPs; our entmax rows also
carry their time over our softmax time. Our rows carry the predictor's overhead as on the CPU suite (its
``B`` centroids; the planning timed is the Triton path's, which its forward includes). At top-1 without a
causal mask, ``ours_torch`` is the same softmax through the PyTorch path (``backend="torch"``), which on CUDA
gathers each bucket's queries and keys into blocks and runs one flash SDPA call per class of equal blocks:
whether the best dense kernel on whole buckets beats our Triton kernel there.
Indexed attention on the GPU suite: ``attention_kernels.indexed.indexed_attention`` (α = 1.5, rank
``INDEX_RANK``, block ``INDEX_BLOCK``, position order) in both modes on the inputs ``--index-inputs`` names
(``local`` by default; ``scattered`` spreads the supports over the sequence, so the position order skips
almost nothing and the PyTorch path's time grows with n²), same n, heads and dtype, timed as the other rows
and after all of them (so that a fault of the newest kernel spoils no other row): the certified forward is the
Triton kernel of :mod:`attention_kernels.indexed.triton_kernel` (forward-only), the approximate forward and
both modes' forward+backward are the PyTorch path. Each row also carries the share of key blocks skipped, the
mean predicted set, the phase times of one more forward, its speedup over flash SDPA and over dense α-entmax
(whose time does not depend on the values), and the forward output's largest deviation from dense α-entmax
on the same inputs (fp32 from the same rounded inputs, one head at a time).
``--suite gpu --device cpu`` runs the same comparison on CPU tensors (float32, tiny sizes, wall clock, no
memory figures) as a smoke test of the suite. ``benchmarks/gpu_day_one.sh`` runs it at n = 16384 beside the
CUDA kernel tests and the tile tuning (:mod:`benchmarks.gpu_day_one`).

Every process of the benchmark keeps freed memory for reuse (:mod:`pipeline.allocator`), so large
temporaries cost no page faults at each call, for every method alike; ``bench.json`` says whether that took
effect (``keep_freed_memory``).

Writes ``bench.json`` and ``bench.png`` to ``--out`` atomically and prints a table. The CPU report names
the processor, the vector width the C++ kernels were built for and what multiplied the blocks
(:func:`cpu_facts`): with AVX-512 the C++ block products, elsewhere ``torch.bmm``, whose MKL kernels SDPA
shares, so the same table reads differently on the two.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from pipeline.allocator import keep_freed_memory
from pipeline.evaluation.table_text import DASH, formatted
from pipeline.timer import median_seconds

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "BENCH-RESULT "  # marks the worker's result line on stdout

CPU_FULL = {
    "sizes": [1024, 2048, 4096, 8192, 16384],
    "tops": [1, 2],
    "heads": 8,
    "dim": 64,
    "reps": 3,
    "budget_s": 1.0,  # and more calls while they have taken less than this in all (see _median_wall_ms)
    "flex": True,
}
CPU_QUICK = {"sizes": [256], "tops": [1, 2], "heads": 2, "dim": 32, "reps": 1, "budget_s": 0.0, "flex": False}
CPU_MAX_REPS = 25  # the most calls a CPU timing makes
FLEX = "flex_sorted"  # compiled FlexAttention on bucket-sorted tokens (CPU suite)
TORCH_PATH = "ours_torch"  # GPU suite, top-1 softmax without a causal mask: the PyTorch path (SDPA blocks)
CPU_BUCKETS, CPU_WINDOW, CPU_GLOBAL, CPU_DENSE_MAX, ALPHA = 16, 65, 8, 4096, 1.5
PREDICTOR_RANK, PREDICTOR_HIDDEN = 4, 32  # the long-context profiles' projector: rank 4 through 32 tanh units
# The predictor's few milliseconds are timed right after the attention's long runs, whose wake (caches,
# clock) moves a median of 3 by ±20 %; at least this many repetitions cost well under a second a row.
OVERHEAD_REPS = 20
# each overhead column and the predict time it adds to the planning: the tanh MLP's, the linear map's
OVERHEADS = {"overhead_forward": "predict_ms", "overhead_linear_forward": "predict_linear_ms"}
# the index and indexed-attention sizes of the CPU suite
INDEX_SIZES = {"full": [512, 1024, 2048, 4096], "quick": [256]}
INDEX_RANK, INDEX_BLOCK = 8, 32
STRUCTURE_PERIODS, STRUCTURE_STRENGTH, STRUCTURE_NOISE = (4096, 1024, 384, 192), 8.0, 0.3
GPU_FULL = {
    "sizes": [1024, 2048, 4096, 8192, 16384, 32768],
    "buckets": [8, 16, 32],
    "tops": [1, 2],
    "heads": 8,
    "dim": 64,
    "warmup": 3,
    "reps": 10,
    "index_inputs": ["local"],
}
GPU_QUICK = {
    "sizes": [1024, 2048],
    "buckets": [8],
    "tops": [1],
    "heads": 2,
    "dim": 64,
    "warmup": 1,
    "reps": 2,
    "index_inputs": ["local"],
}
# the GPU comparison run on CPU tensors (float32, wall-clock times, no memory figures): a smoke test of the
# suite itself; "ours" is then the PyTorch path and FlexAttention has no CPU backward
GPU_ON_CPU = {
    "sizes": [64],
    "buckets": [4],
    "tops": [1, 2],
    "heads": 2,
    "dim": 32,
    "warmup": 1,
    "reps": 1,
    "index_inputs": ["local"],
}


def balanced_buckets(
    batch: int, heads: int, n: int, buckets: int, top: int, *, seed: int, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """(batch, heads, n, top) int32 ids; every assignment puts exactly n / buckets tokens in each bucket."""
    gen = torch.Generator().manual_seed(seed)
    rank = torch.rand(batch, heads, top, n, generator=gen).argsort(-1).argsort(-1)  # random permutation ranks
    return (rank * buckets // n).transpose(-1, -2).contiguous().to(torch.int32).to(device)


def density(pairs: int, batch: int, heads: int, n: int, causal: bool) -> float:
    """Attended pairs over the pairs a dense kernel would compute."""
    valid = n * (n + 1) // 2 if causal else n * n
    return pairs / (batch * heads * valid)


def _median_wall_ms(fn: Callable[[], object], reps: int, budget_s: float) -> float:
    """Median wall-clock milliseconds of ``fn`` after one warm-up call (lazy initialisation, allocator
    growth), over ``reps`` calls and then more while they have taken less than ``budget_s`` in all, up to
    ``CPU_MAX_REPS``: a median of three of a call of a few milliseconds is at the mercy of one slow pair of
    calls on a shared machine, while slow calls keep the given count."""
    return _median_device_ms(fn, torch.device("cpu"), 1, reps, budget_s)


def _peak_rss_mb() -> float:
    """The process's peak resident set size so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or "memory" in str(err).lower()


# ----------------------------------------------------------------------------------------------- CPU


def _pattern(spec: dict[str, Any]) -> dict[str, int]:
    """The window and global-token options of a CPU configuration."""
    return {"window": CPU_WINDOW, "global_tokens": CPU_GLOBAL} if spec["pattern"] else {}


def _plan_options(causal: bool, window: int = 0, global_tokens: int = 0) -> dict[str, Any]:
    """``plan_attention``'s keyword arguments for a window size and a count of global tokens."""
    from attention_kernels.attended import window_radius

    return dict(causal=causal, radius=window_radius(window), global_tokens=global_tokens)


def count_pairs(ids: torch.Tensor, causal: bool, window: int = 0, global_tokens: int = 0) -> int:
    """Exact attended pairs, one head at a time to bound the enumeration's memory."""
    from attention_kernels.bucketed.torch_path import plan_attention

    opts = _plan_options(causal, window, global_tokens)
    return sum(
        plan_attention(ids[:, h : h + 1], ids[:, h : h + 1], **opts).num_pairs for h in range(ids.shape[1])
    )


def _measure_cpu(
    fn: Callable[..., torch.Tensor],
    inputs: tuple[torch.Tensor, ...],
    reps: int,
    budget_s: float,
    *,
    backward: bool = True,
) -> dict[str, Any]:
    """Forward (no grad) and, with ``backward``, forward+backward median ms of ``fn(q, k, v)``, and the peak
    RSS after each."""
    row: dict[str, Any] = {}
    try:
        with torch.no_grad():
            row["forward_ms"] = _median_wall_ms(lambda: fn(*inputs), reps, budget_s)
        row["peak_rss_mb_forward"] = _peak_rss_mb()
        row["status"] = "ok"
        if not backward:
            return row
        grads = tuple(x.clone().requires_grad_() for x in inputs)

        def step() -> None:
            fn(*grads).sum().backward()
            for x in grads:
                x.grad = None

        row["forward_backward_ms"] = _median_wall_ms(step, reps, budget_s)
        row["peak_rss_mb_forward_backward"] = _peak_rss_mb()
    except (RuntimeError, MemoryError) as err:
        row["status"] = "oom" if _is_oom(err) else failure_status(err)
    return row


def _ours(alpha: float, causal: bool, pattern: dict[str, int]) -> Callable[..., torch.Tensor]:
    """Our PyTorch path as fn(q, k, v, ids) with queries and keys sharing the bucket ids."""
    from attention_kernels.bucketed import bucketed_attention

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return bucketed_attention(q, k, v, ids, ids, alpha=alpha, causal=causal, backend="torch", **pattern)

    return fn


def _flex_sorted(causal: bool, pattern: dict[str, int]) -> Callable[..., torch.Tensor]:
    """Compiled FlexAttention (softmax) as fn(q, k, v, ids) on the equivalent block mask, with the tokens
    sorted by (first bucket id, position) so that buckets fill whole blocks, as a FlexAttention user would lay
    them out. Sorting, building the block mask (compiled) and unsorting are timed with the attention, as our
    planning is."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from attention_kernels.attended import window_radius

    flex = torch.compile(flex_attention, dynamic=False)
    block_mask = torch.compile(create_block_mask)
    radius, global_tokens = window_radius(pattern.get("window", 0)), pattern.get("global_tokens", 0)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        b, h, n, _ = q.shape
        order = torch.argsort(ids[..., 0].long() * n + torch.arange(n), dim=-1)  # (b, h, n)

        def permuted(x: torch.Tensor) -> torch.Tensor:
            return x.gather(2, order[..., None].expand(-1, -1, -1, x.shape[-1]))

        mask_mod = _flex_mask_mod(permuted(ids), causal, order, radius, global_tokens)
        out = flex(permuted(q), permuted(k), permuted(v), block_mask=block_mask(mask_mod, b, h, n, n))
        return torch.empty_like(out).scatter_(2, order[..., None].expand_as(out), out)

    return fn


def _dense(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor, causal: bool
) -> torch.Tensor:
    """The dense masked α-entmax reference with every pair in one bucket."""
    from attention_kernels.bucketed.reference import dense_bucketed_attention

    return dense_bucketed_attention(q, k, v, ids, ids, alpha=ALPHA, causal=causal)


def cpu_worker(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one (configuration, method) CPU measurement on one thread; meant to be the only work of its
    process (see module doc). Ours gives one row per α, the dense methods one row."""
    torch.set_num_threads(1)
    n, heads, dim, reps, causal = spec["n"], spec["heads"], spec["dim"], spec["reps"], spec["causal"]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for _ in range(3))
    base = {key: spec[key] for key in ("n", "causal", "method", "top", "pattern")}
    bucketed = spec["method"] in ("ours", FLEX)
    if bucketed:
        ids = balanced_buckets(1, heads, n, spec["buckets"], spec["top"], seed=spec["top"])
    if spec["method"] == "ours":
        fns = {alpha: _ours(alpha, causal, _pattern(spec)) for alpha in (1.0, ALPHA)}
    elif spec["method"] == FLEX:
        fns = {1.0: _flex_sorted(causal, _pattern(spec))}
    elif spec["method"] == "sdpa":
        fns = {
            1.0: lambda q, k, v, ids: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal
            )
        }
    else:
        ids = torch.zeros(1, heads, n, 1, dtype=torch.int32)  # one bucket: every pair
        fns = {ALPHA: functools.partial(_dense, causal=causal)}
    if spec["method"] == FLEX:  # compile before anything is measured (no backward on CPU tensors)
        with torch.no_grad():
            fns[1.0](q, k, v, ids)
    else:
        small = balanced_buckets(1, 1, 16, 2, spec["top"] or 1, seed=1)
        for fn in fns.values():  # load lazy kernels
            fn(q[:, :1, :16], k[:, :1, :16], v[:, :1, :16], small)
    # The high-water mark only rises, so the baseline is read before anything large is allocated.
    baseline = _peak_rss_mb()
    rows = []
    for alpha, fn in fns.items():
        call = functools.partial(fn, ids=ids if spec["method"] != "sdpa" else None)
        measured = _measure_cpu(call, (q, k, v), reps, spec["budget_s"], backward=spec["method"] != FLEX)
        row = {**base, "alpha": alpha, "baseline_rss_mb": baseline, **measured}
        for phase in ("forward", "forward_backward"):
            if f"peak_rss_mb_{phase}" in row:
                row[f"extra_mb_{phase}"] = row[f"peak_rss_mb_{phase}"] - baseline
        rows.append(row)
    # after the measurements: counting must not raise their baseline
    pairs = count_pairs(ids, causal, **_pattern(spec)) if bucketed else None
    overhead = {}
    if spec["method"] == "ours":
        from attention_kernels.bucketed.torch_path import forward_plan, takes_sdpa_blocks

        opts = _plan_options(causal, **_pattern(spec))
        by_sdpa = takes_sdpa_blocks(1.0, ids, (dim, dim), **opts)

        def plan() -> object:
            """The plan the softmax forward runs (without gradients)."""
            return forward_plan(ids, ids, alpha=1.0, **opts, sdpa_blocks=by_sdpa)

        overhead = _predictor_overhead(
            q,
            k,
            spec["buckets"],
            spec["top"],
            plan,
            lambda fn: _median_wall_ms(fn, max(reps, OVERHEAD_REPS), spec["budget_s"]),
        )
    for row in rows:
        row["pairs"] = pairs
        row["density"] = 1.0 if pairs is None else density(pairs, 1, heads, n, causal)
        if "forward_ms" in row:  # the pairs' two products, 4·dim FLOPs each: how fast pairs become output
            attended = row["density"] * heads * (n * (n + 1) // 2 if causal else n * n)
            row["pair_gflops_forward"] = 4 * dim * attended / (row["forward_ms"] * 1e6)
        _add_overhead(row, overhead)
    return rows


def _add_overhead(row: dict[str, Any], overhead: dict[str, Any]) -> None:
    """A row of ours gains the predictor's times and, per projector, (predict + plan) / forward."""
    row.update(overhead)
    if "forward_ms" in row and "plan_ms" in overhead:
        for name, key in OVERHEADS.items():
            row[name] = (overhead[key] + overhead["plan_ms"]) / row["forward_ms"]


def _predictor_overhead(
    q: torch.Tensor,
    k: torch.Tensor,
    buckets: int,
    top: int,
    plan: Callable[[], object],
    timer: Callable[[Callable[[], object]], float],
) -> dict[str, float]:
    """Median ms (by ``timer``) of what a learned predictor adds to an attention call, with the k-means
    predictor's shapes: ``predict_ms`` projects queries and keys per head through the projector of the
    default and long-context profiles (the pipeline's own :class:`~pipeline.projection.model.HeadProjections`,
    a shared tanh MLP of ``PREDICTOR_HIDDEN`` units to rank ``PREDICTOR_RANK``) and gives each its ``top``
    nearest of ``buckets`` centroids (:func:`~attention_kernels.predictor_maps.nearest_centroids`, the k-means
    predictor's, taken from there: the ``pipeline.predictors`` package imports transformers, seconds in every
    worker);
    ``predict_linear_ms`` the same through the paper's projector (the GPU profile's: a linear map to rank
    ``PREDICTOR_RANK`` for queries and one for keys); ``plan_ms`` runs ``plan``, which lays the pairs of the
    measured bucket ids out in blocks (the planning the forward time already includes; random centroids
    would give other, unbalanced buckets)."""
    from attention_kernels.predictor_maps import nearest_centroids
    from pipeline.projection.model import HeadProjections

    heads, dim = q.shape[1], q.shape[3]
    gen = torch.Generator().manual_seed(1)
    projectors = {
        "predict_ms": HeadProjections(
            heads, dim, PREDICTOR_RANK, shared=True, hidden=PREDICTOR_HIDDEN, generator=gen
        ),
        "predict_linear_ms": HeadProjections(heads, dim, PREDICTOR_RANK, generator=gen),
    }
    centroids = torch.randn(heads, buckets, PREDICTOR_RANK, generator=gen).to(q.device, q.dtype)  # (h, B, r)

    def predictor(project: HeadProjections) -> Callable[[], list[torch.Tensor]]:
        project = project.to(q.device, q.dtype)

        @torch.no_grad()
        def predict() -> list[torch.Tensor]:
            """Bucket ids (1, h, n, top) of the queries, then of the keys."""
            return [nearest_centroids(low, centroids, top) for low in project(q, k)]

        return predict

    timed = {key: timer(predictor(project)) for key, project in projectors.items()}
    return timed | {"plan_ms": timer(plan)}


def structured_inputs(
    batch: int, heads: int, n: int, dim: int, rank: int, *, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    """q, k, v (batch, heads, n, dim) whose α-entmax support is small and local, and an indexer for them.

    Every position i has smooth features f(i) = (cos ω_p i, sin ω_p i) for the periods ``STRUCTURE_PERIODS``
    (rank 8), mixed into ``dim`` channels by a random orthonormal map per head and scaled by
    ``STRUCTURE_STRENGTH``; q and k add independent Gaussian noise (``STRUCTURE_NOISE``) on every channel, v
    is Gaussian. So q_i·k_j peaks at j = i and falls with |i − j| (at d = 64, α = 1.5 keeps about 10 keys
    per query, at most ~25). The indexer is q @ P and k @ P with P the top-``rank`` right singular vectors of
    the head's stacked [q; k] (what a PCA of the head's queries and keys would give).
    """
    gen = torch.Generator().manual_seed(seed)
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    omega = 2 * torch.pi / torch.tensor(STRUCTURE_PERIODS, dtype=torch.float64)
    feats = torch.cat([torch.cos(pos * omega), torch.sin(pos * omega)], 1)  # (n, 8)
    mix = torch.linalg.qr(torch.randn(batch, heads, dim, dim, generator=gen, dtype=torch.float64))[0]
    base = feats @ mix[..., : feats.shape[1]].transpose(-1, -2) * STRUCTURE_STRENGTH  # (b, h, n, dim)
    q, k = (
        base + STRUCTURE_NOISE * torch.randn(base.shape, generator=gen, dtype=torch.float64) for _ in "qk"
    )
    v = torch.randn(base.shape, generator=gen, dtype=torch.float64)
    proj = torch.linalg.svd(torch.cat([q, k], 2), full_matrices=False).Vh[..., :rank, :].transpose(-1, -2)
    return tuple(x.to(dtype) for x in (q, k, v, q @ proj, k @ proj))


def scattered_inputs(
    batch: int, heads: int, n: int, dim: int, rank: int, *, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    """:func:`structured_inputs` with the positions shuffled (one permutation for queries and keys): each
    query's support is still about 10 keys, but spread over the whole sequence, so blocks of consecutive
    positions all hold some and only a layout by content can skip them."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return tuple(x[:, :, perm] for x in structured_inputs(batch, heads, n, dim, rank, seed=seed, dtype=dtype))


INPUTS = {"local": structured_inputs, "scattered": scattered_inputs}


def _dense_entmax_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    from attention_kernels.indexed.attention import dense_indexed_reference

    return dense_indexed_reference(q, k, v, alpha=ALPHA, causal=causal)


INDEX_PATHS = (
    ("", "position", "auto"),
    ("_blocks", "position", "torch"),
    ("_clustered", "clustered", "torch"),
)
"""(suffix, order, backend) of the indexed rows: the scanned C++ kernel (what ``backend="auto"`` runs on
CPU), and the block path in the position and the clustered order."""


def run_indexed(cfg: dict[str, Any]) -> dict[str, Any]:
    """The indexed-attention comparison of the CPU suite (module docstring), one thread, in-process."""
    from attention_kernels.indexed.attention import indexed_attention

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    try:
        specs = [(kind, n, causal) for kind in INPUTS for n in cfg["index_sizes"] for causal in (False, True)]
        for kind, n, causal in tqdm(specs, desc="indexed bench", unit="size"):
            q, k, v, qi, ki = INPUTS[kind](1, cfg["heads"], n, cfg["dim"], INDEX_RANK, seed=n)
            methods: dict[str, Callable[..., Any]] = {
                "sdpa": functools.partial(torch.nn.functional.scaled_dot_product_attention, is_causal=causal),
                "dense_entmax": functools.partial(_dense_entmax_cpu, causal=causal),
            }
            for mode in ("certified", "approximate"):
                for suffix, order, backend in INDEX_PATHS:
                    methods[f"indexed_{mode}{suffix}"] = functools.partial(
                        indexed_attention,
                        q_index=qi,
                        k_index=ki,
                        alpha=ALPHA,
                        causal=causal,
                        mode=mode,
                        block=INDEX_BLOCK,
                        order=order,
                        backend=backend,
                    )
            dense_out = None
            for method, fn in methods.items():
                row: dict[str, Any] = {"inputs": kind, "n": n, "causal": causal, "method": method}
                reps = 1 if method == "dense_entmax" else cfg["reps"]
                try:
                    with torch.no_grad():
                        row["forward_ms"] = _median_wall_ms(
                            functools.partial(fn, q, k, v), reps, cfg["budget_s"]
                        )
                        result = (
                            fn(q, k, v, return_stats=True) if method.startswith("indexed") else fn(q, k, v)
                        )
                    if method == "dense_entmax":
                        dense_out = result
                    else:
                        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

                        def step(fn=fn, qg=qg, kg=kg, vg=vg) -> None:
                            fn(qg, kg, vg).sum().backward()
                            qg.grad = kg.grad = vg.grad = None

                        row["forward_backward_ms"] = _median_wall_ms(step, reps, cfg["budget_s"])
                    if method.startswith("indexed"):
                        out, stats = result
                        row.update(
                            {key: stats[key] for key in ("blocks_skipped", "predicted_mean", "filled")}
                        )
                        row.update(
                            {
                                f"{key[:-2]}_ms": stats[key] * 1e3
                                for key in ("indexer_s", "bounds_s", "sparse_s")
                            }
                        )
                        if dense_out is not None:
                            row["max_abs_error"] = float((out - dense_out).abs().max())
                    row["status"] = "ok"
                except (RuntimeError, MemoryError) as err:
                    row["status"] = "oom" if _is_oom(err) else failure_status(err)
                rows.append(row)
    finally:
        torch.set_num_threads(threads)
    by_key = {(r["inputs"], r["n"], r["causal"], r["method"]): r for r in rows}
    for r in rows:
        if r["method"].startswith("indexed") and r["status"] == "ok":
            for base in ("sdpa", "dense_entmax"):
                other = by_key[(r["inputs"], r["n"], r["causal"], base)]
                for phase in ("forward", "forward_backward"):
                    if f"{phase}_ms" in other and f"{phase}_ms" in r:
                        r[f"speedup_{phase}_vs_{base}"] = other[f"{phase}_ms"] / r[f"{phase}_ms"]
    return {
        "settings": {
            "batch": 1,
            "heads": cfg["heads"],
            "dim": cfg["dim"],
            "rank": INDEX_RANK,
            "block": INDEX_BLOCK,
            "alpha": ALPHA,
            "threads": 1,
            "reps": cfg["reps"],
            "budget_s": cfg["budget_s"],
            "inputs": {
                "local": "structured_inputs (smooth positional features)",
                "scattered": "scattered_inputs (the same, positions shuffled)",
            },
        },
        "results": rows,
    }


def indexed_table(section: dict[str, Any]) -> str:
    columns = [
        text_column("inputs", "inputs", "<9"),
        text_column("n", "n", ">6"),
        text_column("causal", "causal", ">6"),
        text_column("method", "method", "<30"),
        number_column("fwd ms", "forward_ms", "9.1f"),
        number_column("f+b ms", "forward_backward_ms", "9.1f"),
        number_column("pass1", "indexer_ms", "7.1f"),
        number_column("bounds", "bounds_ms", "7.1f"),
        number_column("sparse", "sparse_ms", "7.1f"),
        number_column("skip", "blocks_skipped", "6.3f"),
        number_column("|S|", "predicted_mean", "5.1f"),
        number_column("x sdpa", "speedup_forward_vs_sdpa", "7.2f"),
        number_column("x entmax", "speedup_forward_vs_dense_entmax", "8.1f"),
        number_column("err", "max_abs_error", "8.1e"),
    ]
    return "\n".join(table_lines(section["results"], columns))


def _spawn_cpu_worker(spec: dict[str, Any]) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.attention", "--worker", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    # A worker killed by the kernel's OOM killer dies by SIGKILL without writing its result.
    status = (
        "oom" if proc.returncode == -9 else f"failed: exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    )
    base = {key: spec[key] for key in ("n", "causal", "method", "top", "pattern")}
    one = ALPHA if spec["method"] == "dense_entmax" else 1.0
    alphas = (1.0, ALPHA) if spec["method"] == "ours" else (one,)
    return [{**base, "alpha": alpha, "status": status} for alpha in alphas]


def cpu_specs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """One spec per (n, causal, method[, top, pattern]); dense entmax only up to ``CPU_DENSE_MAX``;
    FlexAttention when ``cfg["flex"]`` (its compilation takes seconds per configuration)."""
    common = {key: cfg[key] for key in ("heads", "dim", "reps", "budget_s", "buckets")}
    specs = []
    for n in cfg["sizes"]:
        for causal in (False, True):
            base = {"n": n, "causal": causal, "top": None, "pattern": None, **common}
            specs.append({**base, "method": "sdpa"})
            if n <= CPU_DENSE_MAX:
                specs.append({**base, "method": "dense_entmax"})
            for top in cfg["tops"]:
                for pattern in (False, True):
                    for method in ("ours", FLEX) if cfg["flex"] else ("ours",):
                        specs.append({**base, "method": method, "top": top, "pattern": pattern})
    return specs


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Speed-up over SDPA, efficiency = speed-up × density and ent/sm on our rows, for both phases."""
    sdpa = {(r["n"], r["causal"]): r for r in rows if r["method"] == "sdpa"}
    softmax = {
        (r["n"], r["causal"], r["top"], r["pattern"]): r
        for r in rows
        if r["method"] == "ours" and r["alpha"] == 1
    }
    for row in rows:
        if row["method"] not in ("ours", FLEX):
            continue
        dense, soft = (
            sdpa.get((row["n"], row["causal"]), {}),
            softmax[(row["n"], row["causal"], row["top"], row["pattern"])] if row["method"] == "ours" else {},
        )
        for phase in ("forward", "forward_backward"):
            key = f"{phase}_ms"
            if key in row and key in dense:
                row[f"speedup_{phase}"] = dense[key] / row[key]
                row[f"efficiency_{phase}"] = row[f"speedup_{phase}"] * row["density"]
            if key in row and key in soft:
                row[f"entmax_over_softmax_{phase}"] = row[key] / soft[key]


def run_cpu(
    quick: bool, only: str | None = None, sizes: list[int] | None = None, buckets: int = CPU_BUCKETS
) -> dict[str, Any]:
    """The CPU suite: the bucketed comparison and the indexed one (``only`` one of them), at the suite's
    sizes or at ``sizes``, with ``buckets`` balanced buckets."""
    cfg = dict(CPU_QUICK if quick else CPU_FULL, index_sizes=INDEX_SIZES["quick" if quick else "full"])
    cfg["buckets"] = buckets
    if sizes:
        cfg.update(sizes=sizes, index_sizes=sizes)
    specs = [] if only == "indexed" else cpu_specs(cfg)
    rows = [row for spec in tqdm(specs, desc="cpu bench", unit="run") for row in _spawn_cpu_worker(spec)]
    add_ratios(rows)
    indexed = {"indexed": run_indexed(cfg)} if only != "bucketed" else {}
    return {
        "device": "cpu",
        "suite": "cpu",
        **cpu_facts(),
        "threads": 1,
        "torch": torch.__version__,
        "settings": {
            "batch": 1,
            "heads": cfg["heads"],
            "dim": cfg["dim"],
            "buckets": buckets,
            "tops": cfg["tops"],
            "window": CPU_WINDOW,
            "global_tokens": CPU_GLOBAL,
            "alphas": [1.0, ALPHA],
            "dtype": "float32",
            "threads": 1,
            "reps": cfg["reps"],
            "budget_s": cfg["budget_s"],
            "memory": "peak RSS of a fresh subprocess minus its baseline after inputs and warm-up",
            "speedup": "sdpa time / our time",
            "efficiency": "speedup × density",
            "pair_gflops": "4 · dim · attended pairs / forward time (SDPA: every valid pair)",
            "overhead": "(predict + plan) / our forward time, k-means shapes: shared tanh MLP of "
            f"{PREDICTOR_HIDDEN} units to rank {PREDICTOR_RANK}, {buckets} centroids; predict and plan "
            f"medians of at least {OVERHEAD_REPS} repetitions",
            "overhead_linear": "the same through a linear map to rank "
            f"{PREDICTOR_RANK} for queries and one for keys (the paper's projector)",
        },
        "results": rows,
        **indexed,
    }


def cpu_facts() -> dict[str, Any]:
    """The processor and what multiplied its blocks, without which the CPU suite's ratios cannot be read
    across machines: the block products' C++ kernel runs on AVX-512 alone; elsewhere ``torch.bmm`` of the
    gathered rows runs (:mod:`attention_kernels.bucketed.block_products`), and MKL's AVX2 kernels serve it and
    SDPA alike. ``vector_bits`` is the width the C++ kernels were built for (None where none could be
    built)."""
    from attention_kernels.bucketed.block_products import wide_kernel
    from attention_kernels.native import library, processor_name

    built = library("block_products")
    products = "C++ on 512-bit vectors" if wide_kernel() is not None else "torch.bmm of gathered rows"
    return {
        "device_name": processor_name(),
        "vector_bits": None if built is None else 8 * int(built.vector_bytes()),
        "block_products": products,
    }


Column = tuple[str, str, Callable[[dict[str, Any]], str]]  # title, its alignment, the cell of a row


def text_column(title: str, key: str, align: str) -> Column:
    """A column of ``str(row[key])`` aligned by ``align`` (a dash where the row has no such key)."""
    return title, align, lambda row: format(str(row.get(key, DASH)), align)


def number_column(title: str, key: str, spec: str) -> Column:
    """A number column formatted by the float format ``spec`` (a dash where the row has no number, see
    :func:`~pipeline.evaluation.report.formatted`), its title right-aligned to the same width."""
    return title, ">" + spec.split(".")[0], lambda row: formatted(row.get(key), spec)


def table_lines(rows: list[dict[str, Any]], columns: list[Column]) -> list[str]:
    """A header line and one line per row, each ending in the row's status."""
    header = " ".join(format(title, align) for title, align, _ in columns) + "  status"
    return [header] + [" ".join(cell(row) for _, _, cell in columns) + f"  {row['status']}" for row in rows]


def cpu_table(report: dict[str, Any]) -> str:
    lines = table_lines(
        report["results"],
        [
            text_column("n", "n", ">6"),
            text_column("causal", "causal", ">6"),
            number_column("top", "top", "3.0f"),
            text_column("pattern", "pattern", ">7"),
            text_column("method", "method", "<13"),
            number_column("alpha", "alpha", "5.1f"),
            number_column("density", "density", "8.4f"),
            number_column("fwd ms", "forward_ms", "9.1f"),
            number_column("f+b ms", "forward_backward_ms", "9.1f"),
            number_column("x sdpa", "speedup_forward", "7.2f"),
            number_column("eff fwd", "efficiency_forward", "8.2f"),
            number_column("eff f+b", "efficiency_forward_backward", "8.2f"),
            number_column("GF/s fwd", "pair_gflops_forward", "8.1f"),
            number_column("ent/sm", "entmax_over_softmax_forward", "7.2f"),
            number_column("ent/sm f+b", "entmax_over_softmax_forward_backward", "10.2f"),
            number_column("overhead", "overhead_forward", "8.2f"),
            number_column("ovh lin", "overhead_linear_forward", "7.2f"),
            number_column("f+b MiB", "extra_mb_forward_backward", "8.1f"),
        ],
    )
    if not report["results"]:  # --only indexed
        lines = []
    if "block_products" in report:
        width = f"{report['vector_bits']}-bit vectors" if report["vector_bits"] else "no C++ kernels"
        lines.append(f"on {report['device_name']} ({width}): block products by {report['block_products']}")
        if report["results"]:
            lines.append(f"{report['settings']['buckets']} balanced buckets")
    if "indexed" in report:
        lines += ["", "indexed attention (one thread; ms; skip = share of key blocks skipped)"]
        lines.append(indexed_table(report["indexed"]))
    return "\n".join(lines)


def _n_axis(ax, ns: list[int]) -> None:
    """Log₂ x axis labelled at the measured sequence lengths only."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log", base=2)
    if ns:
        ax.set_xticks(sorted(set(ns)), [str(n) for n in sorted(set(ns))])
    ax.xaxis.set_minor_formatter(NullFormatter())


def cpu_plot(report: dict[str, Any], axes) -> None:
    """A row of panels for full attention and one for causal, on a (2, 1 + tops) grid: forward time against
    n of SDPA, dense α-entmax, ours and FlexAttention (top-1, no pattern); then for each top the forward
    speed-up over SDPA of ours and FlexAttention, with window and global tokens dashed, beside the ideal
    1/density (dotted): the speed-up if each attended pair cost what SDPA's pairs cost."""
    rows = [r for r in report["results"] if r["status"] == "ok"]
    if not rows:  # --only indexed: nothing to draw
        for ax in axes.flat:
            ax.set_title("no bucketed rows (--only indexed)")
        return
    tops = sorted({r["top"] for r in rows if r["top"] is not None})
    for line, causal in enumerate((False, True)):
        here = [r for r in rows if r["causal"] == causal]
        kind = "causal" if causal else "full"
        times: dict[str, list[tuple[int, float]]] = {}
        for r in here:
            if r["method"] not in ("ours", FLEX):
                times.setdefault(r["method"], []).append((r["n"], r["forward_ms"]))
            elif r["top"] == 1 and not r["pattern"]:
                times.setdefault(f"{_short(r)} α={r['alpha']:g}", []).append((r["n"], r["forward_ms"]))
        _plot_series(axes[line][0], times)
        axes[line][0].set(yscale="log", ylabel="forward ms", title=f"{kind}: forward time, top-1")
        for col, top in enumerate(tops, start=1):
            speedups: dict[str, list[tuple[int, float]]] = {}
            for r in here:
                if r["top"] == top and "speedup_forward" in r:
                    pattern = " +pattern" if r["pattern"] else ""
                    label = f"{_short(r)} α={r['alpha']:g}{pattern}"
                    speedups.setdefault(label, []).append((r["n"], r["speedup_forward"]))
                    if r["method"] == "ours" and r["alpha"] == 1:
                        speedups.setdefault(f"ideal{pattern}", []).append((r["n"], 1 / r["density"]))
            ax = axes[line][col]
            ax.axhline(1.0, color="black", lw=0.6)  # SDPA
            _plot_series(ax, speedups)
            ax.set(yscale="log", ylabel="speed-up over SDPA", title=f"{kind}: forward speed-up, top-{top}")


def _short(row: dict[str, Any]) -> str:
    """A row's method as the figure names it."""
    return "flex" if row["method"] == FLEX else row["method"]


def _plot_series(ax, series: dict[str, list[tuple[int, float]]]) -> None:
    """Each series against n (window and global tokens dashed, ideals dotted), on the measured n."""
    for label, points in sorted(series.items()):
        xs, ys = zip(*sorted(points), strict=True)
        style = ":" if label.startswith("ideal") else "--" if "+pattern" in label else "-"
        ax.plot(xs, ys, style, marker="o", ms=3, label=label)
    _n_axis(ax, [n for points in series.values() for n, _ in points])
    ax.set_xlabel("n")
    ax.legend(fontsize=6)


# ----------------------------------------------------------------------------------------------- GPU


def _median_device_ms(
    fn: Callable[[], object], device: torch.device, warmup: int, reps: int, budget_s: float = 0.0
) -> float:
    """Median milliseconds of ``fn`` after ``warmup`` calls, over ``reps`` calls (at least one) and then more
    while they have taken less than ``budget_s`` in all, up to ``CPU_MAX_REPS`` (:mod:`pipeline.timer`): the
    wall clock, or on a GPU the CUDA events of :func:`_cuda_seconds`."""
    seconds = median_seconds(
        fn,
        repeats=max(reps, 1),
        warmup=warmup,
        budget_s=budget_s,
        max_repeats=CPU_MAX_REPS,
        clock=_cuda_seconds if device.type == "cuda" else None,
    )
    return seconds * 1e3


def _cuda_seconds(fn: Callable[[], object]) -> float:
    """Seconds of one call by CUDA events, the GPU's own clock: from the start to the end of the work the
    call queued, earlier work waited for first."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def measure_gpu(
    attention: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], cfg: dict[str, Any]
) -> dict[str, Any]:
    """Forward (no grad, on detached inputs) and forward+backward of ``attention(q, k, v)``: median ms and,
    on CUDA, peak allocated MiB above the inputs."""
    device = inputs[0].device
    on_cuda = device.type == "cuda"
    detached = tuple(x.detach() for x in inputs)

    def forward() -> None:
        attention(*detached)

    def step() -> None:
        attention(*inputs).float().sum().backward()
        for x in inputs:
            x.grad = None

    row: dict[str, Any] = {"status": "ok"}
    if on_cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
    for phase, fn in (("forward", forward), ("forward_backward", step)):
        try:
            if on_cuda:
                torch.cuda.reset_peak_memory_stats()
            with torch.set_grad_enabled(phase != "forward"):
                row[f"{phase}_ms"] = _median_device_ms(fn, device, cfg["warmup"], cfg["reps"])
            if on_cuda:
                row[f"peak_mb_{phase}"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        except Exception as err:  # a method that cannot run is a result, not a crash
            oom = (on_cuda and isinstance(err, torch.cuda.OutOfMemoryError)) or _is_oom(err)
            row["status"] = "oom" if oom else failure_status(err, phase)
            break
    for x in inputs:
        x.grad = None
    if on_cuda:
        torch.cuda.empty_cache()
    return row


def _sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _flex_mask_mod(
    ids: torch.Tensor,
    causal: bool,
    positions: torch.Tensor | None = None,
    radius: int = -1,
    global_tokens: int = 0,
):
    """mask_mod for FlexAttention: share a bucket id ≥ 0 (any of T × T slots), or lie in the window band
    (|i − j| ≤ ``radius``) or on a global row or column (position < ``global_tokens``); and j ≤ i when causal.
    ``ids`` (batch, heads, n, T) in the layout the call uses; ``positions`` (batch, heads, n) the original
    position of each slot when the tokens are permuted (None: the identity)."""
    slots = [
        ids[..., s].contiguous() for s in range(ids.shape[-1])
    ]  # T × (batch, heads, n): index by tensors

    def mask_mod(b, h, q_idx, kv_idx):
        i, j = (q_idx, kv_idx) if positions is None else (positions[b, h, q_idx], positions[b, h, kv_idx])
        hit = None
        for q_slot in slots:
            qs = q_slot[b, h, q_idx]
            for k_slot in slots:
                same = (qs == k_slot[b, h, kv_idx]) & (qs >= 0)
                hit = same if hit is None else hit | same
        if radius >= 0:
            hit = hit | ((i - j).abs() <= radius)
        if global_tokens > 0:
            hit = hit | (i < global_tokens) | (j < global_tokens)
        return hit & (j <= i) if causal else hit

    return mask_mod


def failure_status(err: BaseException, phase: str = "") -> str:
    """One-line status for a method that could not run (in ``phase`` when given)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    where = f" in {phase.replace('_', '+')}" if phase else ""
    return f"failed{where}: {type(err).__name__}: {first[:300]}"


def _dense_entmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Dense α-entmax attention through the entmax package, normaliser in fp32."""
    from entmax import entmax15

    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return entmax15(scores, dim=-1).to(v.dtype) @ v


def _add_gpu_overhead(
    rows: list[dict[str, Any]],
    q: torch.Tensor,
    k: torch.Tensor,
    ids: torch.Tensor,
    buckets: int,
    causal: bool,
    cfg: dict[str, Any],
) -> None:
    """The predictor's overhead columns of our rows (as on the CPU suite): the projection, the nearest
    centroids and the planning the call would run for these bucket ids, over the forward time."""
    device, dim, top = q.device, q.shape[-1], ids.shape[-1]
    if device.type == "cuda":
        from attention_kernels.bucketed import triton_kernel as tb

        tiles = tb.default_tiles(dim, top, q.dtype, device, alpha=ALPHA, causal=causal)
        plan_cfg = tb._make_config(ALPHA, dim**-0.5, causal, -1, 0, dim, tiles, q.dtype)
        flat = ids.flatten(0, 1)

        def plan() -> object:
            return tb._make_plan(flat, flat, plan_cfg)
    else:  # the smoke test on CPU tensors runs the PyTorch path
        from attention_kernels.bucketed.torch_path import plan_attention

        def plan() -> object:
            return plan_attention(ids, ids, causal=causal)

    def timer(fn: Callable[[], object]) -> float:
        return _median_device_ms(fn, device, cfg["warmup"] + 1, max(cfg["reps"], OVERHEAD_REPS))

    try:
        overhead = _predictor_overhead(q, k, buckets, top, plan, timer)
    except Exception as err:  # the pipeline's predictor code may not import where only the kernels run
        overhead = {"overhead_status": failure_status(err)}
    for row in rows:
        _add_overhead(row, overhead)


INDEX_MODES = ("certified", "approximate")  # the indexed comparison's modes, each a row per configuration


def _dense_entmax_by_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Dense α-entmax attention in fp32 from q, k, v as given (bf16 inputs rounded already), one head at a
    time, so that one head's n × n scores are held at once (1 GiB at n = 16384)."""
    from attention_kernels.indexed.attention import dense_indexed_reference

    with torch.no_grad():
        heads = [
            dense_indexed_reference(*(x[:, h : h + 1].float() for x in (q, k, v)), alpha=ALPHA, causal=causal)
            for h in range(q.shape[1])
        ]
    return torch.cat(heads, 1)


def gpu_indexed_rows(
    kind: str,
    n: int,
    causal: bool,
    cfg: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    sdpa_row: dict[str, Any],
) -> list[dict[str, Any]]:
    """The indexed rows of the GPU suite for one (inputs, n, causal), one per mode of ``INDEX_MODES``
    (module docstring): ``indexed_attention`` on ``INPUTS[kind]`` timed by :func:`measure_gpu` (its forward
    under no grad: the Triton kernel for certified mode on CUDA), then one more forward with its statistics
    (share of key blocks skipped, mean predicted set, phase ms) and its largest absolute deviation from
    :func:`_dense_entmax_by_head` on the same inputs; speedups over ``sdpa_row`` (flash SDPA, same n and
    causality)."""
    from attention_kernels.indexed.attention import indexed_attention

    heads, dim = cfg["heads"], cfg["dim"]
    base = {"n": n, "causal": causal, "buckets": None, "top": None, "inputs": kind}
    try:
        q, k, v, qi, ki = (x.to(device, dtype) for x in INPUTS[kind](1, heads, n, dim, INDEX_RANK, seed=n))
    except Exception as err:  # a device an earlier fault left unusable: the rows say so
        return [{**base, "method": f"indexed_{mode}", "status": failure_status(err)} for mode in INDEX_MODES]
    reference, reference_status = None, None
    try:
        reference = _dense_entmax_by_head(q, k, v, causal)
    except Exception as err:  # the reference's n × n scores may not fit: the rows keep their times
        reference_status = "oom" if _is_oom(err) else failure_status(err)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    leaves = tuple(x.requires_grad_() for x in (q, k, v))
    rows = []
    for mode in INDEX_MODES:
        fn = functools.partial(
            indexed_attention,
            q_index=qi,
            k_index=ki,
            alpha=ALPHA,
            causal=causal,
            mode=mode,
            block=INDEX_BLOCK,
        )
        row = {**base, "method": f"indexed_{mode}", **measure_gpu(fn, leaves, cfg)}
        if row["status"] == "ok":
            try:
                with torch.no_grad():
                    out, stats = fn(*(x.detach() for x in leaves), return_stats=True)
                row.update({key: stats[key] for key in ("blocks_skipped", "predicted_mean")})
                row.update(
                    {f"{key[:-2]}_ms": stats[key] * 1e3 for key in ("indexer_s", "bounds_s", "sparse_s")}
                )
                if reference is not None:
                    row["max_abs_error"] = float((out.float() - reference).abs().max())
                else:
                    row["reference_status"] = reference_status
            except Exception as err:  # a forward that ran timed but fails with statistics is a failure too
                row["status"] = failure_status(err, "forward")
        for phase in ("forward", "forward_backward"):
            if f"{phase}_ms" in row and f"{phase}_ms" in sdpa_row:
                row[f"speedup_{phase}"] = sdpa_row[f"{phase}_ms"] / row[f"{phase}_ms"]
        rows.append(row)
    return rows


def _add_efficiency(row: dict[str, Any], sdpa_row: dict[str, Any]) -> None:
    """A bucketed row's speedup over flash SDPA and its efficiency (speedup × density), per phase."""
    for key in ("forward", "forward_backward"):
        if f"{key}_ms" in row and f"{key}_ms" in sdpa_row:
            row[f"speedup_{key}"] = sdpa_row[f"{key}_ms"] / row[f"{key}_ms"]
            row[f"efficiency_{key}"] = row[f"speedup_{key}"] * row["density"]


def _speedups_over(rows: list[dict[str, Any]], base: dict[str, Any]) -> None:
    """Each row's forward and forward+backward speedup over ``base`` (``speedup_{phase}_vs_{method}``)."""
    for row in rows:
        for phase in ("forward", "forward_backward"):
            if f"{phase}_ms" in row and f"{phase}_ms" in base:
                row[f"speedup_{phase}_vs_{base['method']}"] = base[f"{phase}_ms"] / row[f"{phase}_ms"]


def run_gpu(
    cfg: dict[str, Any], device: torch.device, save: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The GPU comparison (module docstring) with sizes from ``cfg``; on a CPU ``device`` it runs in
    float32 as a smoke test of the suite. ``save`` receives the report so far after each (n, causal)."""
    from attention_kernels.bucketed import bucketed_attention

    on_cuda = device.type == "cuda"
    heads, dim = cfg["heads"], cfg["dim"]
    dtype = torch.bfloat16 if on_cuda else torch.float32  # CPU flash attention and the interpreter lack bf16
    try:
        from torch._dynamo import config as dynamo_config
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        # One graph per (n, grad mode) is compiled; past the default limit of 8, dynamo would fall back to
        # the unfused eager flex_attention, which materialises the scores and would be timed instead.
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
        flex = torch.compile(flex_attention, dynamic=False)
        block_mask = torch.compile(create_block_mask)
        flex_error = None
    except Exception as err:
        flex_error = failure_status(err)
    try:
        from adasplash import adasplash
    except ImportError:
        adasplash = None

    rows: list[dict[str, Any]] = []
    report = {
        "device": device.type,
        "suite": "gpu",
        "device_name": torch.cuda.get_device_name(device) if on_cuda else platform.machine(),
        "torch": torch.__version__,
        "settings": {
            "batch": 1,
            "heads": heads,
            "dim": dim,
            "dtype": str(dtype).removeprefix("torch."),
            "alpha": ALPHA,
            "warmup": cfg["warmup"],
            "reps": cfg["reps"],
            "memory": "peak torch.cuda allocated bytes above the inputs" if on_cuda else "not measured",
            "speedup": "sdpa_flash time / our time",
            "efficiency": "speedup × density",
            "overhead": "(predict + plan) / our forward time, k-means shapes: shared tanh MLP of "
            f"{PREDICTOR_HIDDEN} units to rank {PREDICTOR_RANK}, B centroids; plan: the Triton path's, "
            "which the forward includes",
            "overhead_linear": "the same through a linear map to rank "
            f"{PREDICTOR_RANK} for queries and one for keys (the paper's projector)",
            "indexed": {
                "inputs": cfg["index_inputs"],
                "modes": list(INDEX_MODES),
                "rank": INDEX_RANK,
                "block": INDEX_BLOCK,
                "order": "position",
                "forward": "certified: the Triton kernel on CUDA (the PyTorch path on CPU tensors); "
                "approximate: the PyTorch path",
                "forward_backward": "the PyTorch path (the Triton kernel is forward-only)",
                "max_abs_error": "largest |forward output - dense α-entmax|, the reference in fp32 from the "
                "same inputs, one head at a time",
            },
        },
        "results": rows,
    }
    entmax_oom = False
    combos = [(n, c) for n in cfg["sizes"] for c in (False, True)]
    per_combo = 3 + 3 * len(cfg["buckets"]) * len(cfg["tops"]) + len(INDEX_MODES) * len(cfg["index_inputs"])
    total = len(combos) * per_combo + len(cfg["sizes"]) * len(cfg["buckets"]) * (1 in cfg["tops"])
    bar = tqdm(total=total, desc="gpu bench", unit="run")
    for n, causal in combos:
        gen = torch.Generator(device=device.type).manual_seed(0)
        q, k, v = (
            torch.randn(1, heads, n, dim, generator=gen, device=device, dtype=dtype).requires_grad_()
            for _ in range(3)
        )
        base = {"n": n, "causal": causal, "buckets": None, "top": None, "density": 1.0}
        sdpa = functools.partial(_sdpa_flash, causal=causal)
        sdpa_row = {**base, "method": "sdpa_flash", **measure_gpu(sdpa, (q, k, v), cfg)}
        rows.append(sdpa_row)
        bar.update()

        for buckets in cfg["buckets"]:
            for top in cfg["tops"]:
                ids = balanced_buckets(1, heads, n, buckets, top, seed=buckets * 10 + top, device=device)
                pairs = count_pairs(ids, causal)
                spec = {
                    **base,
                    "buckets": buckets,
                    "top": top,
                    "density": density(pairs, 1, heads, n, causal),
                }
                ours = {}
                for method, alpha in (("ours_entmax", ALPHA), ("ours_softmax", 1.0)):
                    fn = functools.partial(
                        bucketed_attention, q_buckets=ids, k_buckets=ids, alpha=alpha, causal=causal
                    )
                    row = ours[method] = {**spec, "method": method, **measure_gpu(fn, (q, k, v), cfg)}
                    _add_efficiency(row, sdpa_row)
                    rows.append(row)
                    bar.update()
                _add_gpu_overhead(list(ours.values()), q.detach(), k.detach(), ids, buckets, causal, cfg)
                entmax, softmax = ours["ours_entmax"], ours["ours_softmax"]
                for key in ("forward", "forward_backward"):
                    if f"{key}_ms" in entmax and f"{key}_ms" in softmax:
                        entmax[f"entmax_over_softmax_{key}"] = entmax[f"{key}_ms"] / softmax[f"{key}_ms"]
                if top == 1 and not causal:  # whole buckets: the PyTorch path's blocks of flash SDPA
                    fn = functools.partial(
                        bucketed_attention, q_buckets=ids, k_buckets=ids, alpha=1.0, backend="torch"
                    )
                    row = {**spec, "method": TORCH_PATH, **measure_gpu(fn, (q, k, v), cfg)}
                    _add_efficiency(row, sdpa_row)
                    rows.append(row)
                    bar.update()
                if flex_error is not None:
                    rows.append({**spec, "method": "flex", "status": flex_error})
                else:
                    try:
                        mask = block_mask(_flex_mask_mod(ids, causal), 1, heads, n, n, device=device)
                        fn = functools.partial(flex, block_mask=mask)
                        rows.append({**spec, "method": "flex", **measure_gpu(fn, (q, k, v), cfg)})
                    except Exception as err:  # compilation or mask construction failures are results too
                        rows.append({**spec, "method": "flex", "status": failure_status(err)})
                bar.update()
        # Last: a fault of another library's kernel (an illegal address) would leave the device unusable for
        # every later measurement, ours included.
        if entmax_oom:  # larger n cannot fit either
            rows.append({**base, "method": "dense_entmax", "status": "oom"})
        else:
            entmax_row = measure_gpu(functools.partial(_dense_entmax, causal=causal), (q, k, v), cfg)
            entmax_oom = entmax_row["status"] == "oom"
            rows.append({**base, "method": "dense_entmax", **entmax_row})
        bar.update()
        if adasplash is None:
            rows.append({**base, "method": "adasplash", "status": "failed: adasplash is not installed"})
        else:
            fn = functools.partial(adasplash, alpha=ALPHA, is_causal=causal)
            rows.append({**base, "method": "adasplash", **measure_gpu(fn, (q, k, v), cfg)})
        bar.update()
        del q, k, v
        if on_cuda:
            torch.cuda.empty_cache()
        if save is not None:
            save(report)
    # The indexed comparison after every other row: its Triton forward is the newest kernel here, and a fault
    # of it (an illegal address) would leave the device unusable for every later measurement.
    for n, causal in combos if cfg["index_inputs"] else []:
        dense = {r["method"]: r for r in rows if (r["n"], r["causal"], r["buckets"]) == (n, causal, None)}
        indexed = []
        for kind in cfg["index_inputs"]:
            indexed += gpu_indexed_rows(kind, n, causal, cfg, device, dtype, dense["sdpa_flash"])
            bar.update(len(INDEX_MODES))
        _speedups_over(indexed, dense["dense_entmax"])  # dense α-entmax's time does not depend on the values
        rows += indexed
        if save is not None:
            save(report)
    bar.close()
    return report


def gpu_table(report: dict[str, Any]) -> str:
    """The comparison, a line per (method, configuration), then why the overhead is missing, if it is.
    Indexed rows name their inputs and carry the share of key blocks skipped, the speedup over dense
    α-entmax and the deviation from it."""
    lines = table_lines(
        report["results"],
        [
            text_column("n", "n", ">6"),
            text_column("causal", "causal", ">6"),
            number_column("B", "buckets", "3.0f"),
            number_column("top", "top", "3.0f"),
            text_column("method", "method", "<19"),
            text_column("inputs", "inputs", "<9"),
            number_column("density", "density", "8.4f"),
            number_column("skip", "blocks_skipped", "6.3f"),
            number_column("fwd ms", "forward_ms", "9.2f"),
            number_column("fwd+bwd ms", "forward_backward_ms", "10.2f"),
            number_column("x sdpa", "speedup_forward", "7.2f"),
            number_column("eff fwd", "efficiency_forward", "8.2f"),
            number_column("eff f+b", "efficiency_forward_backward", "8.2f"),
            number_column("ent/sm", "entmax_over_softmax_forward", "7.2f"),
            number_column("overhead", "overhead_forward", "8.3f"),
            number_column("ovh lin", "overhead_linear_forward", "7.3f"),
            number_column("x entmax", "speedup_forward_vs_dense_entmax", "8.2f"),
            number_column("err", "max_abs_error", "8.1e"),
        ],
    )
    lines += sorted(
        {f"predictor overhead: {r['overhead_status']}" for r in report["results"] if "overhead_status" in r}
    )
    return "\n".join(lines)


def _gpu_label(row: dict[str, Any]) -> str:
    """A GPU row's series in the figure: its method, with its bucket count or its inputs."""
    if row["buckets"] is not None:
        return f"{row['method']} B={row['buckets']}"
    return f"{row['method']} {row['inputs']}" if "inputs" in row else row["method"]


def gpu_plot(report: dict[str, Any], axes) -> None:
    """One panel per (causal, top): forward+backward time against n for every method."""
    rows = [r for r in report["results"] if r["status"] == "ok"]
    tops = sorted({r["top"] for r in report["results"] if r["top"] is not None})
    for col, top in enumerate(tops):
        for row_ax, causal in enumerate((False, True)):
            ax = axes[row_ax][col]
            here = [r for r in rows if r["causal"] == causal and r["top"] in (None, top)]
            series: dict[str, list[tuple[int, float]]] = {}
            for r in here:
                series.setdefault(_gpu_label(r), []).append((r["n"], r["forward_backward_ms"]))
            for label, points in sorted(series.items()):
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, "--" if label.startswith("flex") else "-", marker="o", ms=3, label=label)
            _n_axis(ax, [r["n"] for r in here])
            ax.set(yscale="log", xlabel="n", ylabel="fwd+bwd ms")
            ax.set_title(f"{'causal' if causal else 'full'}, top-{top}")
            ax.legend(fontsize=6)


# ----------------------------------------------------------------------------------------------- main


def write_outputs(report: dict[str, Any], out: Path) -> None:
    """bench.json and bench.png under ``out``, each written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.atomic import atomic_path, write_json

    if report["suite"] == "cpu":
        cols = 1 + len({r["top"] for r in report["results"] if r["top"] is not None})
        fig, axes = plt.subplots(2, cols, figsize=(5 * cols, 9), squeeze=False)
        cpu_plot(report, axes)
    else:
        cols = max(1, len({r["top"] for r in report["results"] if r["top"] is not None}))
        fig, axes = plt.subplots(2, cols, figsize=(6 * cols, 9), squeeze=False)
        gpu_plot(report, axes)
    fig.suptitle(f"bucketed attention benchmark ({report['device_name']})")
    fig.tight_layout()
    with atomic_path(out / "bench.png") as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    write_json(out / "bench.json", report)


def _int_list(what: str, minimum: int) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers ≥ ``minimum`` (``what`` names them in the error)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected {what} ≥ {minimum} separated by commas, got {text!r}")
        return values

    return parse


sizes_list = _int_list("lengths", 16)  # --sizes
buckets_list = _int_list("bucket counts", 1)  # --buckets


def inputs_list(text: str) -> list[str]:
    """An argparse type: comma-separated names of ``INPUTS`` (--index-inputs)."""
    names = text.split(",")
    if not all(name in INPUTS for name in names):
        raise argparse.ArgumentTypeError(
            f"expected some of {', '.join(INPUTS)} separated by commas, got {text!r}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.attention", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--suite",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="the comparison to run (auto: gpu on CUDA, cpu otherwise); gpu on a CPU is a float32 smoke test",
    )
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"), help="output folder")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test that runs in seconds")
    parser.add_argument(
        "--only",
        choices=["indexed", "bucketed"],
        help="CPU suite: run only the indexed-attention or only the bucketed comparison",
    )
    parser.add_argument(
        "--sizes",
        type=sizes_list,
        help="sequence lengths to run instead of the suite's, comma-separated (e.g. 1024,4096)",
    )
    parser.add_argument(
        "--buckets",
        type=buckets_list,
        help="bucket counts instead of 8,16,32 (GPU suite) or one instead of 16 (CPU)",
    )
    parser.add_argument(
        "--index-inputs",
        type=inputs_list,
        help="GPU suite: the inputs of the indexed comparison instead of local (local,scattered: both)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one CPU measurement, in its own process
    args = parser.parse_args(argv)
    kept = keep_freed_memory()  # every method measured in a process that reuses freed memory alike
    if args.worker:
        print(RESULT_PREFIX + json.dumps(cpu_worker(json.loads(args.worker))))
        return 0
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    suite = args.suite if args.suite != "auto" else ("gpu" if device == "cuda" else "cpu")
    if args.only and suite != "cpu":
        parser.error("--only belongs to the CPU suite")
    if args.buckets and suite == "cpu" and len(args.buckets) != 1:
        parser.error(f"--buckets: the CPU suite takes one bucket count; got {len(args.buckets)}")
    if args.index_inputs and suite != "gpu":
        parser.error("--index-inputs belongs to the GPU suite (the CPU suite runs local and scattered)")
    if suite == "cpu" and device == "cuda":
        parser.error("--suite cpu measures the PyTorch path on CPU tensors: use --device cpu")
    if suite == "gpu":
        cfg = GPU_ON_CPU if device == "cpu" else GPU_QUICK if args.quick else GPU_FULL
        chosen = {"sizes": args.sizes, "buckets": args.buckets, "index_inputs": args.index_inputs}
        cfg = {**cfg, **{key: value for key, value in chosen.items() if value is not None}}
        from pipeline.atomic import write_json

        # the results so far after each length, so that a run cut short keeps what it measured
        report = run_gpu(
            cfg, torch.device(device), lambda partial: write_json(args.out / "bench.json", partial)
        )
    else:
        buckets = args.buckets[0] if args.buckets else CPU_BUCKETS
        report = run_cpu(args.quick, only=args.only, sizes=args.sizes, buckets=buckets)
    report["quick"] = args.quick
    report["keep_freed_memory"] = kept
    print(gpu_table(report) if suite == "gpu" else cpu_table(report))
    write_outputs(report, args.out)
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
