"""Params that pass the schema but fail on the data or on a checkpoint: one line, exit 2, nothing written.

Every test runs a stage (in this process, :func:`tests.stage_runner.run_module`) with the micro profile
changed in one key. Stages run in a temporary folder, so the profile's relative output paths land there;
inputs point at a tiny prepared corpus and a tiny α-entmax Marian checkpoint built once per module. One
case runs ``python -m stages.pretrain`` as a process of its own, for the entry point itself.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import MarianConfig, MarianMTModel

from pipeline.attention import ENTMAX
from pipeline.checkpoint import MANIFEST, save_checkpoint
from pipeline.data.corpus import build_corpus
from pipeline.data.tokenizer import load_tokenizer
from pipeline.errors import UserError
from pipeline.params.sections import load_section
from tests.stage_runner import run_module

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "configs" / "micro.yaml"
TEACHER_POSITIONS = 32


def sentences(seed: int, words: list[str], count: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(3, 10))) for _ in range(count)]


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two aligned text files of 80 short lines each (a ``prepare.text`` section)."""
    folder = tmp_path_factory.mktemp("texts")
    source = sentences(0, ["the", "light", "water", "earth", "day", "night", "said", "good", "was"], 80)
    target = sentences(1, ["la", "luz", "agua", "tierra", "día", "noche", "dijo", "buena", "era"], 80)
    paths = {"source_file": folder / "src.txt", "target_file": folder / "tgt.txt"}
    paths["source_file"].write_text("\n".join(source) + "\n")
    paths["target_file"].write_text("\n".join(target) + "\n")
    return {key: str(path) for key, path in paths.items()}


