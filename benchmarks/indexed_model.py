"""Indexed α-entmax attention on a trained model's own queries and keys, beside softmax SDPA.

``python -m benchmarks.indexed_model MODEL [--data artifacts/data] [--n 4096] [--rank 24] [--margin 0]``

The synthetic inputs of :mod:`benchmarks.attention` say what the kernel can do; this says what it does on a
language model: the α-entmax teacher ``MODEL`` reads the first ``n`` tokens of its corpus's test blocks laid
end to end (as the evaluate stage's speed table does), and every decoder self-attention layer's queries, keys
and values are captured as the model computes them (keys and values repeated to the query heads). The
τ-indexer's maps are its training-free ``fitting="pca"`` (per head, the top ``rank`` eigenvectors of
Σ qqᵀ + Σ kkᵀ, :func:`pipeline.predictors.indexer_fit.principal_basis`), fitted on the ``n`` tokens that
follow, which the timed stretch does not contain.

Per layer, one thread, in this process: forward (no gradient) medians of softmax SDPA (causal) and of
:func:`attention_kernels.indexed.indexed_attention` certified and approximate, each through the scanned C++
kernel and through the block path (approximate: Ŝ uncapped, every key a candidate, as inside the model), with
``--backward`` also forward + backward;
the share of key blocks whose exact scores were never computed, the phase times the call reports; the
teacher's density over the causal pairs, and the share of causal blocks holding any of its support (what an
exact block-sparse kernel cannot skip); against dense α-entmax o (one forward per layer) each output's largest
deviation over max |o| (certified: round-off), with the share of the teacher's support the approximate call's
predicted sets hold; and what skipping could save at best (:func:`skipping_ceilings`: the causal blocks
holding support in the indexer's cluster order, the pairs whose certified low-rank bound passes the teacher's
threshold). ``× SDPA`` is SDPA's time over the method's, measured side by side.
Writes a JSON report and prints one table per layer and the sums over layers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attention_kernels.entmax.dense import entmax_normalize
from attention_kernels.entmax.threshold import threshold_from_probabilities
from attention_kernels.indexed.attention import clustered_orders, indexed_attention, predicted_sets
from pipeline.atomic import write_json
from pipeline.attention.entmax import checked_alpha
from pipeline.attention.loading import load_model
from pipeline.attention.recording import attention_layers, wrapped_attention
from pipeline.attention_kinds import attention_kind
from pipeline.errors import UserError, exits_cleanly
from pipeline.evaluation.speed import long_sequence
from pipeline.predictors.base import HeadInputs
from pipeline.predictors.indexer_fit import low_rank, principal_basis
from pipeline.timer import median_seconds
from pipeline.training.run import prepared_corpus

VARIANTS = [
    ("certified (scanned)", "certified", "auto"),
    ("certified (blocks)", "certified", "torch"),
    ("approximate (scanned)", "approximate", "auto"),
    ("approximate (blocks)", "approximate", "torch"),
]
"""(name, mode, backend) of the indexed calls timed: each mode through the scanned C++ kernel (what
``backend="auto"`` runs on CPU) and through the block path the indexer prunes (PyTorch)."""

LayerInputs = dict[str, Any]
"""One layer's captured inputs: q, k, v (1, h, n, d) float32, and the model's ``scaling``."""


@contextmanager
def captured_layers(model: torch.nn.Module) -> Iterator[list[LayerInputs]]:
    """While the block runs, every decoder self-attention call of ``model`` appends its layer's inputs."""
    layers = {
        id(module): i for i, module in enumerate(attention_layers(model, attention_kind("decoder_self")))
    }
    captured: list[LayerInputs] = []

    def recording(original: Callable[..., Any]) -> Callable[..., Any]:
        def record(module, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any):
            if id(module) in layers:
                groups = query.shape[1] // key.shape[1]  # grouped-query attention shares keys between heads
                captured.append(
                    {
                        "layer": layers[id(module)],
                        "q": query.detach().float(),
                        "k": key.detach().repeat_interleave(groups, dim=1).float(),
                        "v": value.detach().repeat_interleave(groups, dim=1).float(),
                        "scaling": float(kwargs.get("scaling") or module.scaling),
                    }
                )
            return original(module, query, key, value, *args, **kwargs)

        return record

    with wrapped_attention(model, recording):
        yield captured


