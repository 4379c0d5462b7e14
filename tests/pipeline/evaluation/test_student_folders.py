"""evaluate scores the students the params declare: their folders, in the declared order; leftovers of
another profile are ignored, and a declared student that is missing or outside ``evaluate.students`` is
refused in one line that names what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.checkpoint import MANIFEST
from pipeline.errors import UserError
from pipeline.evaluation.student_models import student_folders


def student(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text("{}")
    return folder


def test_declared_students_in_their_order_and_leftovers_ignored(tmp_path: Path) -> None:
    root = tmp_path / "students"
    for name in ("samsa", "ssa", "dense"):  # samsa: another profile's leftover
        student(root, name)
    declared = {"ssa": str(root / "ssa"), "dense": str(root / "dense")}
    assert student_folders(str(root), declared) == {"ssa": root / "ssa", "dense": root / "dense"}
    assert student_folders(None, declared) == {}


def test_a_missing_student_names_the_stage_that_builds_it(tmp_path: Path) -> None:
    root = tmp_path / "students"
    student(root, "ssa")
    ghost = str(root / "ghost")
    with pytest.raises(UserError) as error:
        student_folders(str(root), {"ssa": str(root / "ssa"), "ghost": ghost})
    assert str(error.value) == (
        f"student.instances.ghost.out = {ghost!r} holds no student model; build it: dvc repro student@ghost"
    )


def test_a_student_outside_the_folder_evaluate_depends_on_is_refused(tmp_path: Path) -> None:
    outside = student(tmp_path / "elsewhere", "ssa")
    with pytest.raises(UserError, match=r"lies outside evaluate.students = .*allowed: a folder inside it"):
        student_folders(str(tmp_path / "students"), {"ssa": str(outside)})
