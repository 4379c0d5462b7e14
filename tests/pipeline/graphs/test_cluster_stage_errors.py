"""The cluster stage refuses projections it cannot use: one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.graphs import GraphStore
from pipeline.projection import HeadProjections, save_projections
from tests.stage_runner import run_module

ROOT = Path(__file__).resolve().parents[3]


def run_cluster(tmp_path: Path, store: Path, projections: Path) -> subprocess.CompletedProcess:
    params = yaml.safe_load((ROOT / "configs" / "micro.yaml").read_text())
    params["cluster"].update(
        graphs=str(store),
        projections=str(projections),
        out=str(tmp_path / "state.safetensors"),
        metrics=str(tmp_path / "cluster.json"),
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    # run in tmp_path, the project folder its outputs must lie in
    return run_module("stages.cluster", "--params", str(tmp_path / "params.yaml"), cwd=tmp_path)


def fake_projections(store: GraphStore, path: Path, kind: str, split: dict) -> Path:
    layers = {i: HeadProjections(store.heads, store.head_dim, 2) for i in range(store.layers)}
    save_projections(path, layers, {"kind": kind, "split": split, "graphs": store.manifest["teacher"]})
    return path


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "projections file"),
        ("other kind", "was fitted on another graph store"),
        ("other sentences", "was fitted on another graph store"),
    ],
)
def test_bad_projections_are_one_line_errors(micro_store: Path, tmp_path: Path, case: str, message: str):
    store = GraphStore(micro_store)
    path = tmp_path / "projections.safetensors"
    if case == "other kind":
        fake_projections(store, path, "self", {"train": [0], "valid": [1]})
    elif case == "other sentences":
        fake_projections(store, path, "decoder_self", {"train": [0, len(store) + 5], "valid": [1]})
    result = run_cluster(tmp_path, micro_store, path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state.safetensors").exists() and not (tmp_path / "cluster.json").exists()
