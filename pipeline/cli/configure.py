"""``sparsefinder configure``: write a model folder that attends over a predictor's graph.

sparsefinder configure TEACHER OUT --method kmeans --knob buckets=8 --window 3
                       --projections artifacts/predictors/projections.safetensors
                       --centroids artifacts/predictors/state.safetensors

OUT may lie anywhere but in the command's inputs (the teacher, the projections, the state file) and, where
the working folder has a params.yaml, in an output of one of its stages (configure.out excepted). An existing
OUT is replaced only when it is a folder configure wrote, or with --force.

OUT is the teacher's checkpoint with the predictor in the projections' attention kind; load it with
``pipeline.attention.load_model(OUT)`` (after ``import pipeline.attention.implementations``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.cli.predictor_args import add_predictor_arguments, parse_knobs
from pipeline.errors import UserError
from pipeline.stage import check_command_output


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
    parser.add_argument(
        "--force", action="store_true", help="replace an existing OUT that configure did not write"
    )
    parser.set_defaults(run=run_configure)
    return parser


def written_by_configure(folder: Path) -> bool:
    """Whether ``folder`` is a model folder that configure (this command or the stage) wrote: its manifest
    says so."""
    from pipeline.checkpoint import read_manifest  # loads torch, like the command itself

    try:
        return folder.is_dir() and read_manifest(folder).get("stage") == "configure"
    except UserError:  # a manifest that is not JSON: somebody else's folder
        return False


def run_configure(args: argparse.Namespace) -> int:
    """Run ``configure``; prints what was written."""
    # imported here: they load transformers (seconds), which the command's other subcommands never need
    from pipeline.attention.configure import configure_sparsefinder, configured_predictor
    from pipeline.attention.sparsefinder import sparsefinder_heads

    if args.method is None:
        raise UserError("configure needs --method (a predictor name)")
    knobs = parse_knobs(args.knob)
    # the predictor first: it needs no file, so a misspelt knob is reported before any path
    configured_predictor(args.method, knobs, projections=args.projections, state=args.state)
    check_command_output(
        "OUT",
        args.out,
        inputs={
            "teacher folder": args.teacher,
            "projections file": args.projections,
            "state file": args.state,
        },
        own=written_by_configure,
        written_by="sparsefinder configure",
        force=args.force,
        stage_out="configure.out",
    )
    model = configure_sparsefinder(
        args.teacher,
        args.out,
        method=args.method,
        knobs=knobs,
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
