"""Params validation: every kind of bad value exits 2 with one line naming key, value and what is allowed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.errors import UserError
from pipeline.params.base import SECTION_NAMES
from pipeline.params.sections import SECTIONS, load_all, load_section
from tests.stage_runner import run_module
from tests.test_dvc_deps import stage_files

ROOT = Path(__file__).resolve().parents[2]
PROFILES = [ROOT / "params.yaml", *sorted((ROOT / "configs").glob("*.yaml"))]


# the schema modules every stage may import: the package, the base every schema builds on, and the training
# settings the models and the trainer read
SHARED_SCHEMAS = {"pipeline/params/__init__.py", "pipeline/params/base.py", "pipeline/params/training.py"}
# another section a stage follows (listed among its params in dvc.yaml): evaluate scores the students that
# student.instances declares
READS_ALSO = {"evaluate": {"pipeline/params/student.py"}}


def test_the_schemas_are_the_sections_in_order() -> None:
    assert tuple(SECTIONS) == SECTION_NAMES


@pytest.mark.parametrize("section", SECTION_NAMES)
def test_a_stage_imports_its_own_schema_and_no_other(section: str) -> None:
    """The code a stage imports (what dvc.yaml lists for it) holds its own section's schema and no other
    stage's, so that an edit to one stage's schema re-runs that stage alone."""
    schemas = {
        str(path) for path in stage_files(f"stages.{section}") if path.parts[:2] == ("pipeline", "params")
    }
    followed = READS_ALSO.get(section, set())
    assert schemas - SHARED_SCHEMAS == {f"pipeline/params/{section}.py"} | followed


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_profile_is_valid(profile: Path) -> None:
    sections = load_all(profile)
    assert set(sections) == set(SECTIONS)


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("data", "section", "expected"),
    [
        ({"teacher": {"alpah": 1.5}}, "teacher", "teacher.alpah: unknown key (allowed: init, alpha,"),
        (
            {"teacher": {"alpha": "sparse"}},
            "teacher",
            "teacher.alpha = 'sparse': Input should be a valid number",
        ),
        (
            {"teacher": {"alpha": 0.5}},
            "teacher",
            "teacher.alpha = 0.5: Input should be greater than or equal to 1",
        ),
        (
            {"teacher": {"train": {"lr": -1}}},
            "teacher",
            "teacher.train.lr = -1: Input should be greater than 0",
        ),
        (
            {"teacher": {"train": {"schedule": "cosine"}}},
            "teacher",
            "teacher.train.schedule = 'cosine': Input should be 'inverse_sqrt', 'linear' or",
        ),
        ({"prepare": {"source": "text"}}, "prepare", "prepare: source 'text' needs a 'text' section"),
        ({"prepare": {"min_length": 10, "max_length": 5}}, "prepare", "min_length 10 exceeds max_length 5"),
        (
            {"pretrain": {"model": {"d_model": 100, "heads": 3}}},
            "pretrain",
            "d_model 100 is not divisible by heads 3",
        ),
        (
            {"pretrain": {"train": {"max_steps": 1.5}}},
            "pretrain",
            "pretrain.train.max_steps = 1.5: Input should be a valid integer",
        ),
        (
            {"evaluate": {"speed": {"perplexity_gap": -0.05}}},
            "evaluate",
            "evaluate.speed.perplexity_gap = -0.05: Input should be greater than or equal to 0",
        ),
    ],
)
def test_bad_values_give_one_line(tmp_path: Path, data: dict, section: str, expected: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(UserError) as err:
        load_section(section, path)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message
    assert message.startswith(str(path))


def test_unknown_section_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown section 'teachr'"):
        load_all(write(tmp_path, {"teachr": {}}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("teacher: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_section("teacher", bad)
    with pytest.raises(UserError, match="params file not found"):
        load_section("teacher", tmp_path / "missing.yaml")


def test_stage_exits_2_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "teacher-out"
    path = write(tmp_path, {"teacher": {"alpha": 9, "out": str(out)}})
    result = run_module("stages.teacher", "--params", str(path), cwd=ROOT)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {path}: teacher.alpha = 9: Input should be less than or equal to 4"]
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_cli_validates_whole_file(tmp_path: Path) -> None:
    """Every section must be present, so the file is the micro profile with one bad value.

    ``python -m pipeline`` runs as a process of its own (the stage tests run in this one): it covers the
    package's ``__main__`` entry point, and its stderr is all the process printed, imports included.
    """
    data = yaml.safe_load((ROOT / "configs" / "micro.yaml").read_text())
    data["pretrain"]["train"]["batch_size"] = 0
    path = write(tmp_path, data)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "params", "--params", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {path}: pretrain.train.batch_size = 0: Input should be greater than 0"], lines
