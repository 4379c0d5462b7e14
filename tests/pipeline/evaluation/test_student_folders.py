"""evaluate scores the students the params declare: their folders (one per seed), in the declared order;
leftovers of another profile are ignored, and a declared student (or one of its seeds) that is missing or
outside ``evaluate.students`` is refused in one line that names what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.checkpoint import MANIFEST
from pipeline.checks.evaluate import declared_students
from pipeline.errors import UserError
from pipeline.evaluation.student_models import student_folders
from pipeline.params.student import Student


def student(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text("{}")
    return folder


def test_declared_students_in_their_order_and_leftovers_ignored(tmp_path: Path) -> None:
    root = tmp_path / "students"
    for name in ("samsa", "ssa", "dense"):  # samsa: another profile's leftover
        student(root, name)
    declared = {"ssa": [str(root / "ssa")], "dense": [str(root / "dense")]}
    assert student_folders(str(root), declared) == {"ssa": [root / "ssa"], "dense": [root / "dense"]}
    assert student_folders(None, declared) == {}


def test_a_student_declares_one_folder_per_seed() -> None:
    section = Student.model_validate(
        {
            "seeds": [3, 1],
            "instances": {"ssa": {"attention": "ssa", "out": "s/ssa", "run_dir": "r", "metrics": "m"}},
        }
    )
    assert declared_students(section) == {"ssa": ["s/ssa/seed-3", "s/ssa/seed-1"]}
    assert declared_students(None) == {}


def test_a_missing_student_names_the_stage_that_builds_it(tmp_path: Path) -> None:
    root = tmp_path / "students"
    student(root, "ssa/seed-0")
    ghost = str(root / "ssa/seed-1")
    with pytest.raises(UserError) as error:
        student_folders(str(root), {"ssa": [str(root / "ssa/seed-0"), ghost]})
    assert str(error.value) == (
        f"student.instances.ssa.out: {ghost!r} holds no student model (one folder per seed of "
        "student.seeds); build it: dvc repro student@ssa"
    )


def test_a_student_outside_the_folder_evaluate_depends_on_is_refused(tmp_path: Path) -> None:
    outside = student(tmp_path / "elsewhere", "ssa")
    with pytest.raises(UserError, match=r"lies outside evaluate.students = .*allowed: a folder inside it"):
        student_folders(str(tmp_path / "students"), {"ssa": [str(outside)]})


@pytest.mark.parametrize(
    ("student_section", "said"),
    [
        ({"seeds": [0, 0]}, "seeds [0, 0] lists a seed twice"),
        ({"seeds": []}, "seeds"),
        ({"train": {"seed": 1}}, "train.seed: a student trains once per seed of student.seeds"),
    ],
)
def test_seeds_are_a_list_of_distinct_seeds_and_replace_train_seed(student_section: dict, said: str) -> None:
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("]", r"\]")):
        Student.model_validate(student_section)
