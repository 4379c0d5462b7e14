"""Every stage's code is a DVC dependency: changing any file a stage imports re-runs that stage, and
changing one it never imports does not.

The imports are walked statically from the stage script (function-level imports included, since those run
too), following the project's own packages; a module's parent packages count, since importing it runs their
``__init__``. Each such file must be listed in the stage's ``deps`` in dvc.yaml, itself or through a folder.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages", "kernels")


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
    """The C++ kernels that ``files`` build (``library("name")`` is kernels/name.cpp), and the headers beside
    them, which they may include."""
    names = {
        name
        for path in files
        for name in re.findall(r'(?<![\w.])library\("(\w+)"\)', (ROOT / path).read_text())
    }
    if not names:
        return set()
    headers = {path.relative_to(ROOT) for path in (ROOT / "kernels").glob("*.h")}
    return {Path("kernels") / f"{name}.cpp" for name in names} | headers


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


@pytest.mark.parametrize("stage", sorted(stages()))
def test_stage_lists_no_code_it_does_not_import(stage: str) -> None:
    deps, files = stage_code(stage)
    unused = sorted(
        str(dep) for dep in deps if dep.parts[0] in PACKAGES and not any(covers(dep, path) for path in files)
    )
    assert not unused, f"dvc.yaml stage {stage} lists code it never imports: {', '.join(unused)}"


def test_walker_sees_function_level_and_package_imports() -> None:
    files = stage_files("stages.extract")
    assert Path("pipeline/graphs/store.py") in files
    assert Path("pipeline/__init__.py") in files  # importing pipeline.x runs pipeline/__init__.py
    assert Path("pipeline/attention/entmax.py") in files  # extract runs the teacher's entmax attention
    assert Path("kernels/planning.cpp") in native_sources(files)  # its bucketed attention plans in C++
