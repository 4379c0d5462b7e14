"""Careless output paths: no stage or command destroys an input, another output, the project's sources, or
anything outside the project.

Each case is a command a careless user might type, run in-process in a temporary project folder holding the
micro profile, a teacher, two graph stores and a few project files; what it must give is exit status 2, one
exact ``error:`` line, and every file under the temporary folder (the project and what lies beside it)
exactly as it was.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from pipeline.cli.inspect import SOFTWARE
from pipeline.errors import UserError
from pipeline.params.sections import load_section
from pipeline.stage import check_outputs
from tests.stage_runner import run_module

MICRO = Path(__file__).resolve().parents[2] / "configs" / "micro.yaml"
APART = "not the same path, nor inside or around it"
OUTSIDE = "allowed: a path inside it (a stage writes only below the folder it runs in)"
SOURCES = "allowed: a path apart from the project's sources (under artifacts/, say)"
READS = f"which the stage reads; allowed: an output apart from every input ({APART})"
SHARED = f"allowed: a path no other output shares ({APART})"
NO_STAGE = "allowed: a path no stage writes"
NOT_SPECIAL = "allowed: a regular file, a folder or a path that does not exist"


def write_params(project: Path, changes: dict[str, Any]) -> None:
    """``project/params.yaml``: the micro profile with ``changes`` (dotted key → value)."""
    params = yaml.safe_load(MICRO.read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        section = params
        for name in parents:
            section = section[name]
        section[key] = value
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture
def project(tmp_path: Path, teacher: tuple) -> Path:
    """A project folder ``tmp_path/project`` with the micro profile, the tiny teacher at the profile's
    teacher path, two (stand-in) graph stores and the project's own files; ``tmp_path/outside`` beside it."""
    folder = tmp_path / "project"
    shutil.copytree(teacher[2], folder / "artifacts/models/teacher")
    for store in ("train", "test"):
        (folder / "artifacts/graphs" / store).mkdir(parents=True)
        (folder / "artifacts/graphs" / store / "manifest.json").write_text(f'{{"split": "{store}"}}\n')
    for source in ("dvc.yaml", "README.md"):
        (folder / source).write_text(f"the project's {source}\n")
    (folder / "pipeline").mkdir()
    (folder / "pipeline/stage.py").write_text("# source\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/kept.txt").write_text("kept\n")
    write_params(folder, {})
    return folder


def snapshot(folder: Path) -> dict[str, Any]:
    """Every path under ``folder`` (hidden ones too) with its content, link target or kind."""
    tree = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            tree[str(path)] = ("link", os.readlink(path))
        elif path.is_file():
            tree[str(path)] = path.read_bytes()
        else:
            tree[str(path)] = "folder" if path.is_dir() else "special"
    return tree


