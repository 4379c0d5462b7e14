"""``sparsefinder configure``: write a model folder that attends over a predictor's graph.

sparsefinder configure TEACHER OUT --method kmeans --knob buckets=8 --window 3
                       --projections artifacts/predictors/projections.safetensors
                       --centroids artifacts/predictors/centroids.safetensors

OUT is the teacher's checkpoint with the predictor in the projections' attention kind; load it with
``pipeline.attention.load_model(OUT, attn_implementation="sparsefinder")`` (after
``import pipeline.attention.sparsefinder``).
"""

from __future__ import annotations

import argparse

from pipeline.cli.predictor_args import add_predictor_arguments, parse_knobs
from pipeline.errors import UserError


def add_configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``configure`` command to ``subparsers``; it runs :func:`run_configure`."""
    parser = subparsers.add_parser(
        "configure",
        help="write a sparsefinder model folder from a teacher and a predictor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("teacher", help="the α-entmax teacher's checkpoint folder")
    parser.add_argument("out", help="the model folder to write")
    add_predictor_arguments(parser, method_help="the predictor (required)")
    parser.add_argument(
        "--kind", default="decoder_self", help="attention kind without projections (else the projections')"
    )
    parser.add_argument(
        "--certified",
        action="store_true",
        help="indexer only: exact α-entmax, the predicted sets deciding which key blocks are skipped",
    )
    parser.set_defaults(run=run_configure)
    return parser


def run_configure(args: argparse.Namespace) -> int:
    """Run ``configure``; prints what was written."""
    # imported here: they load transformers (seconds), which the command's other subcommands never need
    from pipeline.attention.configure import configure_sparsefinder
    from pipeline.attention.sparsefinder import sparsefinder_heads

    if args.method is None:
        raise UserError("configure needs --method (a predictor name)")
    model = configure_sparsefinder(
        args.teacher,
        args.out,
        method=args.method,
        knobs=parse_knobs(args.knob),
        window=args.window,
        global_tokens=args.global_tokens,
        projections=args.projections,
        state=args.state,
        kind=args.kind,
        certified=args.certified,
    )
    head = sparsefinder_heads(model)[0]
    exact = ", certified (exact)" if head.certified else ""
    print(
        f"wrote {args.out}: {head.predictor.describe()}, window {head.window}, global {head.global_tokens}"
        f"{exact} in {model.config.sparsefinder['kind']} attention"
    )
    return 0
