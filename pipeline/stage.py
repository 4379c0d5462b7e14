"""What every DVC stage script shares: its command line, its params section, and a check of its outputs.

The check (:func:`check_outputs`) runs before any work and refuses, in one line naming the key, an output
that would destroy something: one of the stage's own inputs, another output of the stage, another stage's
output, the project's own sources, or anything outside the project folder. The command-line tools that
write (``sparsefinder configure``, ``inspect --png``) run the same comparisons on their paths
(:func:`check_command_output`).
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple, TypeVar

from pydantic import BaseModel

from pipeline.allocator import keep_freed_memory
from pipeline.atomic import check_target
from pipeline.errors import UserError
from pipeline.params.base import Section, load_section

S = TypeVar("S", bound=Section)

# params keys that name what a stage writes (files or folders), at any depth of its section
OUTPUT_KEYS = ("out", "metrics", "plot", "plots", "run_dir", "mixing", "hypotheses", "results")
# params keys that name what a stage reads (checkpoints, corpora, stores, state files, a dataset folder or
# hub id, the SWORD library), at any depth of its section; hub ids are compared as paths too, harmlessly
INPUT_KEYS = (
    "teacher",
    "data",
    "graphs",
    "projections",
    "state",
    "init",
    "students",
    "evaluation",
    "timings",
    "evidence",
    "path",
    "name",
    "source_file",
    "target_file",
)
# keys whose role depends on the section: evaluate writes the timings and evidence files that report reads
SECTION_OUTPUT_KEYS = {"evaluate": ("timings", "evidence")}
# what a stage never writes: the project's own sources, relative to the project folder (folders end in /;
# the params file the stage reads, wherever it lies, is added by the check)
PROJECT_SOURCES = (
    "params.yaml",
    "dvc.yaml",
    "dvc.lock",
    "README.md",
    "Makefile",
    "pyproject.toml",
    "pipeline/",
    "stages/",
    "attention_kernels/",
    "tests/",
    "configs/",
    ".git/",
    ".dvc/",
)
# how an output must stand to the paths it may not overlap
APART = "not the same path, nor inside or around it"


def stage_params(name: str, schema: type[S], argv: list[str] | None = None) -> S:
    """Parse ``--params FILE`` (default params.yaml) and return section ``name`` validated by its
    ``schema``, after checking that every output it names can be written (:func:`check_outputs`)."""
    section, _ = _parse(name, schema, argv, instances=None)
    return section


def stage_instance(
    name: str, schema: type[S], instances: str, argv: list[str] | None = None
) -> tuple[S, str]:
    """For a DVC ``foreach`` stage (``NAME@INSTANCE``, run as ``python -m stages.NAME INSTANCE``): section
    ``name`` validated by its ``schema``, and the instance, which must be a key of the section's
    ``instances`` map."""
    return _parse(name, schema, argv, instances=instances)


def other_section(name: str, schema: type[S], argv: list[str] | None = None) -> S:
    """Section ``name`` of the stage's params file (``--params``, default params.yaml), validated by its
    ``schema``: another stage's declarations a stage follows (evaluate scores the students that
    ``student.instances`` declares), listed among the stage's params in dvc.yaml."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--params", default="params.yaml")
    args, _ = parser.parse_known_args(argv)
    return load_section(name, args.params, schema=schema)


def _parse(name: str, schema: type[S], argv: list[str] | None, instances: str | None) -> tuple[S, str | None]:
    parser = argparse.ArgumentParser(prog=f"python -m stages.{name}", description=f"DVC stage '{name}'.")
    if instances is not None:
        parser.add_argument("instance", help=f"which entry of {name}.{instances} to run")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    keep_freed_memory()  # a stage's tensors are reused, not page-faulted anew at every step
    section = load_section(name, args.params, schema=schema)
    instance = getattr(args, "instance", None)
    if instances is not None and instance not in getattr(section, instances):
        allowed = ", ".join(getattr(section, instances))
        raise UserError(f"{args.params}: {name}.{instances} has no entry {instance!r}; allowed: {allowed}")
    check_outputs(name, section, args.params)
    return section, instance


