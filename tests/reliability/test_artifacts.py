"""Hostile and corrupt artifacts between stages: every stage that reads one refuses it in one line.

A micro pipeline (a random α-entmax teacher saved as a checkpoint with its manifest, its graph stores,
projections and predictor states) is built once per module by running the stages in-process. Each case
copies the artifact it damages, points one stage at the copy, and checks what a user sees: exit status 2,
one stderr line starting ``error:`` that names the file, no traceback, and no output written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from transformers import MarianMTModel, PreTrainedTokenizerFast

from pipeline.atomic import atomic_path
from pipeline.attention import ENTMAX
from pipeline.checkpoint import save_checkpoint
from pipeline.data.tokenizer import load_tokenizer
from pipeline.errors import UserError
from pipeline.fingerprint import file_sha256
from pipeline.finite import require_finite
from pipeline.graphs import GraphStore
from pipeline.graphs.store import AttentionGraph, GraphStoreWriter
from pipeline.projection.model import HeadProjections, load_projections, save_projections
from pipeline.tensor_file import write_tensor_file
from pipeline.timings import timings_path
from stages import cluster, evaluate, extract, project
from tests.test_params_errors import MICRO, corpus, teacher, texts  # noqa: F401  (module fixtures)

STAGES: dict[str, Callable[[list[str]], None]] = {
    "extract": extract.main,
    "project": project.main,
    "cluster": cluster.main,
    "evaluate": evaluate.main,
}


def micro_params(folder: Path, data: Path, checkpoint: Path) -> dict[str, Any]:
    """The micro profile with every path under ``folder`` and the stages after ``teacher`` made small."""
    params = yaml.safe_load(MICRO.read_text())
    out = folder / "artifacts"
    params["extract"].update(
        teacher=str(checkpoint), data=str(data), metrics=str(out / "metrics/extract.json")
    )
    params["extract"]["stores"] = {
        "train": {"split": "train", "min_length": 3, "max_sentences": 40, "out": str(out / "graphs/train")},
        "test": {"split": "test", "min_length": 3, "max_sentences": 8, "out": str(out / "graphs/test")},
    }
    params["project"].update(
        graphs=str(out / "graphs/train"),
        out=str(out / "predictors/projections.safetensors"),
        metrics=str(out / "metrics/project.json"),
        plot=str(out / "plots/project_loss.csv"),
    )
    params["cluster"].update(
        graphs=str(out / "graphs/train"),
        projections=str(out / "predictors/projections.safetensors"),
        out=str(out / "predictors/state.safetensors"),
        metrics=str(out / "metrics/cluster.json"),
    )
    params["evaluate"].update(
        graphs=str(out / "graphs/test"),
        projections=str(out / "predictors/projections.safetensors"),
        state=str(out / "predictors/state.safetensors"),
        teacher=str(checkpoint),
        data=str(data),
        out=str(out / "evaluation/evaluate.json"),
    )
    return params


@contextlib.contextmanager
def project_folder(folder: Path) -> Iterator[None]:
    """Run stages in ``folder``: the project folder every output of theirs must lie in."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        yield


