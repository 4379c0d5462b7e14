"""The ``sparsefinder`` command (also ``python -m pipeline``).

sparsefinder params [--params FILE]        validate a params file as every stage will, before any work
sparsefinder inspect FOLDER [...]          summarise, verify or draw a graph store
sparsefinder configure TEACHER OUT [...]   write a model that attends over a predictor's graph
sparsefinder score MODEL [...]             a saved mqar model's accuracy on fresh examples
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType

from pipeline.cli.configure import add_configure_parser
from pipeline.cli.inspect import add_inspect_parser
from pipeline.cli.score import add_score_parser
from pipeline.errors import exits_cleanly
from pipeline.params.sections import load_all


def _input_checks() -> dict[str, ModuleType]:
    """The stages' checks of params against their inputs (:mod:`pipeline.checks`), by section.

    Imported here: they load torch and the graph store, which the other subcommands never need.
    """
    from pipeline.checks import (
        cluster,
        configure,
        evaluate,
        extract,
        par_search,
        pretrain,
        project,
        student,
        teacher,
    )

    return {
        "pretrain": pretrain,
        "teacher": teacher,
        "extract": extract,
        "project": project,
        "cluster": cluster,
        "configure": configure,
        "par_search": par_search,
        "student": student,
        "evaluate": evaluate,
    }


def _run_params(args: argparse.Namespace) -> int:
    """Validate every section, then run each stage's own checks before work: its outputs can be written,
    and its params agree with its inputs where those exist (a line says which checks wait for inputs).
    Each check runs as soon as its own inputs exist, so one missing input holds back only the checks
    that read it."""
    from pipeline.stage import check_outputs

    sections = load_all(args.params)
    checks = _input_checks()
    waiting = []
    for name, section in sections.items():
        check_outputs(name, section, args.params)
        module = checks.get(name)
        if module is None:
            continue
        if hasattr(module, "check_params"):
            module.check_params(section)
        if name == "evaluate":  # it scores the students the student section declares
            declared = module.declared_students(sections.get("student") if section.students else None)
            checks_of_stage = module.input_checks(section, declared)
        else:
            checks_of_stage = module.input_checks(section)
        for check in checks_of_stage:
            missing = [key for key, path in check.inputs.items() if not Path(path).exists()]
            if not missing:
                check.run()
            elif missing[0] not in waiting:
                waiting.append(missing[0])
    print(f"{args.params}: valid ({', '.join(sections)})")
    if waiting:
        print(f"not checked against their inputs, which do not exist yet: {', '.join(waiting)}")
    return 0


@exits_cleanly
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparsefinder", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    params = commands.add_parser("params", help="validate a params file")
    params.add_argument("--params", default="params.yaml")
    params.set_defaults(run=_run_params)

    add_inspect_parser(commands)
    add_configure_parser(commands)
    add_score_parser(commands)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