def _paths(key: str, section: BaseModel, keys: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """(dotted params key, path) of every string value under one of ``keys`` in ``section``, at any
    depth."""
    for field, value in section:
        dotted = f"{key}.{field}"
        if field in keys and isinstance(value, str):
            yield dotted, value
        elif isinstance(value, BaseModel):
            yield from _paths(dotted, value, keys)
        elif isinstance(value, dict):
            for name, item in value.items():
                if isinstance(item, BaseModel):
                    yield from _paths(f"{dotted}.{name}", item, keys)


class Stage(NamedTuple):
    """One DVC stage of a params section: its name, and the (key, path) pairs it writes and reads."""

    name: str
    outputs: list[tuple[str, str]]
    inputs: list[tuple[str, str]]


def section_stages(name: str, section: BaseModel) -> list[Stage]:
    """The stages section ``name`` configures: one, or one per entry of its ``instances`` map (a
    ``foreach`` stage such as ``student@NAME``, which reads the shared keys and its own entry's)."""
    outputs = OUTPUT_KEYS + SECTION_OUTPUT_KEYS.get(name, ())
    inputs = tuple(key for key in INPUT_KEYS if key not in outputs)
    instances = getattr(section, "instances", None)
    if not isinstance(instances, dict):
        return [Stage(name, list(_paths(name, section, outputs)), list(_paths(name, section, inputs)))]
    shared = [(key, path) for key, path in _paths(name, section, inputs) if ".instances." not in key]
    stages = []
    for instance, spec in instances.items():
        key = f"{name}.instances.{instance}"
        stages.append(
            Stage(
                f"{name}@{instance}",
                list(_paths(key, spec, outputs)),
                shared + list(_paths(key, spec, inputs)),
            )
        )
    return stages


# The module of every section's schema, imported by name (below) rather than by an import statement, so that
# a stage's code, as tests/test_dvc_deps.py walks it and dvc.yaml lists it, holds its own section's schema
# and no other: an edit to one stage's schema re-runs that stage alone. The other schemas serve only to
# refuse an output that collides with another stage's, never to change what a stage writes, and a collision
# is seen from both sides: an edit that makes section X's outputs collide with this stage's is refused by
# X's own stage, which that edit re-runs. (Likewise a stage's params deps are its own section alone, though
# this check reads the others.)
WHOLE_FILE = "pipeline.params.sections"


def declared_outputs(params: str | os.PathLike, skip: str | None = None) -> list[tuple[str, str, str]]:
    """(stage, key, path) of every output the sections of ``params`` declare, but section ``skip``'s.

    Lenient: a missing or unreadable file declares nothing, and a section that fails validation is left
    out (its own stage reports it when it runs).
    """
    sections = importlib.import_module(WHOLE_FILE).valid_sections(params, skip=skip)
    return [
        (stage.name, key, path)
        for name, section in sections
        for stage in section_stages(name, section)
        for key, path in stage.outputs
    ]


def check_outputs(name: str, section: BaseModel, params: str | os.PathLike = "params.yaml") -> None:
    """One-line :class:`UserError`, before any work and writing nothing, when an output of section
    ``name`` (read from the file ``params``) would destroy something or cannot be written.

    Each output must lie inside the project folder (the working folder) and hold none of its sources
    (:data:`PROJECT_SOURCES`, the params file); it may not be, contain or lie inside one of its stage's
    inputs, another output of its stage, or an output another stage declares (the other sections of
    ``params``, the other instances of a ``foreach`` section); it may not be a device, FIFO or socket; and
    the folder it goes in must be creatable. Paths are compared resolved: ``a/../b`` and links are seen
    through (the output's own last component is not: a link there is replaced, never written through).
    """
    project = _resolved(Path.cwd())
    sources = [(project / source, source) for source in PROJECT_SOURCES]
    sources.append((_resolved(params), str(params)))
    stages = section_stages(name, section)
    others = [(stage.name, key, path) for stage in stages for key, path in stage.outputs]
    others += declared_outputs(params, skip=name)
    for stage in stages:
        for key, value in stage.outputs:
            said = f"{key} = {value!r}"
            where = _written_at(value)
            if project not in where.parents:
                # named inside the project but led out by a link on its way: say so, or it reads as a riddle
                linked = project in Path(os.path.normpath(Path(value).absolute())).parents
                through = f" (a link on its way leads to {where.parent})" if linked else ""
                raise UserError(
                    f"{said} lies outside the project folder {project}{through}; allowed: a path inside "
                    "it (a stage writes only below the folder it runs in)"
                )
            for source, label in sources:
                relation = _relation(where, source)
                if relation is not None:
                    raise UserError(
                        f"{said} {relation} the project's own {label}; allowed: a path apart from the "
                        "project's sources (under artifacts/, say)"
                    )
            for input_key, input_value in stage.inputs:
                relation = _relation_to_input(where, input_value)
                if relation is not None:
                    raise UserError(
                        f"{said} {relation} {input_key} = {input_value!r}, which the stage reads; allowed: "
                        f"an output apart from every input ({APART})"
                    )
            _check_apart_from_outputs(stage.name, key, value, where, others)
            check_target(where, said)
            _check_creatable(said, where)


def _check_apart_from_outputs(
    stage: str, key: str, value: str, where: Path, others: list[tuple[str, str, str]]
) -> None:
    """One-line error when the output ``key`` of ``stage`` overlaps another (stage, key, path) output."""
    for other_stage, other_key, other_value in others:
        relation = _relation(where, _written_at(other_value)) if other_key != key else None
        if relation is not None:
            whose = (
                "another output of the stage"
                if other_stage == stage
                else f"the output of stage {other_stage}"
            )
            raise UserError(
                f"{key} = {value!r} {relation} {other_key} = {other_value!r}, {whose}; allowed: a path no "
                f"other output shares ({APART})"
            )


def check_command_output(
    label: str,
    path: str | os.PathLike,
    *,
    inputs: dict[str, str | os.PathLike | None],
    own: Callable[[Path], bool],
    written_by: str,
    force: bool = False,
    stage_out: str | None = None,
    params: str | os.PathLike = "params.yaml",
) -> None:
    """One-line :class:`UserError` before a command writes ``path`` (shown as ``label``) anywhere the user
    chose, when it would destroy something.

    Refused: a device, FIFO or socket; a path that is, contains or lies inside one of the command's
    ``inputs`` (description → path); one that collides with an output a stage of ``params`` declares (when
    that file is there and readable), except ``stage_out``, the key of the stage output the command itself
    makes; and, without ``force``, an existing file or folder that ``own`` does not recognise as the
    command's earlier output (``written_by`` names the command).
    """
    where = _written_at(path)
    check_target(where, f"{label} {path}")
    for what, value in inputs.items():
        if value is None:
            continue
        relation = _relation_to_input(where, value)
        if relation is not None:
            raise UserError(
                f"{label} {path} {relation} the {what} {value}, which the command reads; allowed: a path "
                f"apart from every input ({APART})"
            )
    for stage, key, value in declared_outputs(params):
        relation = _relation(where, _written_at(value))
        if relation is not None and not (key == stage_out and relation == "is the same path as"):
            raise UserError(
                f"{label} {path} {relation} {key} = {value!r}, the output of stage {stage} in {params}; "
                "allowed: a path no stage writes"
            )
    if os.path.lexists(where) and not force and not own(where):
        raise UserError(
            f"{label} {path} exists and is not what {written_by} writes; pass --force to replace it, or "
            "choose another path"
        )


def _resolved(path: str | os.PathLike) -> Path:
    """``path`` absolute with every link and ``..`` resolved (lexically where a link loops)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def _written_at(path: str | os.PathLike) -> Path:
    """Where writing ``path`` lands: its folder resolved, its own name kept (a link there is replaced as a
    link, not written through)."""
    absolute = Path(path).absolute()
    if absolute.name in ("", ".."):  # the root, or a folder named through ``..``
        return _resolved(absolute)
    return _resolved(absolute.parent) / absolute.name


def _relation(a: Path, b: Path) -> str | None:
    """How path ``a`` overlaps path ``b`` (both absolute and resolved), or None when it does not."""
    if a == b:
        return "is the same path as"
    if b in a.parents:
        return "lies inside"
    if a in b.parents:
        return "contains"
    return None


def _relation_to_input(where: Path, value: str | os.PathLike) -> str | None:
    """How the output location ``where`` overlaps an input: at the input's own path (a link there
    included), or where the input's links lead."""
    return _relation(where, _written_at(value)) or _relation(where, _resolved(value))


def _check_creatable(said: str, where: Path) -> None:
    """One-line error when the output's folder cannot be made: an existing ancestor of the path is a
    file, or the first existing one is not writable."""
    for parent in where.parents:
        if not parent.exists():
            continue
        if not parent.is_dir():
            raise UserError(f"{said}: {parent} is a file; allowed: a path below folders only")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"{said}: {parent} is not writable")
        break
