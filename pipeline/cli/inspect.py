"""``sparsefinder inspect``: summarise, verify or draw a graph store.

sparsefinder inspect FOLDER                      print counts and the sparsity table
sparsefinder inspect FOLDER --check              verify every shard (exit 2 naming every bad one)
sparsefinder inspect FOLDER --sentence S --layer L --head H --png FILE [--kind K]
                            [--method NAME [--knob KEY=VALUE ...] --window W --global G
                             --projections FILE --state FILE]

--png may lie anywhere but in the command's inputs (the store, the projections, the state file) and, where
the working folder has a params.yaml, in an output of one of its stages. An existing file is replaced only
when it is a picture inspect drew, or with --force.

With --method, the cells the predictor selects (its graph ∪ the window ∪ the global tokens, within the valid
pairs: exactly what evaluation scores) are shaded under the gold edges. Predictors: see
``pipeline.predictors`` (e.g. ``--method kmeans --knob buckets=8 --state state.safetensors``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image

from attention_kernels.attended import window_radius
from pipeline.cli.predictor_args import add_predictor_arguments, parse_knobs
from pipeline.errors import UserError
from pipeline.graphs.draw import draw_head
from pipeline.graphs.store import GraphStore
from pipeline.graphs.summary import format_summary, summarize
from pipeline.predictors import make_predictor
from pipeline.predictors.scoring import Setting, sentence_graph
from pipeline.predictors.state import select_state
from pipeline.projection.model import HeadProjections, load_projections
from pipeline.stage import check_command_output

# what inspect writes in its PNGs' Software text chunk, so that it knows its own pictures again
SOFTWARE = "sparsefinder inspect"


def add_inspect_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``inspect`` command to ``subparsers``; it runs :func:`run_inspect` (``args.run``)."""
    parser = subparsers.add_parser(
        "inspect",
        help="summarise, verify or draw an attention-graph store",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("folder", help="graph store folder (holding manifest.json)")
    parser.add_argument(
        "--check", action="store_true", help="verify every shard (size, sha256, header) and the counts"
    )
    picture = parser.add_argument_group("drawing one head")
    picture.add_argument("--sentence", type=int, help="sentence index in the store")
    picture.add_argument("--layer", type=int, help="layer index")
    picture.add_argument("--head", type=int, help="head index")
    picture.add_argument("--kind", default="decoder_self", help="attention kind (default decoder_self)")
    picture.add_argument("--png", help="write the picture to this file")
    picture.add_argument(
        "--force", action="store_true", help="replace an existing --png file that inspect did not draw"
    )
    add_predictor_arguments(picture, method_help="shade the cells a predictor selects")
    parser.set_defaults(run=run_inspect)
    return parser


def run_inspect(args: argparse.Namespace) -> int:
    """Run ``inspect``; returns 0, or raises a one-line :class:`UserError` (exit 2) for a bad flag or store.

    A store whose manifest is bad refuses to open; ``--check`` names every bad shard on that one line.
    """
    _check_numbers(args)
    store = GraphStore(args.folder)
    if args.check:
        problems = store.verify()
        if problems:
            raise UserError(f"corrupt graph store {args.folder}: {'; '.join(problems)}")
        print(f"{args.folder}: {len(store.manifest['shards'])} shard(s) verified, sha256 ok")
        return 0
    drawing = [args.sentence, args.layer, args.head, args.png]
    if all(value is None for value in drawing):
        print(format_summary(summarize(store)))
        return 0
    if any(value is None for value in drawing):
        raise UserError("drawing a head needs all of --sentence, --layer, --head and --png")
    check_command_output(
        "--png",
        args.png,
        inputs={"graph store": args.folder, "projections file": args.projections, "state file": args.state},
        own=drawn_by_inspect,
        written_by="sparsefinder inspect",
        force=args.force,
    )
    _check_drawing_args(store, args)
    mask = None
    title = f"sentence {args.sentence}, {args.kind}, layer {args.layer}, head {args.head}"
    if args.method is not None:
        setting = _setting(args)
        projections = _projections(store, args) if setting.predictor.needs_projections else None
        graph = sentence_graph(store, args.kind, args.layer, args.sentence, setting, projections=projections)
        mask = graph[min(args.head, graph.shape[0] - 1)].numpy()
        title += f" — {setting.predictor.describe()}, window {args.window}, global {args.global_tokens}"
    draw_head(
        store, args.sentence, args.layer, args.head, args.kind, mask, args.png, title, software=SOFTWARE
    )
    print(f"wrote {args.png}")
    return 0


def drawn_by_inspect(path: Path) -> bool:
    """Whether ``path`` is a PNG that inspect drew: its Software text chunk names inspect."""
    try:
        with Image.open(path) as image:
            return image.format == "PNG" and image.info.get("Software") == SOFTWARE
    except (OSError, ValueError, Image.DecompressionBombError):  # not a picture PIL reads, or no file
        return False


def _setting(args: argparse.Namespace) -> Setting:
    """The predictor named by --method with its --knob values, its state loaded when it is fitted."""
    knobs = parse_knobs(args.knob)
    predictor = make_predictor(args.method, **knobs)
    if predictor.fitted:
        if args.state is None:
            raise UserError(f"method {args.method} is fitted: give its state file (--state FILE)")
        predictor = select_state(args.state, predictor, explicit=set(knobs))
    return Setting(predictor, args.window, args.global_tokens)


def _projections(store: GraphStore, args: argparse.Namespace) -> HeadProjections:
    """The projections of ``--layer`` from ``--projections``, checked against the store's heads."""
    path = args.projections
    if path is None:
        raise UserError(f"method {args.method} needs a projections file (--projections FILE)")
    if not Path(path).is_file():
        raise UserError(f"projections file {path} not found")
    layers, _ = load_projections(path)
    if args.layer not in layers:
        raise UserError(f"{path} has no projections for layer {args.layer}; it has layers {sorted(layers)}")
    module = layers[args.layer]
    if (module.n_heads, module.head_dim) != (store.heads, store.head_dim):
        raise UserError(
            f"{path} layer {args.layer} projects {module.n_heads} heads of dim {module.head_dim}; "
            f"the store has {store.heads} heads of dim {store.head_dim}"
        )
    return module


def _check_numbers(args: argparse.Namespace) -> None:
    """One-line errors for numeric flags outside what any store allows, whether or not they are used."""
    for flag, value in (("--sentence", args.sentence), ("--layer", args.layer), ("--head", args.head)):
        if value is not None and value < 0:
            raise UserError(f"{flag} {value} is out of range; allowed >= 0")
    try:
        window_radius(args.window)
    except ValueError as err:
        raise UserError(f"--{err}") from None
    if args.global_tokens < 0:
        raise UserError(f"--global {args.global_tokens} is negative; allowed >= 0")


def _check_drawing_args(store: GraphStore, args: argparse.Namespace) -> None:
    """One-line errors naming the allowed range for a drawing argument this store does not have."""
    if args.kind not in store.kinds:
        raise UserError(f"--kind {args.kind} is not in this store; stored: {', '.join(store.kinds)}")
    for flag, value, limit in (
        ("--sentence", args.sentence, len(store)),
        ("--layer", args.layer, store.layers),
        ("--head", args.head, store.heads),
    ):
        if value >= limit:
            raise UserError(f"{flag} {value} is out of range; allowed 0..{limit - 1}")
