"""``sparsefinder score``: a saved model's MQAR accuracy on freshly generated examples.

sparsefinder score MODEL [--examples N] [--seed S] [--batch-size B] [--json FILE]

MODEL is a folder with an ``mqar.json`` (the mqar profile's pretrain, teacher, students and configured
models carry one); it is loaded with the attention it was saved with (α-entmax, a predictor, ...). The N
examples come from that task with seed S, which must not be one of the card's split seeds. Prints accuracy
overall, near and far (key at most or more than the examples' median distance back), each with its 95 %
bootstrap interval over examples; --json writes the same as JSON.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_score_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``score`` command to ``subparsers``; it runs :func:`run_score`."""
    parser = subparsers.add_parser(
        "score",
        help="score a saved mqar model on fresh examples",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="the model folder (with mqar.json)")
    parser.add_argument("--examples", type=int, default=1024, help="examples to generate (default 1024)")
    parser.add_argument("--seed", type=int, default=1, help="their seed (default 1)")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per forward (default 16)")
    parser.add_argument("--json", help="also write the scores to this JSON file")
    parser.set_defaults(run=run_score)
    return parser


def run_score(args: argparse.Namespace) -> int:
    """Generate, load, score, print (and write --json atomically)."""
    # imported here: they load torch and the attention implementations, which the other commands never need
    import pipeline.attention.implementations  # noqa: F401  (the attention a saved folder names)
    from pipeline.atomic import write_json
    from pipeline.attention.loading import load_model
    from pipeline.checkpoint import loading
    from pipeline.errors import UserError
    from pipeline.evaluation.mqar_score import MEASURES, fresh_examples, score_examples

    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: allowed: at least 1")
    examples = fresh_examples(args.model, args.examples, args.seed)
    with loading(args.model, "model"):
        model = load_model(args.model)
    scores = score_examples(model, examples, batch_size=args.batch_size)
    names = {"accuracy": "accuracy", "accuracy_near": "near", "accuracy_far": "far"}
    print(f"{args.model}: {scores['examples']} examples (seed {args.seed}), {scores['answers']} answers")
    for name in MEASURES:
        value, (low, high) = scores[name]["value"], scores[name]["ci95"]
        print(f"  {names[name]:>8} {value:.4f} [{low:.4f}, {high:.4f}]")
    print(f"  near: key at most {scores['far_gap']} positions back; far: farther")
    if args.json:
        write_json(Path(args.json), {"model": args.model, "seed": args.seed, **scores})
    return 0
