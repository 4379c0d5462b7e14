"""``sparsefinder inspect``: summarise, verify or draw a graph store.

sparsefinder inspect FOLDER                      print counts and the sparsity table
sparsefinder inspect FOLDER --check              verify every shard's sha256 (exit 1 naming bad shards)
sparsefinder inspect FOLDER --sentence S --layer L --head H --png FILE [--kind K]
                            [--method M --window W --buckets B --threshold T --top-k K
                             --projections FILE --centroids FILE]
"""

from __future__ import annotations

import argparse
import sys

from pipeline.errors import UserError
from pipeline.graphs.store import GraphStore
from pipeline.inspect_graphs import METHODS, draw_head, format_summary, predicted_mask_for, summarize


def add_inspect_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``inspect`` command to ``subparsers``; it runs :func:`run_inspect` (``args.run``)."""
    parser = subparsers.add_parser(
        "inspect",
        help="summarise, verify or draw an attention-graph store",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("folder", help="graph store folder (holding manifest.json)")
    parser.add_argument("--check", action="store_true", help="verify every shard against its sha256")
    picture = parser.add_argument_group("drawing one head")
    picture.add_argument("--sentence", type=int, help="sentence index in the store")
    picture.add_argument("--layer", type=int, help="layer index")
    picture.add_argument("--head", type=int, help="head index")
    picture.add_argument("--kind", default="decoder_self", help="attention kind (default decoder_self)")
    picture.add_argument("--png", help="write the picture to this file")
    picture.add_argument("--method", choices=METHODS, help="shade the cells this predictor selects")
    picture.add_argument("--window", type=int, default=3, help="window size OR-ed in (default 3)")
    picture.add_argument("--buckets", type=int, default=8, help="quantization bins / k-means centroids")
    picture.add_argument("--threshold", type=float, default=1.0, help="distance threshold t")
    picture.add_argument("--top-k", type=int, default=1, help="k-means: centroids per token")
    picture.add_argument("--projections", help="projections file (distance, quantization, kmeans)")
    picture.add_argument("--centroids", help="centroids file (kmeans)")
    parser.set_defaults(run=run_inspect)
    return parser


def run_inspect(args: argparse.Namespace) -> int:
    """Run ``inspect``; returns the exit status (1 when ``--check`` finds a bad shard)."""
    store = GraphStore(args.folder)
    if args.check:
        problems = store.verify()
        for problem in problems:
            print(f"corrupt shard {problem}", file=sys.stderr)
        if problems:
            return 1
        print(f"{args.folder}: {len(store.manifest['shards'])} shard(s) verified, sha256 ok")
        return 0
    drawing = [args.sentence, args.layer, args.head, args.png]
    if all(value is None for value in drawing):
        print(format_summary(summarize(store)))
        return 0
    if any(value is None for value in drawing):
        raise UserError("drawing a head needs all of --sentence, --layer, --head and --png")
    _check_drawing_args(store, args)
    mask = None
    title = f"sentence {args.sentence}, {args.kind}, layer {args.layer}, head {args.head}"
    if args.method is not None:
        mask = predicted_mask_for(
            store,
            args.sentence,
            args.layer,
            args.head,
            args.kind,
            args.method,
            window=args.window,
            buckets=args.buckets,
            threshold=args.threshold,
            top_k=args.top_k,
            projections=args.projections,
            centroids=args.centroids,
        )
        title += f" — {args.method} (window {args.window})"
    draw_head(store, args.sentence, args.layer, args.head, args.kind, mask, args.png, title)
    print(f"wrote {args.png}")
    return 0


def _check_drawing_args(store: GraphStore, args: argparse.Namespace) -> None:
    """One-line errors naming the allowed range for every out-of-range drawing argument."""
    if args.kind not in store.kinds:
        raise UserError(f"--kind {args.kind} is not in this store; stored: {', '.join(store.kinds)}")
    for flag, value, limit in (
        ("--sentence", args.sentence, len(store)),
        ("--layer", args.layer, store.layers),
        ("--head", args.head, store.heads),
    ):
        if not 0 <= value < limit:
            raise UserError(f"{flag} {value} is out of range; allowed 0..{limit - 1}")
    minimums = (("--window", args.window, 0), ("--buckets", args.buckets, 1), ("--top-k", args.top_k, 1))
    for flag, value, least in minimums:
        if value < least:
            raise UserError(f"{flag} {value} is too small; allowed >= {least}")
    if args.method == "kmeans" and args.top_k > args.buckets:
        raise UserError(f"--top-k {args.top_k} exceeds --buckets {args.buckets}; allowed 1..{args.buckets}")
