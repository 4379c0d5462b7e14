"""Every stage's code is a DVC dependency: changing any file a stage imports re-runs that stage, and
changing one it never imports does not.

The imports are walked statically from the stage script (function-level imports included, since those run
too), following the project's own packages; a module's parent packages count, since importing it runs their
``__init__``. Each such file must be listed in the stage's ``deps`` in dvc.yaml, itself or through a folder.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages", "attention_kernels")


def module_file(name: str) -> Path | None:
    """The project file of module ``name`` (a .py file or a package's __init__.py), None if not ours."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(path: Path, module: str) -> set[str]:
    """Module names ``path`` imports anywhere in its body; ``from a import b`` yields a.b too (a module?)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def stage_files(script_module: str) -> set[Path]:
    """Every project file that running ``python -m script_module`` imports."""
    seen: set[str] = set()
    todo = [script_module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # the module and its parent packages
            prefix = ".".join(parts[:i])
            path = module_file(prefix)
            if path is not None and prefix not in seen:
                seen.add(prefix)
                todo += imports_of(path, prefix)
    return {module_file(name).relative_to(ROOT) for name in seen}


def native_sources(files: set[Path]) -> set[Path]:
    """The C++ kernels that ``files`` build (``library("name")`` is attention_kernels/native/name.cpp), and
    the headers beside them that those include, directly or through another header."""
    native = Path("attention_kernels") / "native"
    todo = [
        native / f"{name}.cpp"
        for path in files
        for name in re.findall(r'(?<![\w.])library\("(\w+)"\)', (ROOT / path).read_text())
    ]
    found: set[Path] = set()
    while todo:
        source = todo.pop()
        if source in found:
            continue
        found.add(source)
        todo += [
            native / name for name in re.findall(r'^#include "([\w.]+)"', (ROOT / source).read_text(), re.M)
        ]
    return found


def stages() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def stage_code(stage: str) -> tuple[list[Path], set[Path]]:
    """The stage's deps in dvc.yaml (templated ones left out) and every project file its script imports,
    with the C++ sources those build."""
    spec = stages()[stage]
    spec = spec.get("do", spec)  # a foreach stage: every instance runs the same script
    command = spec["cmd"].split()
    assert command[:2] == ["python", "-m"], f"{stage}: cmd should be `python -m stages.{stage}`"
    files = stage_files(command[2])
    return [Path(dep) for dep in spec["deps"] if "${" not in dep], files | native_sources(files)


def covers(dep: Path, path: Path) -> bool:
    """Whether dependency ``dep``, a file or a folder, holds project file ``path``."""
    return path == dep or dep in path.parents


@pytest.mark.parametrize("stage", sorted(stages()))
def test_stage_lists_every_file_it_imports(stage: str) -> None:
    deps, files = stage_code(stage)
    missing = sorted(str(path) for path in files if not any(covers(dep, path) for dep in deps))
    assert not missing, f"dvc.yaml stage {stage} does not list: {', '.join(missing)}"


def source_files(dep: Path) -> set[Path]:
    """The project files a dependency names: itself, or every file in the folder (caches left out)."""
    if not (ROOT / dep).is_dir():
        return {dep}
    found = (ROOT / dep).rglob("*")
    return {path.relative_to(ROOT) for path in found if path.is_file() and "__pycache__" not in path.parts}


@pytest.mark.parametrize("stage", sorted(stages()))
def test_stage_lists_no_code_it_does_not_import(stage: str) -> None:
    deps, files = stage_code(stage)
    unused = sorted(
        str(path)
        for dep in deps
        if dep.parts[0] in PACKAGES
        for path in source_files(dep)
        if path not in files
    )
    assert not unused, f"dvc.yaml stage {stage} lists code it never imports: {', '.join(unused)}"


BEFORE_THE_KERNELS = ("prepare", "pretrain", "teacher", "extract", "project", "cluster")


@pytest.mark.parametrize("stage", BEFORE_THE_KERNELS)
def test_attention_kernel_edits_leave_the_stages_before_them_alone(stage: str) -> None:
    """prepare … cluster never run bucketed or indexed attention, so an edit there must not re-run them."""
    _, files = stage_code(stage)
    reached = sorted(
        str(path)
        for path in files
        if path.parts[:2] in {("attention_kernels", "bucketed"), ("attention_kernels", "indexed")}
    )
    assert not reached, f"stage {stage} imports {', '.join(reached)}"


@pytest.mark.parametrize("stage", ["evaluate", "student"])
def test_stages_that_run_sparse_attention_depend_on_its_kernels(stage: str) -> None:
    deps, _ = stage_code(stage)
    for path in (
        Path("attention_kernels/bucketed/torch_path.py"),
        Path("attention_kernels/indexed/attention.py"),
    ):
        assert any(covers(dep, path) for dep in deps), f"{stage} does not list {path}"


def package_files(package: str) -> list[Path]:
    return sorted(path for path in (ROOT / package).rglob("*.py") if "__pycache__" not in path.parts)


@pytest.mark.parametrize(
    ("lower", "upper"),
    [("attention_kernels", "pipeline"), ("attention_kernels", "benchmarks"), ("pipeline", "benchmarks")],
)
def test_layers_import_downward_only(lower: str, upper: str) -> None:
    """Kernels never import the pipeline; neither imports the benchmarks (function-level imports included)."""
    offenders = []
    for path in package_files(lower):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if any(name.split(".")[0] == upper for name in imports_of(path, module)):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"{lower} imports {upper} in: {', '.join(offenders)}"


@pytest.mark.parametrize("stage", ["pretrain", "evaluate"])
def test_walker_finds_whatever_importing_the_stage_loads(stage: str) -> None:
    """The static walk misses nothing a real import loads: ``sys.modules`` after importing the stage."""
    code = (
        "import json, sys\n"
        f"import stages.{stage}\n"
        "print(json.dumps([getattr(m, '__file__', None) for m in list(sys.modules.values())]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = {Path(name).resolve() for name in json.loads(done.stdout) if name}
    ours = {
        path.relative_to(ROOT)
        for path in loaded
        if ROOT in path.parents and path.parts[len(ROOT.parts)] in PACKAGES
    }
    _, files = stage_code(stage)
    assert ours, "the import loaded no project file"
    assert ours <= files, f"the walk misses {sorted(map(str, ours - files))}"


def test_walker_sees_function_level_and_package_imports() -> None:
    files = stage_files("stages.extract")
    assert Path("pipeline/graphs/store.py") in files
    assert Path("pipeline/__init__.py") in files  # importing pipeline.x runs pipeline/__init__.py
    assert Path("pipeline/attention/entmax.py") in files  # extract runs the teacher's entmax attention
    assert not native_sources(files)  # the teacher's entmax runs no C++ kernel
    evaluated = stage_files("stages.evaluate")
    # bucketed attention plans in C++
    assert Path("attention_kernels/native/planning.cpp") in native_sources(evaluated)
