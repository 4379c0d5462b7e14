"""No code from outside the project runs: not a model folder's Python, not weights it points elsewhere, not a
library planted in the native-kernel cache.

A hostile model folder is a tiny checkpoint whose config.json asks transformers to import ``evil.py`` beside
it (``auto_map``, an unknown ``model_type``), with a manifest forged to list every file, so the only thing
between the folder and its code is the refusal under test. Importing ``evil.py`` writes a marker file; every
load path must refuse in one line and leave the marker unwritten, even with stdin answering "y" to
transformers' "trust this code?" prompt.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from attention_kernels import native
from pipeline.attention import load_model
from pipeline.checkpoint import (
    MANIFEST,
    load_auto_tokenizer,
    resolve_checkpoint,
    resolve_outside_checkpoint,
    save_checkpoint,
)
from pipeline.data.tokenizer import load_tokenizer
from pipeline.errors import UserError
from pipeline.fingerprint import file_sha256
from pipeline.models.pretrained import load_pretrained
from tests.stage_runner import run_module
from tests.test_params_errors import assert_user_error, run_stage
from tests.tiny import tiny_marian, word_tokenizer

VOCAB = 20
REFUSED = "allowed: a model transformers ships, whose files name no code of their own"


@pytest.fixture(autouse=True)
def stdin_says_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answer "y" to any prompt, as a user who trusts too quickly would."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 8))


def forge_manifest(folder: Path) -> None:
    """List every file of ``folder`` in its manifest with its sha256, as an attacker would."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"] = {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny α-entmax Marian saved the way the stages save it (manifest included)."""
    folder = tmp_path_factory.mktemp("checkpoint") / "teacher"
    model = tiny_marian(
        vocab=VOCAB, d_model=8, encoder_layers=1, decoder_layers=1, encoder_heads=2, decoder_heads=2
    )
    save_checkpoint(folder, model, word_tokenizer(VOCAB), {"stage": "teacher"})
    return folder


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker") / "evil-code-ran"


def plant_code(folder: Path, marker: Path) -> None:
    """``evil.py`` in ``folder``: importing it writes ``marker``."""
    (folder / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "EvilConfig = EvilModel = EvilTokenizer = None\n"
    )


@pytest.fixture(scope="module")
def hostile(checkpoint: Path, marker: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint with config.json naming ``evil.py``'s classes for an unknown model type."""
    folder = tmp_path_factory.mktemp("hostile") / "model"
    shutil.copytree(checkpoint, folder)
    plant_code(folder, marker)
    evil = {"AutoConfig": "evil.EvilConfig", "AutoModelForSeq2SeqLM": "evil.EvilModel"}
    edit_json(folder / "config.json", model_type="evil", auto_map=evil, architectures=["EvilModel"])
    forge_manifest(folder)
    return folder


@pytest.fixture(scope="module")
def hostile_tokenizer(checkpoint: Path, marker: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint with tokenizer_config.json naming ``evil.py``'s tokenizer class."""
    folder = tmp_path_factory.mktemp("hostile-tokenizer") / "model"
    shutil.copytree(checkpoint, folder)
    plant_code(folder, marker)
    edit_json(
        folder / "tokenizer_config.json",
        tokenizer_class="EvilTokenizer",
        auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]},
    )
    forge_manifest(folder)
    return folder


# ----------------------------------------------------------------------------------------------------------
# a model folder's own code


def test_library_loaders_refuse_the_code(hostile: Path, marker: Path) -> None:
    config = hostile / "config.json"
    for load in (load_model, load_pretrained):
        with pytest.raises(
            UserError, match=f"^{config}: auto_map asks to import code shipped with the model"
        ):
            load(hostile)
    assert not marker.exists()


@pytest.mark.parametrize("loader", [load_tokenizer, load_auto_tokenizer], ids=["corpus", "checkpoint"])
def test_tokenizer_loaders_refuse_the_code(hostile_tokenizer: Path, marker: Path, loader) -> None:
    with pytest.raises(UserError, match=f"^{hostile_tokenizer / 'tokenizer_config.json'}: auto_map asks"):
        loader(hostile_tokenizer)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("stage", "key"),
    [("extract", "extract.teacher"), ("teacher", "teacher.init"), ("pretrain", "pretrain.init")],
)
def test_stages_refuse_the_code(hostile: Path, marker: Path, tmp_path: Path, stage: str, key: str) -> None:
    line = assert_user_error(
        run_stage(stage, tmp_path, {key: str(hostile)}), "auto_map asks", tmp_path / "artifacts"
    )
    assert (
        line
        == f"error: {hostile / 'config.json'}: auto_map asks to import code shipped with the model; {REFUSED}"
    )
    assert not marker.exists()


def test_pretrain_refuses_the_code_of_a_plain_downloaded_folder(hostile: Path, marker: Path, tmp_path: Path):
    """``pretrain.init`` takes a folder without a manifest, but not its code."""
    plain = tmp_path / "downloaded"
    shutil.copytree(hostile, plain)
    (plain / MANIFEST).unlink()
    result = run_stage("pretrain", tmp_path, {"pretrain.init": str(plain)})
    assert_user_error(result, f"{plain / 'config.json'}: auto_map asks", tmp_path / "artifacts")
    assert not marker.exists()