def write_params(folder: Path, params: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def checkpoint(teacher: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The random teacher saved the way the teacher stage saves: with a manifest holding its sha256."""
    folder = tmp_path_factory.mktemp("checkpoint") / "teacher"
    model = MarianMTModel.from_pretrained(teacher, attn_implementation=ENTMAX)
    model.config.entmax_alpha = 1.5
    tokenizer = load_tokenizer(corpus / "tokenizer")
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    save_checkpoint(folder, model, tokenizer, {"stage": "teacher"})
    return folder


@pytest.fixture(scope="module")
def pipeline_run(corpus: Path, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """extract, project and cluster run once on the micro teacher; returns the params and their file."""
    folder = tmp_path_factory.mktemp("pipeline")
    params = micro_params(folder, corpus, checkpoint)
    path = write_params(folder, params)
    with project_folder(folder):
        for stage in ("extract", "project", "cluster"):
            STAGES[stage](["--params", str(path)])
    return params


def run_with(
    tmp_path: Path,
    base: dict[str, Any],
    stage: str,
    changes: dict[str, Any],
    capsys: pytest.CaptureFixture,
) -> tuple[str, str]:
    """Run ``stage`` on ``base`` with ``changes`` (``section.key`` → value) and every output of that stage
    moved under ``tmp_path``; expect exit 2 and return (its error line, all it wrote on stderr)."""
    params = json.loads(json.dumps(base))
    section = params[stage]
    out = tmp_path / "out"
    if stage == "extract":
        for store in section["stores"].values():
            store["out"] = str(out / Path(store["out"]).name)
    else:
        section["out"] = str(out / Path(section["out"]).name)
    for key in ("plot", "plots", "mixing", "run_dir"):
        if key in section:
            section[key] = str(out / Path(section[key]).name)
    if "metrics" in section:
        section["metrics"] = str(tmp_path / "metrics.json")
    for dotted, value in changes.items():
        key = dotted.split(".", 1)[1]
        section[key] = value
    path = write_params(tmp_path, params)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info, project_folder(tmp_path):
        STAGES[stage](["--params", str(path)])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2, err
    # progress bars of work done before the check may precede it on stderr; the error is one line
    lines = err.splitlines()
    assert lines[-1].startswith("error: ") and sum("error" in line for line in lines) == 1, err
    assert "Traceback" not in err
    assert not out.exists() and not (tmp_path / "metrics.json").exists()
    return lines[-1], err


def flip_byte(path: Path, offset_from_end: int = 64) -> None:
    """Change one byte near the end of ``path`` (inside the tensor data), keeping its size."""
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


def copy_checkpoint(checkpoint: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "teacher"
    shutil.copytree(checkpoint, copy)
    return copy


# ----------------------------------------------------------------------------------------------------------
# checkpoints: weights checked against their manifest where they are loaded


def test_a_flipped_byte_in_the_teacher_stops_extract(pipeline_run, checkpoint, tmp_path, capsys):
    copy = copy_checkpoint(checkpoint, tmp_path)
    flip_byte(copy / "model.safetensors", 4096)
    line, _ = run_with(tmp_path, pipeline_run, "extract", {"extract.teacher": str(copy)}, capsys)
    assert f"{copy / 'model.safetensors'} does not match the sha256 in {copy / 'manifest.json'}" in line


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "generation_config.json"])
def test_a_changed_config_or_tokenizer_stops_extract(pipeline_run, checkpoint, tmp_path, capsys, name):
    """Not only the weights: every file of a checkpoint is hashed into its manifest."""
    copy = copy_checkpoint(checkpoint, tmp_path)
    text = (copy / name).read_text()
    (copy / name).write_text(text.replace("1", "2", 1))  # one digit: still valid JSON, another model
    line, _ = run_with(tmp_path, pipeline_run, "extract", {"extract.teacher": str(copy)}, capsys)
    assert f"{copy / name} does not match the sha256 in {copy / 'manifest.json'}" in line


def test_a_manifest_naming_files_outside_the_folder_is_refused(pipeline_run, checkpoint, tmp_path, capsys):
    copy = copy_checkpoint(checkpoint, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["../../etc/passwd"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    line, _ = run_with(tmp_path, pipeline_run, "extract", {"extract.teacher": str(copy)}, capsys)
    assert "files names '../../etc/passwd', not a file of the checkpoint folder" in line


def test_truncated_teacher_weights_stop_evaluate(pipeline_run, checkpoint, tmp_path, capsys):
    copy = copy_checkpoint(checkpoint, tmp_path)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line, _ = run_with(tmp_path, pipeline_run, "evaluate", {"evaluate.teacher": str(copy)}, capsys)
    assert "does not match the sha256" in line and str(weights) in line


def test_a_teacher_manifest_that_is_not_json_is_named(pipeline_run, checkpoint, tmp_path, capsys):
    copy = copy_checkpoint(checkpoint, tmp_path)
    (copy / "manifest.json").write_text('{"model_sha256": ')
    line, _ = run_with(tmp_path, pipeline_run, "extract", {"extract.teacher": str(copy)}, capsys)
    assert f"{copy / 'manifest.json'}: not a readable JSON file" in line


def test_a_teacher_without_its_manifest_is_refused(pipeline_run, checkpoint, tmp_path, capsys):
    """Without a manifest there is nothing to check the files against: not a checkpoint of the pipeline."""
    copy = copy_checkpoint(checkpoint, tmp_path)
    (copy / "manifest.json").unlink()
    line, _ = run_with(tmp_path, pipeline_run, "extract", {"extract.teacher": str(copy)}, capsys)
    assert line == (
        f"error: extract.teacher = {str(copy)!r}: no manifest.json there, so not a checkpoint this pipeline "
        "wrote; allowed: the folder the teacher stage writes (re-run it)"
    )


def test_checkpoint_manifests_record_the_thread_count(checkpoint):
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["torch_threads"] == torch.get_num_threads()
    assert manifest["model_sha256"] == file_sha256(checkpoint / "model.safetensors")
    files = {p.name for p in checkpoint.iterdir()} - {"manifest.json"}
    assert set(manifest["files"]) == files and "tokenizer.json" in files


def test_non_finite_weights_are_never_saved(checkpoint, tmp_path):
    model = MarianMTModel.from_pretrained(checkpoint, attn_implementation=ENTMAX)
    with torch.no_grad():
        model.model.shared.weight[0, 0] = float("nan")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(checkpoint)
    with pytest.raises(UserError, match=r"refusing to save .*model\.shared\.weight holds non-finite values"):
        save_checkpoint(tmp_path / "diverged", model, tokenizer, {})
    assert not (tmp_path / "diverged").exists()


# ----------------------------------------------------------------------------------------------------------
# projections and predictor states: hashed content, fitted on this teacher, of this shape


@pytest.mark.parametrize("stage", ["cluster", "evaluate"])
def test_a_flipped_byte_in_the_projections_stops_their_readers(pipeline_run, tmp_path, capsys, stage):
    copy = tmp_path / "projections.safetensors"
    shutil.copy(pipeline_run["project"]["out"], copy)
    flip_byte(copy)
    line, _ = run_with(tmp_path, pipeline_run, stage, {f"{stage}.projections": str(copy)}, capsys)
    corrupt = "its tensors do not match the hash in its header (corrupt); run the project stage again"
    assert line == f"error: {copy}: {corrupt}"


def test_a_flipped_byte_in_the_predictor_state_stops_evaluate(pipeline_run, tmp_path, capsys):
    copy = tmp_path / "state.safetensors"
    shutil.copy(pipeline_run["cluster"]["out"], copy)
    flip_byte(copy)
    line, _ = run_with(tmp_path, pipeline_run, "evaluate", {"evaluate.state": str(copy)}, capsys)
    assert f"{copy}: its tensors do not match the hash in its header (corrupt)" in line


def test_a_truncated_state_file_is_one_line(pipeline_run, tmp_path, capsys):
    copy = tmp_path / "state.safetensors"
    copy.write_bytes(Path(pipeline_run["cluster"]["out"]).read_bytes()[:50])
    line, _ = run_with(tmp_path, pipeline_run, "evaluate", {"evaluate.state": str(copy)}, capsys)
    assert f"{copy}: not a readable safetensors file" in line


def resaved_projections(source: str, path: Path, **changes: Any) -> Path:
    """The projections of ``source`` written again with ``changes`` to their ``extra`` (a valid file)."""
    layers, extra = load_projections(source)
    save_projections(path, layers, {**extra, **changes})
    return path


def test_projections_of_another_teacher_are_refused(pipeline_run, tmp_path, capsys):
    other = {"checkpoint": "elsewhere", "model_sha256": "0" * 64}
    path = resaved_projections(pipeline_run["project"]["out"], tmp_path / "p.safetensors", graphs=other)
    for stage in ("cluster", "evaluate"):
        line, _ = run_with(tmp_path / stage, pipeline_run, stage, {f"{stage}.projections": str(path)}, capsys)
        assert f"{path} was fitted on the graphs of another teacher (elsewhere)" in line


def test_projections_of_another_shape_are_refused(pipeline_run, tmp_path, capsys):
    store = GraphStore(pipeline_run["project"]["graphs"])
    _, extra = load_projections(pipeline_run["project"]["out"])
    path = tmp_path / "p.safetensors"
    layers = {i: HeadProjections(store.heads + 1, store.head_dim, 2) for i in range(store.layers)}
    save_projections(path, layers, extra)
    line, _ = run_with(tmp_path, pipeline_run, "cluster", {"cluster.projections": str(path)}, capsys)
    assert f"{path}: layer 0 is for {store.heads + 1} heads × {store.head_dim} dims" in line
    path.unlink()
    save_projections(path, {0: layers[0]}, extra)
    line, _ = run_with(tmp_path / "2", pipeline_run, "cluster", {"cluster.projections": str(path)}, capsys)
    assert f"{path} covers layers [0]; the graph store" in line


def test_a_state_of_another_head_count_is_refused(pipeline_run, tmp_path, capsys):
    path = tmp_path / "state.safetensors"
    source = Path(pipeline_run["cluster"]["out"])
    from pipeline.predictors.state import FORMAT_VERSION as STATE_FORMAT_VERSION
    from pipeline.predictors.state import StateFile

    file = StateFile(source)
    tensors = {name: torch.cat([t, t]) for name, t in file.tensors.items()}  # twice the heads
    header = {"format_version": STATE_FORMAT_VERSION, "states": file.states, "extra": file.extra}
    write_tensor_file(path, tensors, "predictors", header)
    line, _ = run_with(tmp_path, pipeline_run, "evaluate", {"evaluate.state": str(path)}, capsys)
    assert f"{path}: " in line and "is for 4 heads; the graph store" in line


def test_a_file_of_another_kind_is_refused(pipeline_run, tmp_path, capsys):
    line, _ = run_with(
        tmp_path, pipeline_run, "evaluate", {"evaluate.state": pipeline_run["project"]["out"]}, capsys
    )
    assert "not a predictor state file (no 'predictors' metadata)" in line


# ----------------------------------------------------------------------------------------------------------
# training refuses non-finite losses and weights


def test_a_store_with_nan_queries_stops_project_before_it_fits(pipeline_run, tmp_path, capsys):
    """NaN queries (a broken teacher) are refused where the store is read, naming where they are; no
    projections are written."""
    store = GraphStore(pipeline_run["project"]["graphs"])
    path = tmp_path / "nan_store"
    rng = np.random.default_rng(0)
    with GraphStoreWriter(
        path,
        teacher_fingerprint=store.manifest["teacher"],
        split="train",
        attention_kinds=["decoder_self"],
        layers=store.layers,
        heads=store.heads,
        head_dim=store.head_dim,
        scaling=store.scaling,
    ) as writer:
        for s in range(8):
            n = 6
            q = rng.normal(size=(store.layers, store.heads, n, store.head_dim)).astype(np.float32)
            q[:, :, 0, 0] = np.nan
            probs = np.tril(np.ones((store.layers, store.heads, n, n), np.float32))
            probs /= probs.sum(-1, keepdims=True)
            graph = AttentionGraph(q=q, k=np.nan_to_num(q), probs=probs)
            writer.add(s, {"target": [f"t{i}" for i in range(n)]}, {"decoder_self": graph})
    line, _ = run_with(tmp_path, pipeline_run, "project", {"project.graphs": str(path)}, capsys)
    assert line == (
        f"error: graph store shard {path / 'shard-00000.safetensors'}: decoder_self.q is not finite at "
        "sentence 0, layer 0, head 0, token 0; allowed: finite values; re-run extract"
    )
    assert not Path(tmp_path / "out").exists()


def test_the_loss_guard_and_tensor_files_refuse_non_finite_values(tmp_path):
    assert require_finite(0.5, "x", 3) == 0.5
    with pytest.raises(UserError, match=r"^training: the loss is inf at step 7; nothing was saved"):
        require_finite(float("inf"), "training", 7)
    with pytest.raises(UserError, match=r"refusing to write .*: w holds non-finite values"):
        write_tensor_file(tmp_path / "f.safetensors", {"w": torch.tensor([1.0, float("nan")])}, "k", {})
    assert not (tmp_path / "f.safetensors").exists()


def test_the_trainer_callback_stops_on_a_nan_loss():
    from transformers import TrainerControl, TrainerState

    from pipeline.training.trainer import FiniteLoss

    state = TrainerState()
    state.global_step = 12
    FiniteLoss().on_log(None, state, TrainerControl(), logs={"loss": 2.5, "learning_rate": 1e-3})
    with pytest.raises(UserError, match=r"training \(eval_loss\): the loss is nan at step 12"):
        FiniteLoss().on_log(None, state, TrainerControl(), logs={"eval_loss": float("nan")})


# ----------------------------------------------------------------------------------------------------------
# params bounds known only once the data is: checked before any work


def test_more_centroids_than_the_tokens_allow_stop_cluster_before_fitting(pipeline_run, tmp_path, capsys):
    line, _ = run_with(tmp_path, pipeline_run, "cluster", {"cluster.bucket_counts": [2, 100000]}, capsys)
    assert line.startswith("error: cluster.bucket_counts = [2, 100000]: 100000 centroids need 39 training")
    assert "allowed: at most" in line


# ----------------------------------------------------------------------------------------------------------
# outputs: a bad path is one line before the work; leftovers of killed runs are swept


def test_an_output_below_a_file_is_one_line(pipeline_run, tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    out = blocker / "projections.safetensors"
    line, err = run_with(tmp_path, pipeline_run, "project", {"project.out": str(out)}, capsys)
    assert line == f"error: project.out = '{out}': {blocker} is a file; allowed: a path below folders only"
    assert err == line  # refused before any training


def test_a_file_output_where_a_folder_stands_is_one_line(tmp_path):
    (tmp_path / "plot.png").mkdir()
    in_the_way = r"cannot write the file .*plot\.png: a folder of that name is in the way"
    with pytest.raises(UserError, match=in_the_way), atomic_path(tmp_path / "plot.png"):
        pass


def test_leftovers_of_dead_runs_are_swept_and_live_ones_kept(tmp_path):
    target = tmp_path / "graphs"
    dead_pid = 2**22 + 12345  # above the default pid_max: no such process
    dead = [tmp_path / f".graphs.tmp-{dead_pid}-abc", tmp_path / f".graphs.old-{dead_pid}"]
    for folder in dead:
        (folder / "inner").mkdir(parents=True)
    legacy = tmp_path / ".graphs.tmp-k2j3h4"  # no pid: written before pids were recorded
    legacy.write_text("x")
    live = tmp_path / f".graphs.tmp-{os.getppid()}-xyz"
    live.mkdir()
    other = tmp_path / f".graphs2.tmp-{dead_pid}-abc"
    other.mkdir()
    with atomic_path(target, directory=True) as tmp:
        (tmp / "done").write_text("ok")
    assert (target / "done").read_text() == "ok"
    assert not any(p.exists() for p in [*dead, legacy])
    assert live.exists() and other.exists()


def test_a_killed_extract_leaves_nothing_behind_after_the_next_run(pipeline_run, tmp_path, capsys):
    params = json.loads(json.dumps(pipeline_run))
    stores = params["extract"]["stores"]
    for store in stores.values():
        store["out"] = str(tmp_path / Path(store["out"]).name)
    params["extract"]["metrics"] = str(tmp_path / "extract.json")
    stale = tmp_path / f".train.tmp-{2**22 + 777}-q1w2"
    (stale / "shard-00000.safetensors").parent.mkdir()
    (stale / "shard-00000.safetensors").write_bytes(b"\0" * 1024)
    with project_folder(tmp_path):
        extract.main(["--params", str(write_params(tmp_path, params))])
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "extract.json", "extract.timings.json", "params.yaml", "test", "train"
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# byte-reproducible outputs: timings live apart from metrics


def test_re_running_extract_and_project_rewrites_identical_bytes(pipeline_run, tmp_path):
    params = json.loads(json.dumps(pipeline_run))
    for store in params["extract"]["stores"].values():
        store["out"] = str(tmp_path / Path(store["out"]).name)
    params["extract"]["metrics"] = str(tmp_path / "extract.json")
    params["project"].update(
        graphs=str(tmp_path / "train"),
        out=str(tmp_path / "projections.safetensors"),
        metrics=str(tmp_path / "project.json"),
        plot=str(tmp_path / "loss.csv"),
    )
    path = write_params(tmp_path, params)
    first = {}
    for run in range(2):
        with project_folder(tmp_path):
            extract.main(["--params", str(path)])
            project.main(["--params", str(path)])
        files = sorted(p for p in tmp_path.rglob("*") if p.is_file() and "timings" not in p.name)
        digest = {str(p.relative_to(tmp_path)): file_sha256(p) for p in files}
        if run == 0:
            first = digest
    assert digest == first and len(digest) > 6
    original = Path(pipeline_run["extract"]["stores"]["train"]["out"])
    # and the same bytes as the module's first extract, in another folder
    assert {p.name: file_sha256(p) for p in (tmp_path / "train").iterdir()} == {
        p.name: file_sha256(p) for p in original.iterdir()
    }
    timings = json.loads(timings_path(tmp_path / "extract.json").read_text())
    assert timings["torch_threads"] == torch.get_num_threads() and timings["train"]["seconds"] >= 0
    assert "seconds" not in json.loads((tmp_path / "extract.json").read_text())["train"]


def test_a_speed_table_on_sentence_pairs_is_refused(pipeline_run, tmp_path, capsys):
    speed = {"contexts": [1024], "methods": ["kmeans"], "recall_target": 0.95, "repeats": 1, "backward": True}
    line, _ = run_with(tmp_path, pipeline_run, "evaluate", {"evaluate.speed": speed}, capsys)
    assert "evaluate.speed.contexts = [1024]" in line and "holds sentence pairs, not long sequences" in line
    assert not (tmp_path / "out").exists()
