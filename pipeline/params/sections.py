"""The whole params file: every section's schema by name, and every section validated at once.

Only what reads the whole file imports this module: ``sparsefinder params`` (:func:`load_all`), tests, and
the stages' check that no output collides with another stage's (:func:`pipeline.stage.declared_outputs`,
which imports it by name; see there why). A stage reads its own section with its own schema
(:func:`pipeline.params.base.load_section`), so that its code depends on that schema alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from pipeline.params import base
from pipeline.params.base import Section, missing_section, read_yaml
from pipeline.params.cluster import Cluster
from pipeline.params.configure import Configure
from pipeline.params.evaluate import Evaluate
from pipeline.params.extract import Extract
from pipeline.params.par_search import ParSearch
from pipeline.params.prepare import Prepare
from pipeline.params.pretrain import Pretrain
from pipeline.params.project import Project
from pipeline.params.report import Report
from pipeline.params.student import Student
from pipeline.params.teacher import Teacher

# in the order of base.SECTION_NAMES
SECTIONS: dict[str, type[Section]] = {
    "prepare": Prepare,
    "pretrain": Pretrain,
    "teacher": Teacher,
    "extract": Extract,
    "project": Project,
    "cluster": Cluster,
    "evaluate": Evaluate,
    "configure": Configure,
    "par_search": ParSearch,
    "student": Student,
    "report": Report,
}


def validate_section(name: str, raw: Any, path: Path = Path("params.yaml")) -> Section:
    """Validate the mapping ``raw`` as section ``name`` (``None``: all defaults); raise :class:`UserError`
    (one line) if bad."""
    # a name that is no section is refused before its schema would be used
    return base.validate_section(name, raw, path, schema=SECTIONS.get(name, Section))


def load_section(name: str, path: str | os.PathLike = "params.yaml") -> Any:
    """Read ``path`` and return its validated section ``name``, which must be present (defaults fill absent
    keys)."""
    return base.load_section(name, path, schema=SECTIONS.get(name, Section))


def load_all(path: str | os.PathLike = "params.yaml") -> dict[str, Section]:
    """Validate every section of ``path``: an unknown or a missing section is an error, reported before any
    value."""
    path = Path(path)
    data = read_yaml(path)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise UserError(f"{path}: unknown section {unknown[0]!r} (allowed: {', '.join(SECTIONS)})")
    missing = [name for name in SECTIONS if name not in data]
    if missing:
        raise missing_section(path, missing[0])
    return {name: validate_section(name, data[name], path) for name in SECTIONS}


def valid_sections(path: str | os.PathLike, skip: str | None = None) -> Iterator[tuple[str, Section]]:
    """(name, section) of every section of ``path`` but ``skip`` that validates, in order.

    Lenient: a missing or unreadable file gives none, and a section that fails validation is left out (its
    own stage reports it when it runs).
    """
    for name in SECTIONS:
        if name == skip:
            continue
        try:
            section = load_section(name, path)
        except UserError:
            continue
        yield name, section