def model_inputs(model_dir: str, data_dir: str, n: int, rank: int) -> tuple[list[LayerInputs], float]:
    """The decoder self-attention inputs of every layer over the first ``n`` test tokens, each with the
    τ-indexer's projections q_index, k_index (1, h, n, rank) from PCA maps fitted on the next ``n``; and the
    model's α."""
    data, _, _ = prepared_corpus(data_dir, "--data", ("lm", "mqar"))
    model = load_model(model_dir)
    alpha = checked_alpha(getattr(model.config, "entmax_alpha", 1.5))
    if alpha == 1.0:
        raise UserError(
            f"{model_dir}: a softmax model (entmax_alpha 1); allowed: an α-entmax teacher (α > 1)"
        )
    try:
        ids = long_sequence(data["test"], 2 * n)  # (1, 2n): the timed stretch, then the fitting one
    except ValueError as err:
        raise UserError(f"--n {n}: the test split is too short ({err}); allowed: a smaller --n") from None
    stretches = []
    with torch.no_grad():
        for part in (ids[:, :n], ids[:, n:]):
            with captured_layers(model) as layers:
                model(input_ids=part)
            stretches.append(layers)
    timed, fitting = stretches
    everyone = torch.ones(1, n, dtype=torch.bool)
    for layer, fit in zip(timed, fitting, strict=True):
        heads = HeadInputs(q=fit["q"], k=fit["k"], q_valid=everyone, k_valid=everyone, causal=True)
        basis = principal_basis([heads], rank)  # (h, rank, d)
        layer["q_index"], layer["k_index"] = low_rank(layer["q"], basis), low_rank(layer["k"], basis)
        layer["basis"] = basis
    return timed, alpha


