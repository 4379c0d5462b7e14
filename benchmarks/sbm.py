"""Throughput of the SBM graph samplers on the CPU: the dense Bernoulli sampler against fastRG.

    python -m benchmarks.sbm [--out PATH.json] [--repeats R]

One head (d = 64, k = 8 clusters) at n = m = 1024, 4096 and 16384, with memberships σ(2 x·c − 2.5) of
Gaussian x and c (a few percent of the pairs get an edge). The dense sampler's time includes the n × n rates
p = Q̂ Ŝ K̂ᵀ it needs; fastRG starts from the memberships. Reported per sampler and n: seconds per draw (the
median of R draws), edges per draw and edges drawn per second. The dense sampler is skipped where its
n × n tensors would pass ``DENSE_BYTES``. Prints a table; ``--out`` also writes the rows as JSON.
"""

from __future__ import annotations

import argparse

import torch
from torch import Tensor

from pipeline.allocator import keep_freed_memory
from pipeline.atomic import write_json
from pipeline.attention.sbm_sampling import bernoulli_graph, fastrg_edges
from pipeline.timer import median_seconds

SIZES = (1024, 4096, 16384)
HEAD_DIM, CLUSTERS = 64, 8
DENSE_BYTES = 4 << 30  # the dense sampler holds about 40 bytes per pair at its peak
BYTES_PER_PAIR = 40


def block_model(n: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Memberships of n queries and n keys (1, n, k) and the block matrix (1, k, k) of one random head."""
    clusters = torch.randn(CLUSTERS, HEAD_DIM, generator=generator) / HEAD_DIM**0.5
    blocks = torch.softmax((clusters @ clusters.T).flatten(), 0).view(1, CLUSTERS, CLUSTERS)

    def members() -> Tensor:
        x = torch.randn(n, HEAD_DIM, generator=generator)
        return torch.sigmoid(2 * x @ clusters.T - 2.5)[None]

    return members(), members(), blocks


def time_draws(draw, repeats: int) -> tuple[float, int]:
    """(median seconds per draw, edges of the last draw) of ``draw()`` returning its edge count."""
    edges = 0

    def run() -> None:
        nonlocal edges
        edges = draw()

    return median_seconds(run, repeats=repeats), edges


def bench(n: int, repeats: int) -> list[dict]:
    """The rows of one sequence length: one per sampler (the dense one marked skipped when too large)."""
    q_members, k_members, blocks = block_model(n, torch.Generator().manual_seed(n))
    positions, graphs = torch.arange(n), torch.zeros(1, dtype=torch.long)
    draws = iter(range(1 << 30))

    def fastrg() -> int:
        limits = torch.full((n,), n)
        return len(fastrg_edges(q_members, blocks, k_members, limits, next(draws), graphs, positions)[0])

    def dense() -> int:
        rates = q_members @ blocks @ k_members.transpose(1, 2)  # (1, n, n)
        return int(
            bernoulli_graph(rates, next(draws), graphs[:, None, None], positions[:, None], positions).sum()
        )

    rows = []
    for name, draw in (("dense", dense), ("fastrg", fastrg)):
        row = {"sampler": name, "n": n}
        if name == "dense" and n * n * BYTES_PER_PAIR > DENSE_BYTES:
            row["skipped"] = f"n × n needs about {n * n * BYTES_PER_PAIR / 2**30:.0f} GiB"
        else:
            seconds, edges = time_draws(draw, repeats)
            row |= {"seconds_per_draw": seconds, "edges": edges, "edges_per_second": edges / seconds}
            row["density"] = edges / (n * n)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'sampler':8} {'n':>6} {'s/draw':>9} {'edges':>10} {'density':>8} {'edges/s':>10}"]
    for row in rows:
        if "skipped" in row:
            lines.append(f"{row['sampler']:8} {row['n']:>6} skipped: {row['skipped']}")
        else:
            lines.append(
                f"{row['sampler']:8} {row['n']:>6} {row['seconds_per_draw']:>9.4f} {row['edges']:>10} "
                f"{row['density']:>8.4f} {row['edges_per_second']:>10.3g}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON to this path")
    parser.add_argument("--repeats", type=int, default=3, help="draws per sampler and length (median)")
    args = parser.parse_args(argv)
    keep_freed_memory()
    rows = [row for n in SIZES for row in bench(n, args.repeats)]
    print(f"CPU, {torch.get_num_threads()} threads; one head, d = {HEAD_DIM}, k = {CLUSTERS}")
    print(table(rows))
    if args.out:
        write_json(args.out, {"threads": torch.get_num_threads(), "rows": rows})


if __name__ == "__main__":
    main()
