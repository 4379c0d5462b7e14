"""The ``sparsefinder`` command (also ``python -m pipeline``).

sparsefinder params [--params FILE]        validate every section of a params file
sparsefinder inspect FOLDER [...]          summarise, verify or draw a graph store
sparsefinder configure TEACHER OUT [...]   write a model that attends over a predictor's graph
sparsefinder bench [...]                   bucketed-attention benchmark (kernels.bench)
"""

from __future__ import annotations

import argparse
import sys

from pipeline.cli.configure import add_configure_parser
from pipeline.cli.inspect import add_inspect_parser
from pipeline.errors import exits_cleanly
from pipeline.params import load_all


def _run_params(args: argparse.Namespace) -> int:
    sections = load_all(args.params)
    print(f"{args.params}: valid ({', '.join(sections)})")
    return 0


def _run_bench(args: argparse.Namespace) -> int:
    from kernels.bench import main as bench_main

    return bench_main(args.bench_args) or 0


@exits_cleanly
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparsefinder", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    params = commands.add_parser("params", help="validate a params file")
    params.add_argument("--params", default="params.yaml")
    params.set_defaults(run=_run_params)

    add_inspect_parser(commands)
    add_configure_parser(commands)

    bench = commands.add_parser("bench", help="benchmark bucketed attention (see python -m kernels.bench -h)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=_run_bench)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