def assert_refused(result: subprocess.CompletedProcess, line: str) -> None:
    """Exit 2, no traceback, and stderr exactly the one line ``error: LINE``."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [f"error: {line}"]


def run_stage(project: Path, stage: str, changes: dict[str, Any], *args: str) -> subprocess.CompletedProcess:
    write_params(project, changes)
    return run_module(f"stages.{stage}", *args, "--params", "params.yaml", cwd=project)


# ----------------------------------------------------------------------------------------------------------
# stages: refused before any work, nothing written anywhere


def stage_cases(root: Path, project: Path) -> list[tuple[str, dict[str, Any], tuple[str, ...], str]]:
    """(stage, params changes, stage arguments, the one error line) of each careless params file."""
    teacher, train = "artifacts/models/teacher", "artifacts/graphs/train"
    outside = str(root / "outside/report.md")
    return [
        (
            "extract",
            {"extract.stores.test.out": teacher},
            (),
            f"extract.stores.test.out = '{teacher}' is the same path as extract.teacher = '{teacher}', "
            f"{READS}",
        ),
        (
            "extract",
            {"extract.stores.test.out": f"{teacher}/graphs"},
            (),
            f"extract.stores.test.out = '{teacher}/graphs' lies inside extract.teacher = '{teacher}', "
            f"{READS}",
        ),
        (
            "project",
            {"project.out": "artifacts/graphs/./train/../train"},
            (),
            "project.out = 'artifacts/graphs/./train/../train' is the same path as project.graphs = "
            f"'{train}', {READS}",
        ),
        (
            "report",
            {"report.out": "../outside.txt"},
            (),
            f"report.out = '../outside.txt' lies outside the project folder {project}; {OUTSIDE}",
        ),
        (
            "report",
            {"report.out": outside},
            (),
            f"report.out = '{outside}' lies outside the project folder {project}; {OUTSIDE}",
        ),
        (
            "report",
            {"report.out": "artifacts/elsewhere/report.md"},  # a link to the folder beside the project
            (),
            f"report.out = 'artifacts/elsewhere/report.md' lies outside the project folder {project} "
            f"(a link on its way leads to {root / 'outside'}); {OUTSIDE}",
        ),
        (
            "report",
            {"report.out": "./artifacts/../dvc.yaml"},
            (),
            "report.out = './artifacts/../dvc.yaml' is the same path as the project's own dvc.yaml; "
            f"{SOURCES}",
        ),
        (
            "report",
            {"report.out": "params.yaml"},
            (),
            f"report.out = 'params.yaml' is the same path as the project's own params.yaml; {SOURCES}",
        ),
        (
            "report",
            {"report.plots": "pipeline/plots"},
            (),
            f"report.plots = 'pipeline/plots' lies inside the project's own pipeline/; {SOURCES}",
        ),
        (
            "report",
            {"report.plots": "artifacts"},
            (),
            "report.out = 'artifacts/report.md' lies inside report.plots = 'artifacts', another output of "
            f"the stage; {SHARED}",
        ),
        (
            "project",
            {"project.plot": "artifacts/metrics/cluster.json"},
            (),
            "project.plot = 'artifacts/metrics/cluster.json' is the same path as cluster.metrics = "
            f"'artifacts/metrics/cluster.json', the output of stage cluster; {SHARED}",
        ),
        (
            "evaluate",
            {"evaluate.timings": "artifacts/evaluation/evaluate.json"},
            (),
            "evaluate.out = 'artifacts/evaluation/evaluate.json' is the same path as evaluate.timings = "
            f"'artifacts/evaluation/evaluate.json', another output of the stage; {SHARED}",
        ),
        (
            "student",
            {"student.instances.ssa.out": "artifacts/students/sparsefinder/ssa"},
            ("ssa",),
            "student.instances.sparsefinder.out = 'artifacts/students/sparsefinder' contains "
            "student.instances.ssa.out = 'artifacts/students/sparsefinder/ssa', the output of stage "
            f"student@ssa; {SHARED}",
        ),
        (
            "project",
            {"project.out": "artifacts/to-train/projections.safetensors"},  # a link to the train store
            (),
            "project.out = 'artifacts/to-train/projections.safetensors' lies inside project.graphs = "
            f"'{train}', {READS}",
        ),
        (
            "report",
            {"report.out": "artifacts/report.fifo"},
            (),
            f"report.out = 'artifacts/report.fifo': it is a FIFO; {NOT_SPECIAL}",
        ),
    ]


CASE_IDS = [
    "store onto the teacher",
    "store inside the teacher",
    "output onto its input through ..",
    "parent folder",
    "absolute path outside",
    "link to outside",
    "dvc.yaml through ..",
    "the params file",
    "inside the sources",
    "output containing another",
    "another stage's output",
    "evaluate's timings onto its results",
    "one student inside another",
    "input reached through a link",
    "a FIFO",
]


@pytest.mark.parametrize("case", range(len(CASE_IDS)), ids=CASE_IDS)
def test_a_careless_stage_output_is_refused_before_any_work(project: Path, case: int) -> None:
    root = project.parent
    (project / "artifacts/elsewhere").symlink_to(root / "outside")
    (project / "artifacts/to-train").symlink_to(project / "artifacts/graphs/train")
    os.mkfifo(project / "artifacts/report.fifo")
    stage, changes, args, line = stage_cases(root, project)[case]
    write_params(project, changes)
    before = snapshot(root)
    assert_refused(run_stage(project, stage, changes, *args), line)
    assert snapshot(root) == before  # the teacher, the stores, the sources, the folder beside: untouched


def test_an_output_in_etc_is_refused_without_a_stage_running(project: Path, monkeypatch) -> None:
    """The check alone (as ``sparsefinder params`` calls it): one line, nothing written anywhere."""
    write_params(project, {"report.out": "/etc/sparsefinder-report.md"})
    monkeypatch.chdir(project)
    with pytest.raises(UserError) as refused:
        check_outputs("report", load_section("report", "params.yaml"), "params.yaml")
    assert str(refused.value) == (
        f"report.out = '/etc/sparsefinder-report.md' lies outside the project folder {project}; {OUTSIDE}"
    )


def test_the_check_is_lenient_with_other_sections_and_a_missing_params_file(
    project: Path, monkeypatch
) -> None:
    """Another section that fails validation, or no params file at all, leaves the stage's own checks."""
    write_params(project, {"cluster.top_k": 100, "cluster.out": "artifacts/report.md"})
    monkeypatch.chdir(project)
    report = load_section("report", "params.yaml")
    check_outputs("report", report, "params.yaml")  # cluster's section is invalid: its outputs are left out
    check_outputs("report", report, "absent.yaml")
    bad = report.model_copy(update={"out": "../outside.txt"})
    with pytest.raises(UserError, match=r"^report.out = '../outside.txt' lies outside the project folder"):
        check_outputs("report", bad, "absent.yaml")


