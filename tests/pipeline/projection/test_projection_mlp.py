"""The tanh MLP projector on a micro graph store: training, the project stage's pass-through, its params."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.errors import UserError
from pipeline.graphs import GraphStore
from pipeline.graphs.batches import epoch_batches, iter_batches
from pipeline.params.project import Project
from pipeline.params.sections import load_section
from pipeline.projection.fit_store import fit_store_projections
from pipeline.projection.model import HeadProjections, load_projections
from pipeline.projection.train import held_out_loss, train_layer_projections
from tests.stage_runner import run_module

ROOT = Path(__file__).resolve().parents[3]
KIND = "decoder_self"


@pytest.mark.parametrize("shared", [False, True])
def test_mlp_training_lowers_the_hinge_loss_on_a_micro_store(micro_store: Path, shared: bool) -> None:
    store = GraphStore(micro_store)
    sentences = list(range(len(store)))
    seed, hidden = 3, 16
    module, losses = train_layer_projections(
        epoch_batches(store, kind=KIND, layer=1, indices=sentences),
        n_heads=store.heads, head_dim=store.head_dim, causal=True, shared=shared, hidden=hidden,
        epochs=10, lr=1e-2, batch_size=4, seed=seed, progress=False,
    )  # fmt: skip
    assert module.config()["hidden"] == hidden and module.shared == shared
    # the trainer's starting point: the same seed draws the same initial weights
    start = HeadProjections(
        store.heads,
        store.head_dim,
        shared=shared,
        hidden=hidden,
        generator=torch.Generator().manual_seed(seed),
    )

    def loss(m: HeadProjections) -> float:
        batches = iter_batches(store, kind=KIND, layer=1, indices=sentences, batch_size=4)
        return held_out_loss(m, batches, causal=True, seed=0)

    assert loss(module) < 0.5 * loss(start), (loss(module), loss(start))
    assert sum(losses[-3:]) / 3 < 0.5 * losses[0]


def test_fit_store_passes_hidden_through(micro_store: Path) -> None:
    params = Project(
        graphs=str(micro_store), hidden=8, shared=True, epochs=1, batch_size=4, valid_fraction=0.3
    )
    layers, report, curve = fit_store_projections(GraphStore(micro_store), params)
    assert all(m.config()["hidden"] == 8 and m.shared for m in layers.values())
    assert report["projector"] == {"rank": 4, "shared": True, "hidden": 8}
    assert curve and all(row["layer"] in layers for row in curve)


def micro_params(tmp_path: Path, store: Path, **project: object) -> Path:
    """The micro profile with its project section on ``store``, writing into ``tmp_path``."""
    params = yaml.safe_load((ROOT / "configs" / "micro.yaml").read_text())
    params["project"].update(
        graphs=str(store),
        out=str(tmp_path / "projections.safetensors"),
        metrics=str(tmp_path / "project.json"),
        plot=str(tmp_path / "project_loss.csv"),
        **project,
    )
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def run_project(params: Path) -> subprocess.CompletedProcess:
    """The stage run in the params file's folder, the project folder its outputs must lie in."""
    return run_module("stages.project", "--params", str(params), cwd=params.parent)


def test_project_stage_writes_mlp_projections(micro_store: Path, tmp_path: Path) -> None:
    result = run_project(micro_params(tmp_path, micro_store, hidden=12))
    assert result.returncode == 0, result.stderr[-3000:]
    layers, extra = load_projections(tmp_path / "projections.safetensors")
    store = GraphStore(micro_store)
    assert sorted(layers) == list(range(store.layers)) and extra["kind"] == KIND
    assert all(m.config() == {**m.config(), "hidden": 12} for m in layers.values())
    assert json.loads((tmp_path / "project.json").read_text())["projector"]["hidden"] == 12


def test_bad_hidden_is_a_one_line_error(tmp_path: Path) -> None:
    """The stage refuses it before reading the store: exit 2, one line, nothing written."""
    result = run_project(micro_params(tmp_path, tmp_path / "no-store", hidden=0))
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "project.hidden = 0: Input should be greater than 0" in lines[0], lines
    assert not any(tmp_path.glob("project*")) and not (tmp_path / "projections.safetensors").exists()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-4, "project.hidden = -4: Input should be greater than 0"),
        (True, "project.hidden = True: Input should be a valid integer"),
        (16.0, "project.hidden = 16.0: Input should be a valid integer"),
        ("wide", "project.hidden = 'wide': Input should be a valid integer"),
    ],
    ids=["negative", "bool", "float", "string"],
)
def test_hidden_schema_rejects(tmp_path: Path, value: object, expected: str) -> None:
    with pytest.raises(UserError) as err:
        load_section("project", micro_params(tmp_path, tmp_path, hidden=value))
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("value", [None, 1, 64])
def test_hidden_schema_accepts_null_and_positive_ints(tmp_path: Path, value: int | None) -> None:
    assert load_section("project", micro_params(tmp_path, tmp_path, hidden=value)).hidden == value