def layer_rows(
    inputs: LayerInputs, *, alpha: float, margin: float, block: int, reps: int, backward: bool
) -> list[dict[str, Any]]:
    """Rows of one layer: SDPA, then the indexed calls, each timed, with its phases and its deviation."""
    q, k, v, scale = inputs["q"], inputs["k"], inputs["v"], inputs["scaling"]
    qi, ki = inputs["q_index"], inputs["k_index"]
    every = k.shape[2]  # candidates: Ŝ uncapped, as the model's heads run it
    methods: dict[str, Callable[..., Tensor]] = {
        "sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale
        )
    }
    for name, mode, backend in VARIANTS:
        methods[name] = lambda q, k, v, mode=mode, backend=backend, **extra: indexed_attention(
            q, k, v, qi, ki, alpha=alpha, causal=True, scale=scale, margin=margin, mode=mode,
            candidates=every, block=block, backend=backend, **extra,
        )  # fmt: skip
    with torch.no_grad():
        probs = _dense_probs(q, k, alpha, scale)  # (1, h, n, n)
        dense, support = probs @ v, probs > 0
        predicted = predicted_sets(
            qi, ki, alpha=alpha, causal=True, scale=scale, margin=margin, candidates=every
        )
    recall = float((predicted & support).sum() / support.sum())
    occupancy = support_occupancy(support, block)
    occupancy |= skipping_ceilings(inputs, probs, alpha=alpha, block=block)
    rows = []
    for name, fn in methods.items():
        row: dict[str, Any] = {"layer": inputs["layer"], "method": name}
        if name == "sdpa":
            row |= occupancy
        with torch.no_grad():
            row["forward_ms"] = 1e3 * median_seconds(lambda fn=fn: fn(q, k, v), repeats=reps, warmup=1)
            if name != "sdpa":
                out, stats = fn(q, k, v, return_stats=True)
                row["max_rel_error"] = float((out - dense).abs().max() / dense.abs().max())
                row |= {key: stats[key] for key in ("blocks_skipped", "recomputed", "predicted_mean")}
                row |= {f"{key[:-2]}_ms": 1e3 * stats[key] for key in ("indexer_s", "bounds_s", "sparse_s")}
                if name.startswith("approximate"):
                    row["support_recall"] = recall
        if backward:
            grads = [x.clone().requires_grad_() for x in (q, k, v)]

            def step(fn=fn, grads=grads) -> None:
                fn(*grads).sum().backward()
                for x in grads:
                    x.grad = None

            row["forward_backward_ms"] = 1e3 * median_seconds(step, repeats=reps, warmup=1)
        rows.append(row)
    return with_ratios(rows)


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (SDPA's first) with each time's ratio SDPA / it, × SDPA."""
    for row in rows:
        for phase in ("forward", "forward_backward"):
            if f"{phase}_ms" in row:
                row[f"{phase}_x_sdpa"] = rows[0][f"{phase}_ms"] / row[f"{phase}_ms"]
    return rows


def _dense_probs(q: Tensor, k: Tensor, alpha: float, scale: float) -> Tensor:
    """(1, h, n, n) dense causal α-entmax weights (as
    :func:`attention_kernels.indexed.attention.dense_indexed_reference` computes them, kept here for the
    support as well as the output)."""
    n = q.shape[2]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(future, float("-inf"))  # (1, h, n, n)
    return entmax_normalize(scores, alpha)


def support_occupancy(support: Tensor, block: int) -> dict[str, float]:
    """How much of the causal pairs the teacher's support (1, h, n, n) covers: ``teacher_density``, its share
    of the pairs j ≤ i; ``block_density``, the share of the causal (query block, key block) pairs of
    ``block`` × ``block`` that hold a support pair, the least share of blocks an exact block-sparse kernel
    must compute."""
    h, n = support.shape[1], support.shape[2]
    nb = -(-n // block)
    blocks = _blocks(support, block)
    causal_pairs = h * n * (n + 1) / 2
    causal_blocks = h * nb * (nb + 1) / 2  # (h, nb, nb) lower triangle with the diagonal
    return {
        "teacher_density": float(support.sum()) / causal_pairs,
        "block_density": float(blocks.sum()) / causal_blocks,
    }


def skipping_ceilings(inputs: LayerInputs, probs: Tensor, *, alpha: float, block: int) -> dict[str, float]:
    """What skipping exact scores could save at best on this layer, given the teacher's own weights ``probs``
    (1, h, n, n) and thresholds θ_i (a kernel's running floor only approaches them from below, so it skips
    less):

    - ``clustered_block_density``: as ``block_density`` (:func:`support_occupancy`), with queries and keys
      laid out by :func:`attention_kernels.indexed.attention.clustered_orders` (the indexer's k-d tree, so
      that a key block holds keys of one direction), over the (query block, key block) pairs that hold a
      causal pair: the least share of blocks a block-sparse kernel in that order must score;
    - ``bound_keeps``: the share of causal pairs whose certified per-key bound
      scale·((Pq)·(Pk) + ‖q − PᵀPq‖·‖k − PᵀPk‖) ≥ s = scale·q·k (P the indexer's orthonormal basis, Cauchy–
      Schwarz on the rest) exceeds θ_i: the least share a scan over those (rank + 1)-wide bounds must score
      again exactly to stay exact.
    """
    q, k, scale = inputs["q"], inputs["k"], inputs["scaling"]  # (1, h, n, d)
    basis = inputs["basis"]  # (h, r, d)
    h, n = q.shape[1], q.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool).tril()  # (n, n)
    q_order, k_order = clustered_orders(inputs["q_index"], inputs["k_index"], block=block)  # (h, n) each
    touched = visible = kept = 0
    for head in range(h):  # one head's n × n at a time
        rows, cols = q_order[head], k_order[head]
        support = probs[0, head] > 0  # (n, n)
        touched += int(_blocks(support[rows][:, cols][None, None], block).sum())
        visible += int(_blocks(causal[rows][:, cols][None, None], block).sum())
        scores = (q[0, head] @ k[0, head].T * scale).masked_fill(~causal, float("-inf"))  # (n, n)
        tau = threshold_from_probabilities(scores, alpha, probs[0, head])  # (n, 1)
        theta = tau / (alpha - 1.0)  # in score units
        (q_low, q_rest), (k_low, k_rest) = (_split(x, basis[head]) for x in (q[0, head], k[0, head]))
        bounds = (q_low @ k_low.T + q_rest[:, None] * k_rest[None, :]) * scale  # (n, n) ≥ scores
        kept += int(((bounds > theta) & causal).sum())
    return {
        "clustered_block_density": touched / visible,
        "bound_keeps": kept / (h * n * (n + 1) / 2),
    }


def _split(x: Tensor, projector: Tensor) -> tuple[Tensor, Tensor]:
    """x (n, d) as its coordinates P x (n, r) in the orthonormal rows of ``projector`` P (r, d) and the norm
    ‖x − PᵀP x‖ (n,) of the rest."""
    low = x @ projector.T  # (n, r)
    return low, (x - low @ projector).norm(dim=-1)


def _blocks(pairs: Tensor, block: int) -> Tensor:
    """(h, nb, nb) bool: the ``block`` × ``block`` blocks of pairs (1, h, n, n) holding any (last padded)."""
    h, n = pairs.shape[1], pairs.shape[2]
    nb = -(-n // block)
    pad = nb * block - n
    return torch.nn.functional.pad(pairs, (0, pad, 0, pad)).view(h, nb, block, nb, block).any(-1).any(2)


def summed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method: times summed over layers, × SDPA of the sums, blocks skipped averaged."""
    out = []
    for method in dict.fromkeys(row["method"] for row in rows):
        mine = [row for row in rows if row["method"] == method]
        total: dict[str, Any] = {"layer": "all", "method": method}
        for key in ("forward_ms", "forward_backward_ms", "indexer_ms", "bounds_ms", "sparse_ms"):
            if key in mine[0]:
                total[key] = sum(row[key] for row in mine)
        for key in (
            "blocks_skipped",
            "support_recall",
            "teacher_density",
            "block_density",
            "clustered_block_density",
            "bound_keeps",
        ):
            if key in mine[0]:
                total[key] = sum(row[key] for row in mine) / len(mine)
        if "max_rel_error" in mine[0]:
            total["max_rel_error"] = max(row["max_rel_error"] for row in mine)
        out.append(total)
    return with_ratios(out)


COLUMNS = [
    ("layer", "layer", "{}"),
    ("method", "method", "{}"),
    ("forward ms", "forward_ms", "{:.1f}"),
    ("× SDPA", "forward_x_sdpa", "{:.2f}"),
    ("fwd+bwd ms", "forward_backward_ms", "{:.1f}"),
    ("× SDPA", "forward_backward_x_sdpa", "{:.2f}"),
    ("teacher density", "teacher_density", "{:.3f}"),
    ("block density", "block_density", "{:.3f}"),
    ("clustered block density", "clustered_block_density", "{:.3f}"),
    ("bound keeps", "bound_keeps", "{:.3f}"),
    ("blocks skipped", "blocks_skipped", "{:.3f}"),
    ("indexer ms", "indexer_ms", "{:.1f}"),
    ("bounds ms", "bounds_ms", "{:.1f}"),
    ("sparse ms", "sparse_ms", "{:.1f}"),
    ("support recall", "support_recall", "{:.3f}"),
    ("max |Δ| / max |o|", "max_rel_error", "{:.1e}"),
]


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``rows`` (columns a row lacks print as —)."""
    lines = ["| " + " | ".join(title for title, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [spec.format(row[key]) if key in row else "—" for _, key, spec in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive integer")
    return value


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.indexed_model", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "model", help="an α-entmax teacher folder (the lm profile's artifacts/models/teacher)"
    )
    parser.add_argument("--data", default="artifacts/data", help="its prepared lm corpus")
    parser.add_argument("--n", type=_positive, default=4096, help="tokens per sequence")
    parser.add_argument("--rank", type=_positive, default=24, help="the indexer's rank")
    parser.add_argument("--margin", type=float, default=0.0, help="the approximate mode's margin δ ≥ 0")
    parser.add_argument("--block", type=_positive, default=32, help="the kernel's block of queries and keys")
    parser.add_argument("--reps", type=_positive, default=3, help="timed passes per figure (median)")
    parser.add_argument("--backward", action="store_true", help="also time forward + backward")
    parser.add_argument("--out", default="artifacts/bench/indexed_model.json")
    args = parser.parse_args(argv)
    if not args.margin >= 0.0:
        parser.error(f"--margin {args.margin}: must be ≥ 0")
    threads = torch.get_num_threads()
    layers, alpha = model_inputs(args.model, args.data, args.n, args.rank)
    torch.set_num_threads(1)
    try:
        rows = []
        for inputs in layers:
            print(f"layer {inputs['layer']} of {len(layers)}", file=sys.stderr)
            rows += layer_rows(
                inputs,
                alpha=alpha,
                margin=args.margin,
                block=args.block,
                reps=args.reps,
                backward=args.backward,
            )
    finally:
        torch.set_num_threads(threads)
    settings = {k: getattr(args, k) for k in ("model", "data", "n", "rank", "margin", "block", "reps")}
    report = {"settings": settings | {"alpha": alpha, "threads": 1}, "layers": rows, "all": summed(rows)}
    write_json(Path(args.out), report)
    print(table(rows + report["all"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