def test_the_profiles_pass_the_check(monkeypatch) -> None:
    """Every section of every shipped profile, checked from the repository root where DVC runs them."""
    root = MICRO.parents[1]
    monkeypatch.chdir(root)
    for params in [root / "params.yaml", *sorted((root / "configs").glob("*.yaml"))]:
        for name in yaml.safe_load(params.read_text()):
            check_outputs(name, load_section(name, params), params)


# ----------------------------------------------------------------------------------------------------------
# sparsefinder configure OUT


def configure(project: Path, out: str, *flags: str) -> subprocess.CompletedProcess:
    args = ["configure", "artifacts/models/teacher", out, "--method", "window", "--window", "3", *flags]
    return run_module("pipeline", *args, cwd=project)


INPUTS = f"which the command reads; allowed: a path apart from every input ({APART})"


@pytest.mark.parametrize(
    ("out", "line"),
    [
        (
            "artifacts/models/teacher",
            "OUT artifacts/models/teacher is the same path as the teacher folder artifacts/models/teacher, "
            f"{INPUTS}",
        ),
        (
            "artifacts/models/teacher/sparse",
            "OUT artifacts/models/teacher/sparse lies inside the teacher folder artifacts/models/teacher, "
            f"{INPUTS}",
        ),
        (
            "artifacts/graphs",
            "OUT artifacts/graphs contains extract.stores.train.out = 'artifacts/graphs/train', the output "
            f"of stage extract in params.yaml; {NO_STAGE}",
        ),
        (
            "artifacts/models/pretrain",
            "OUT artifacts/models/pretrain is the same path as pretrain.out = 'artifacts/models/pretrain', "
            f"the output of stage pretrain in params.yaml; {NO_STAGE}",
        ),
        (
            "README.md",
            "OUT README.md exists and is not what sparsefinder configure writes; pass --force to replace it, "
            "or choose another path",
        ),
        (
            "/dev/null",
            f"OUT /dev/null: it is a character device; {NOT_SPECIAL}",
        ),
    ],
    ids=[
        "the teacher",
        "inside the teacher",
        "the graph stores",
        "another stage's output",
        "a file",
        "device",
    ],
)
def test_a_careless_configure_out_is_refused(project: Path, out: str, line: str) -> None:
    before = snapshot(project.parent)
    assert_refused(configure(project, out), line)
    assert snapshot(project.parent) == before


def test_configure_replaces_its_own_output_and_others_only_with_force(project: Path) -> None:
    own = "artifacts/models/sparsefinder"  # configure.out: the one stage output the command may write
    for _ in range(2):
        result = configure(project, own)
        assert result.returncode == 0, result.stderr[-3000:]
    assert (project / own / "model.safetensors").is_file()
    assert configure(project, "/dev/null", "--force").returncode == 2  # no flag writes onto a device
    result = configure(project, "README.md", "--force")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (project / "README.md/manifest.json").is_file()


def test_configure_is_lenient_with_an_invalid_params_file(project: Path) -> None:
    (project / "params.yaml").write_text("pretrain: [unclosed\n")
    result = configure(project, "artifacts/models/pretrain")  # a stage output, were the file valid
    assert result.returncode == 0, result.stderr[-3000:]


# ----------------------------------------------------------------------------------------------------------
# sparsefinder inspect --png


def inspect(project: Path, store: Path, png: str, *flags: str) -> subprocess.CompletedProcess:
    args = ["inspect", str(store), "--sentence", "0", "--layer", "0", "--head", "0", "--png", png, *flags]
    return run_module("pipeline", *args, cwd=project)


def test_a_careless_png_is_refused(project: Path, micro_store: Path) -> None:
    store = project / "artifacts/graphs/micro"
    shutil.copytree(micro_store, store)
    cases = {
        str(store / "head.png"): f"--png {store / 'head.png'} lies inside the graph store {store}, {INPUTS}",
        "artifacts/plots/par_search.png": (
            "--png artifacts/plots/par_search.png is the same path as par_search.plot = "
            f"'artifacts/plots/par_search.png', the output of stage par_search in params.yaml; {NO_STAGE}"
        ),
        "README.md": (
            "--png README.md exists and is not what sparsefinder inspect writes; pass --force to replace it, "
            "or choose another path"
        ),
        "/dev/null": (f"--png /dev/null: it is a character device; {NOT_SPECIAL}"),
    }
    before = snapshot(project.parent)
    for png, line in cases.items():
        assert_refused(inspect(project, store, png), line)
    assert snapshot(project.parent) == before


def test_inspect_redraws_its_own_png_and_replaces_others_only_with_force(
    project: Path, micro_store: Path
) -> None:
    for _ in range(2):
        result = inspect(project, micro_store, "head.png")
        assert result.returncode == 0, result.stderr[-3000:]
    with Image.open(project / "head.png") as image:
        assert image.info["Software"] == SOFTWARE
    result = inspect(project, micro_store, "README.md", "--force")
    assert result.returncode == 0, result.stderr[-3000:]
    with Image.open(project / "README.md") as image:
        assert image.format == "PNG"
