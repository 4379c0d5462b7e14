"""What every DVC stage script shares: its command line, its params section, and a check of its outputs."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.allocator import keep_freed_memory
from pipeline.errors import UserError
from pipeline.params import load_section

# params keys that name what a stage writes (files or folders), at any depth of its section
OUTPUT_KEYS = ("out", "metrics", "plot", "plots", "run_dir", "mixing")


def stage_params(name: str, argv: list[str] | None = None) -> Any:
    """Parse ``--params FILE`` (default params.yaml) and return the validated section ``name``, after
    checking that every output it names can be written (:func:`check_outputs`)."""
    section, _ = _parse(name, argv, instances=None)
    return section


def stage_instance(name: str, instances: str, argv: list[str] | None = None) -> tuple[Any, str]:
    """For a DVC ``foreach`` stage (``NAME@INSTANCE``, run as ``python -m stages.NAME INSTANCE``): the
    validated section ``name`` and the instance, which must be a key of the section's ``instances`` map."""
    return _parse(name, argv, instances=instances)


def _parse(name: str, argv: list[str] | None, instances: str | None) -> tuple[Any, str | None]:
    parser = argparse.ArgumentParser(prog=f"python -m stages.{name}", description=f"DVC stage '{name}'.")
    if instances is not None:
        parser.add_argument("instance", help=f"which entry of {name}.{instances} to run")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    keep_freed_memory()  # a stage's tensors are reused, not page-faulted anew at every step
    section = load_section(name, args.params)
    instance = getattr(args, "instance", None)
    if instances is not None and instance not in getattr(section, instances):
        allowed = ", ".join(getattr(section, instances))
        raise UserError(f"{args.params}: {name}.{instances} has no entry {instance!r}; allowed: {allowed}")
    check_outputs(name, section)
    return section, instance


def output_paths(key: str, section: BaseModel) -> Iterator[tuple[str, str]]:
    """(dotted params key, path) of every output ``section`` names, nested sections and maps included."""
    for field, value in section:
        dotted = f"{key}.{field}"
        if field in OUTPUT_KEYS and isinstance(value, str):
            yield dotted, value
        elif isinstance(value, BaseModel):
            yield from output_paths(dotted, value)
        elif isinstance(value, dict):
            for name, item in value.items():
                if isinstance(item, BaseModel):
                    yield from output_paths(f"{dotted}.{name}", item)


def check_outputs(name: str, section: BaseModel) -> None:
    """One-line error, before any work, when an output's folder cannot be made: an existing ancestor of
    the path is a file, or the first existing one is not writable."""
    for key, value in output_paths(name, section):
        for parent in Path(value).absolute().parents:
            if not parent.exists():
                continue
            if not parent.is_dir():
                raise UserError(f"{key} = {value!r}: {parent} is a file; allowed: a path below folders only")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise UserError(f"{key} = {value!r}: {parent} is not writable")
            break