@pytest.fixture(scope="module")
def corpus(texts: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared corpus (DatasetDict + tokenizer) built from :func:`texts`."""
    out = tmp_path_factory.mktemp("prepared") / "data"
    build_corpus(
        out, source="text", source_options=texts, vocab_size=100, valid_fraction=0.2, test_fraction=0.2
    )
    return out


def save_tiny_teacher(corpus: Path, folder: Path) -> Path:
    """A random α-entmax Marian over ``corpus``'s tokenizer: 1 encoder and 2 decoder layers, 32 positions,
    saved to ``folder`` as the teacher stage saves it (with its manifest)."""
    tokenizer = load_tokenizer(corpus / "tokenizer")
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=len(tokenizer),
        decoder_vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=TEACHER_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    config.entmax_alpha = 1.5
    model = MarianMTModel._from_config(config, attn_implementation=ENTMAX)
    save_checkpoint(folder, model, tokenizer, {"stage": "teacher"})
    return folder


@pytest.fixture(scope="module")
def teacher(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`save_tiny_teacher` over :func:`corpus`."""
    return save_tiny_teacher(corpus, tmp_path_factory.mktemp("teacher") / "model")


# a value in ``changes`` that deletes its key instead of setting it
REMOVE = object()


def params_file(folder: Path, changes: dict[str, Any]) -> Path:
    """The micro profile with ``changes`` (dotted keys like ``extract.min_length``; a value of
    :data:`REMOVE` deletes the key) written to ``folder``."""
    params = yaml.safe_load(MICRO.read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        section = params
        for name in parents:
            section = section.setdefault(name, {})
        if value is REMOVE:
            del section[key]
        else:
            section[key] = value
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def run_stage(stage: str, folder: Path, changes: dict[str, Any], *args: str) -> subprocess.CompletedProcess:
    """``python -m stages.STAGE ARGS --params FILE`` in ``folder``, with the micro profile changed by
    ``changes`` (run in this process, offline)."""
    path = params_file(folder, changes)
    return run_module(f"stages.{stage}", *args, "--params", str(path), cwd=folder)


def assert_user_error(result: subprocess.CompletedProcess, key: str, unwritten: Path) -> str:
    """Exit 2, one stderr line ``error: ...`` naming ``key``, no traceback, ``unwritten`` absent."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: ") and key in lines[0], lines[0]
    assert not unwritten.exists()
    return lines[0]


# ----------------------------------------------------------------------------------------------------------
# caught by the schema (so `sparsefinder params` catches them too)


@pytest.mark.parametrize(
    ("stage", "changes", "expected", "out"),
    [
        (
            "pretrain",
            {"pretrain.train.seed": -1},
            "pretrain.train.seed = -1: Input should be greater than or equal to 0",
            "artifacts/models/pretrain",
        ),
        (
            "teacher",
            {"teacher.train.seed": 2**32},
            f"teacher.train.seed = {2**32}: Input should be less than {2**32}",
            "artifacts/models/teacher",
        ),
        (
            "extract",
            {"extract.seed": -1},
            "extract.seed = -1: Input should be greater than or equal to 0",
            "artifacts/graphs",
        ),
        (
            "extract",
            {"extract.stores.test.split": "train"},
            "extract: stores 'train' and 'test' both read the train split; allowed: one store per split",
            "artifacts/graphs",
        ),
        (
            "extract",
            {"extract.stores.test.out": "artifacts/graphs/train/held-out"},
            "extract: stores 'train' and 'test' write overlapping folders (artifacts/graphs/train and "
            "artifacts/graphs/train/held-out)",
            "artifacts/graphs",
        ),
        (
            "teacher",
            {"teacher.alpha": 1.0, "teacher.learn_alpha": True},
            "teacher: learn_alpha = true needs alpha > 1 to start from, got alpha = 1.0",
            "artifacts/models/teacher",
        ),
        (
            "pretrain",
            {"pretrain.eval.max_new_tokens": 200},
            "pretrain: eval.max_new_tokens = 200 exceeds model.max_positions = 128",
            "artifacts/models/pretrain",
        ),
    ],
    ids=[
        "pretrain-seed",
        "teacher-seed",
        "extract-seed",
        "extract-same-split",
        "extract-nested-outs",
        "learned-alpha",
        "max-new-tokens",
    ],
)
def test_schema_rejects(tmp_path: Path, stage: str, changes: dict, expected: str, out: str) -> None:
    assert expected in assert_user_error(run_stage(stage, tmp_path, changes), expected, tmp_path / out)


@pytest.mark.parametrize(
    ("section", "key"),
    [("prepare", "split_seed"), ("project", "seed"), ("cluster", "seed")],
)
def test_every_seed_is_non_negative(tmp_path: Path, section: str, key: str) -> None:
    path = params_file(tmp_path, {f"{section}.{key}": -1})
    with pytest.raises(UserError, match=f"{section}.{key} = -1: Input should be greater than or equal to 0"):
        load_section(section, path)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"extract.stores": {}}, "extract.stores = {}: Dictionary should have at least 1 item"),
        (
            {"extract.stores.test.split": "dev"},
            "extract.stores.test.split = 'dev': Input should be 'train', 'valid' or 'test'",
        ),
        (
            {"extract.stores.test.split": "valid", "extract.stores.test.out": "artifacts/graphs/train"},
            "extract: stores 'train' and 'test' write overlapping folders",
        ),
        (
            {"extract.stores.test.out": "artifacts/graphs"},
            "extract: stores 'train' and 'test' write overlapping folders (artifacts/graphs/train and "
            "artifacts/graphs)",
        ),
        (
            {"extract.stores.held-out": {"split": "valid", "out": "artifacts/graphs/valid"}},
            "extract: store name 'held-out' is not a simple identifier",
        ),
        ({"extract.stores.test.max_sentences": 0}, "extract.stores.test.max_sentences = 0: Input should be"),
        ({"extract.stores.test.outt": "x"}, "extract.stores.test.outt: unknown key"),
    ],
    ids=["no-store", "unknown-split", "same-out", "out-inside", "store-name", "max-sentences", "typo"],
)
def test_extract_stores_schema(tmp_path: Path, changes: dict, expected: str) -> None:
    path = params_file(tmp_path, changes)
    with pytest.raises(UserError) as err:
        load_section("extract", path)
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


# ----------------------------------------------------------------------------------------------------------
# prepare


def test_prepare_length_filter_drops_every_pair(tmp_path: Path, texts: dict) -> None:
    changes = {"prepare.source": "text", "prepare.text": texts, "prepare.min_length": 60}
    line = assert_user_error(
        run_stage("prepare", tmp_path, changes), "prepare.min_length = 60", tmp_path / "artifacts/data"
    )
    assert "the length filter dropped all" in line and "too_short" in line
    assert not (tmp_path / "artifacts/metrics/prepare.json").exists()


def test_prepare_empty_valid_split(tmp_path: Path, texts: dict) -> None:
    changes = {"prepare.source": "text", "prepare.text": texts, "prepare.valid_fraction": 0.0}
    line = assert_user_error(
        run_stage("prepare", tmp_path, changes), "prepare.valid_fraction = 0.0", tmp_path / "artifacts/data"
    )
    assert "the valid split of 80 pairs is empty" in line


# ----------------------------------------------------------------------------------------------------------
# pretrain and teacher


def test_pretrain_data_missing(tmp_path: Path) -> None:
    result = run_stage("pretrain", tmp_path, {"pretrain.data": str(tmp_path / "nowhere")})
    line = assert_user_error(result, "pretrain.data = ", tmp_path / "artifacts/models/pretrain")
    assert "no prepared corpus there" in line


def test_pretrain_init_missing_folder(tmp_path: Path, corpus: Path) -> None:
    changes = {"pretrain.data": str(corpus), "pretrain.init": "artifacts/models/nothing"}
    line = assert_user_error(
        run_stage("pretrain", tmp_path, changes), "pretrain.init = ", tmp_path / "artifacts/models/pretrain"
    )
    assert "not a model folder" in line


def test_pretrain_init_unknown_hub_id(tmp_path: Path, corpus: Path) -> None:
    changes = {"pretrain.data": str(corpus), "pretrain.init": "nobody-here/no-such-model"}
    line = assert_user_error(
        run_stage("pretrain", tmp_path, changes),
        "pretrain.init = 'nobody-here/no-such-model': cannot load it",
        tmp_path / "artifacts/models/pretrain",
    )
    assert "huggingface.co" in line


def test_pretrain_positions_shorter_than_the_corpus(tmp_path: Path, corpus: Path) -> None:
    changes = {
        "pretrain.data": str(corpus),
        "pretrain.model.max_positions": 4,
        "pretrain.eval.max_new_tokens": 4,
    }
    line = assert_user_error(
        run_stage("pretrain", tmp_path, changes),
        "pretrain.model.max_positions = 4",
        tmp_path / "artifacts/models/pretrain",
    )
    assert "holds sequences of up to" in line and not (tmp_path / "artifacts/runs").exists()


def forbid_loading_weights(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> None:
    """Make ``module.name`` (the stage's weight loader) fail the test: a check that needs no weights must
    stop the stage before any are read."""

    def loaded(*args, **kwargs):
        raise AssertionError(f"{module}.{name} loaded weights before the check")

    monkeypatch.setattr(importlib.import_module(module), name, loaded)


@pytest.mark.parametrize("stage", ["pretrain", "teacher"])
def test_generation_longer_than_the_init_positions(
    tmp_path: Path, corpus: Path, teacher: Path, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_loading_weights(monkeypatch, f"stages.{stage}", "load_pretrained")
    changes = {
        f"{stage}.data": str(corpus),
        f"{stage}.init": str(teacher),
        f"{stage}.eval.max_new_tokens": 100,
    }
    line = assert_user_error(
        run_stage(stage, tmp_path, changes),
        f"{stage}.eval.max_new_tokens = 100",
        tmp_path / f"artifacts/models/{stage}",
    )
    assert f"has {TEACHER_POSITIONS} positions; allowed: at most {TEACHER_POSITIONS}" in line
    assert not (tmp_path / "artifacts/runs").exists()


def test_pretrain_entry_point_prints_nothing_but_the_error(
    tmp_path: Path, corpus: Path, teacher: Path
) -> None:
    """A real ``python -m stages.pretrain`` process, unlike every other case here: it covers the module's
    own entry point, and its stderr is all the process printed from start to exit (imports, loading the
    corpus and a checkpoint, the libraries' loggers), which an in-process run can only approximate."""
    changes = {
        "pretrain.data": str(corpus),
        "pretrain.init": str(teacher),
        "pretrain.eval.max_new_tokens": 100,
    }
    path = params_file(tmp_path, changes)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        # bars report work done before the check, not an error
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "stages.pretrain", "--params", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    line = assert_user_error(
        result, "pretrain.eval.max_new_tokens = 100", tmp_path / "artifacts/models/pretrain"
    )
    assert f"has {TEACHER_POSITIONS} positions" in line and not (tmp_path / "artifacts/runs").exists()


def test_teacher_data_missing(tmp_path: Path, teacher: Path) -> None:
    changes = {"teacher.init": str(teacher), "teacher.data": str(tmp_path / "nowhere")}
    assert_user_error(
        run_stage("teacher", tmp_path, changes), "teacher.data = ", tmp_path / "artifacts/models/teacher"
    )


def test_teacher_init_must_be_the_pretrain_stages_folder(tmp_path: Path, corpus: Path) -> None:
    """Only ``pretrain.init`` takes a model from outside the pipeline (a hub id or a downloaded folder)."""
    changes = {"teacher.data": str(corpus), "teacher.init": "nobody-here/no-such-model"}
    assert_user_error(
        run_stage("teacher", tmp_path, changes),
        "teacher.init = 'nobody-here/no-such-model': not a local model folder (need config.json and "
        "model.safetensors); allowed: the folder the pretrain stage writes",
        tmp_path / "artifacts/models/teacher",
    )


# ----------------------------------------------------------------------------------------------------------
# extract


@pytest.mark.parametrize("store", ["train", "test"])
def test_extract_min_length_beyond_every_sentence(
    tmp_path: Path, corpus: Path, teacher: Path, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every store is checked before any is written, and before the teacher's weights are read: a bad
    held-out store leaves no training store."""
    forbid_loading_weights(monkeypatch, "stages.extract", "load_model")
    changes = {
        "extract.data": str(corpus),
        "extract.teacher": str(teacher),
        f"extract.stores.{store}.min_length": 500,
    }
    line = assert_user_error(
        run_stage("extract", tmp_path, changes),
        f"extract.stores.{store}.min_length = 500: no sentence of the {store} split has 500 target tokens; "
        "the longest has",
        tmp_path / "artifacts/graphs",
    )
    assert int(line.rsplit(" ", 1)[1]) <= TEACHER_POSITIONS


def test_extract_kinds_of_different_shapes(
    tmp_path: Path, corpus: Path, teacher: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_loading_weights(monkeypatch, "stages.extract", "load_model")
    changes = {
        "extract.data": str(corpus),
        "extract.teacher": str(teacher),
        "extract.kinds": ["decoder_self", "encoder_self"],
    }
    line = assert_user_error(
        run_stage("extract", tmp_path, changes),
        "extract.kinds = ['decoder_self', 'encoder_self']: the teacher's kinds differ in shape",
        tmp_path / "artifacts/graphs",
    )
    assert "decoder_self 2 layers" in line and "encoder_self 1 layers" in line


@pytest.mark.parametrize("where", ["hub-id", "no-weights"])
def test_extract_teacher_must_be_a_local_checkpoint(
    tmp_path: Path, corpus: Path, teacher: Path, where: str
) -> None:
    if where == "hub-id":
        source = "nobody-here/no-such-model"
    else:
        source = str(tmp_path / "config-only")
        Path(source).mkdir()
        (Path(source) / "config.json").write_text((teacher / "config.json").read_text())
    changes = {"extract.data": str(corpus), "extract.teacher": source}
    line = assert_user_error(
        run_stage("extract", tmp_path, changes),
        f"extract.teacher = {source!r}",
        tmp_path / "artifacts/graphs",
    )
    assert "model.safetensors" in line


def test_extract_data_missing(tmp_path: Path, teacher: Path) -> None:
    changes = {"extract.teacher": str(teacher), "extract.data": str(tmp_path / "nowhere")}
    assert_user_error(
        run_stage("extract", tmp_path, changes), "extract.data = ", tmp_path / "artifacts/graphs"
    )


# ----------------------------------------------------------------------------------------------------------
# students


def test_student_instance_must_be_listed(tmp_path: Path) -> None:
    result = run_stage("student", tmp_path, {}, "nope")
    assert_user_error(
        result, "student.instances has no entry 'nope'; allowed: sparsefinder, ssa", tmp_path / "artifacts"
    )


def test_students_need_their_own_outputs(tmp_path: Path) -> None:
    result = run_stage(
        "student", tmp_path, {"student.instances.ssa.out": "artifacts/students/sparsefinder"}, "ssa"
    )
    assert_user_error(result, "two students share one out path", tmp_path / "artifacts")


def test_student_init_must_come_from_the_pipeline(tmp_path: Path, corpus: Path, teacher: Path) -> None:
    plain = tmp_path / "plain"  # the teacher's files as a plain Hugging Face folder
    shutil.copytree(teacher, plain)
    (plain / MANIFEST).unlink()
    changes = {
        "student.data": str(corpus),
        "student.teacher": str(teacher),
        "student.instances.ssa.init": str(plain),
    }
    result = run_stage("student", tmp_path, changes, "ssa")
    line = assert_user_error(result, f"student.instances.ssa.init = {str(plain)!r}", tmp_path / "artifacts")
    assert f"no {MANIFEST} there, so not a checkpoint this pipeline wrote" in line
    assert "allowed: the folder the teacher stage writes" in line
