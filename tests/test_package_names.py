"""The import names the project ships are its alone.

The project's folder leads ``sys.path`` (``python -m stages.X``, pytest), so an installed distribution with a
top-level module of the same name is shadowed, and a dependency that imports it gets ours instead:
transformers 5.25 imports Hugging Face's ``kernels`` when it loads a model, which is why the kernels live in
``attention_kernels``.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shipped() -> tuple[str, list[str]]:
    """The distribution's normalised name and the top-level packages pyproject.toml ships."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return normalised(project["project"]["name"]), [pattern.rstrip("*") for pattern in patterns]


def normalised(distribution: str) -> str:
    """A distribution name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def test_the_shipped_packages_are_the_project_folders():
    _, packages = shipped()
    assert "attention_kernels" in packages and "kernels" not in packages
    assert all((ROOT / name / "__init__.py").is_file() for name in packages)


def test_no_installed_distribution_ships_a_module_named_like_ours():
    own, packages = shipped()
    owners = importlib.metadata.packages_distributions()  # top-level name → distributions shipping it
    clashes = {
        name: others
        for name in packages
        if (others := [d for d in owners.get(name, []) if normalised(d) != own])
    }
    assert not clashes, f"installed distributions ship modules named like the project's packages: {clashes}"


def test_the_clash_check_sees_an_installed_distributions_modules():
    """The check above can fail: it reads the installed top-level names, e.g. transformers' own."""
    assert "transformers" in importlib.metadata.packages_distributions()