def test_sparsefinder_configure_refuses_the_code(hostile: Path, marker: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_module("pipeline", "configure", hostile, out, "--method", "window", cwd=tmp_path)
    assert_user_error(result, f"{hostile / 'config.json'}: auto_map asks", out)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "evil"}, "model_type 'evil' is not one transformers knows"),
        (
            {"architectures": ["EvilModel"]},
            "architectures names 'EvilModel', not a model class of transformers",
        ),
        (
            {"auto_map": {"AutoConfig": "evil.EvilConfig"}},
            "auto_map asks to import code shipped with the model",
        ),
    ],
    ids=["unknown-model-type", "unknown-architecture", "auto-map-alone"],
)
def test_each_sign_of_foreign_code_is_refused(checkpoint, marker, tmp_path, changes, message) -> None:
    folder = tmp_path / "model"
    shutil.copytree(checkpoint, folder)
    plant_code(folder, marker)
    edit_json(folder / "config.json", **changes)
    forge_manifest(folder)
    with pytest.raises(UserError, match=f"^{folder / 'config.json'}: {message}; {REFUSED}$"):
        load_model(folder)
    assert not marker.exists()


# ----------------------------------------------------------------------------------------------------------
# the manifest vouches for every file that is read


def copy_of(checkpoint: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "teacher"
    shutil.copytree(checkpoint, folder)
    return folder


def test_a_checkpoint_without_its_manifest_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    folder = copy_of(checkpoint, tmp_path)
    (folder / MANIFEST).unlink()
    with pytest.raises(
        UserError, match=f"^{folder}: no manifest.json, so not a checkpoint this pipeline saved"
    ):
        load_model(folder)
    with pytest.raises(UserError, match="allowed: the folder the teacher stage writes"):
        resolve_checkpoint(str(folder), "extract.teacher", writer="teacher")
    assert resolve_outside_checkpoint(str(folder), "pretrain.init") == str(folder)  # the one outside entry


@pytest.mark.parametrize("name", ["extra.py", "model.safetensors.index.json"])
def test_an_unlisted_file_is_refused(checkpoint: Path, tmp_path: Path, name: str) -> None:
    folder = copy_of(checkpoint, tmp_path)
    (folder / name).write_text("{}")
    with pytest.raises(
        UserError, match=f"^{folder / name} is not listed in {folder / MANIFEST}; allowed: only"
    ):
        load_model(folder)


def test_a_weight_index_pointing_outside_is_refused(checkpoint, tmp_path, monkeypatch) -> None:
    """Even listed in a forged manifest, an index may name only files of the folder; the weights outside it
    are never read."""
    folder = copy_of(checkpoint, tmp_path)
    outside = tmp_path / "elsewhere" / "model.safetensors"
    outside.parent.mkdir()
    shutil.copy(folder / "model.safetensors", outside)
    shard = os.path.relpath(outside, folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": shard}}))
    forge_manifest(folder)
    read = []
    monkeypatch.setattr("pipeline.attention.loading.load_file", lambda path, *a, **k: read.append(path))
    with pytest.raises(
        UserError, match=f"weight_map names the shard {shard!r}; allowed: the name of a file in"
    ):
        load_model(folder)
    (folder / MANIFEST).unlink()  # a plain folder for pretrain.init: the same rule
    with pytest.raises(UserError, match=f"weight_map names the shard {shard!r}"):
        resolve_outside_checkpoint(str(folder), "pretrain.init")
    assert read == []


def test_a_symbolic_link_out_of_the_folder_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    folder = copy_of(checkpoint, tmp_path)
    outside = tmp_path / "tokenizer.json"
    shutil.move(folder / "tokenizer.json", outside)
    (folder / "tokenizer.json").symlink_to(outside)  # same bytes, so its sha256 still matches
    with pytest.raises(UserError, match=f"^{folder / 'tokenizer.json'} is a symbolic link; allowed in"):
        load_model(folder)


def test_a_sub_folder_or_a_manifest_without_files_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    folder = copy_of(checkpoint, tmp_path)
    (folder / "nested").mkdir()
    with pytest.raises(UserError, match=f"^{folder / 'nested'} is not a plain file"):
        load_model(folder)
    (folder / "nested").rmdir()
    manifest = json.loads((folder / MANIFEST).read_text())
    del manifest["files"]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=f"^{folder / MANIFEST}: 'files' must map every file"):
        load_model(folder)


# ----------------------------------------------------------------------------------------------------------
# the native-kernel cache

COMPILER = os.environ.get("CXX") or "c++"


@pytest.mark.skipif(shutil.which(COMPILER) is None, reason="no C++ compiler")
def test_a_planted_library_is_rebuilt_and_a_shared_cache_is_not_trusted(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPARSEFINDER_NATIVE_CACHE", str(cache))
    target, record, key = native.cache_entry("block_products", COMPILER)
    cache.mkdir(mode=0o700)
    target.write_bytes(b"\x7fELF planted, not built here")  # under the exact name the loader looks for
    planted = file_sha256(target)
    native.library.cache_clear()
    try:
        assert native.library("block_products") is not None
        rebuilt = file_sha256(target)
        assert rebuilt != planted
        assert (
            json.loads(record.read_text())["sha256"] == rebuilt
            and json.loads(record.read_text())["key"] == key
        )

        cache.chmod(0o770)  # others in the group could swap the library between its check and its loading
        native.library.cache_clear()
        with pytest.warns(UserWarning, match=f"the kernel cache {cache} is not yours alone"):
            assert native.library("block_products") is None
        assert file_sha256(target) == rebuilt
    finally:
        native.library.cache_clear()
