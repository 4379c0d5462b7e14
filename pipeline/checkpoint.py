"""Checkpoints: Hugging Face model folders that describe themselves.

A checkpoint folder holds config.json (with the attention implementation the model runs, which
``save_pretrained`` leaves out: :func:`record_attention`), model.safetensors, generation_config.json, the
tokenizer files and ``manifest.json``: architecture, attention implementation, α, the params that made it,
fingerprints of its data and parent checkpoint, and the sha256 of every other file. Folders are written
under a temporary name and renamed, so an interrupted save never leaves a folder that looks whole.

Loading runs no code from a checkpoint: every ``transformers`` load passes ``trust_remote_code=False``, and
:func:`refuse_foreign_code` refuses beforehand, in one line, files that ask for code of their own (an
``auto_map``) or name a model or tokenizer ``transformers`` does not ship.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
from transformers.utils import cached_file

from pipeline.atomic import atomic_path
from pipeline.errors import UserError
from pipeline.fingerprint import cached_file_sha256, file_sha256
from pipeline.finite import first_non_finite

MANIFEST = "manifest.json"
# weight files a local checkpoint folder may hold: one file, or the index of a sharded one
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
# the files through which transformers would import code shipped with a model or tokenizer
CODE_FILES = ("config.json", "tokenizer_config.json")
# what every stage that saves a checkpoint is, for a message about a folder none of them wrote
WRITERS = "pretrain, teacher, configure, par_search or a student stage"


def seed_path(folder: str | os.PathLike, seed: int) -> Path:
    """Where inside ``folder`` (a stage's ``out`` or ``run_dir``) the model trained with ``seed`` lies: a
    stage that trains once per seed (``student@NAME``) writes one model folder per seed there."""
    return Path(folder) / f"seed-{seed}"


def save_checkpoint(
    folder: str | os.PathLike,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    manifest: dict[str, Any],
    extra_files: Mapping[str, str] | None = None,
) -> None:
    """Save model + tokenizer (None: a model folder without one) + manifest as one atomic folder
    (safetensors only), with ``extra_files`` (name → text: a task's card) beside them, listed in the
    manifest like the rest; non-finite weights (a diverged run) are refused."""
    if (name := first_non_finite(model.state_dict())) is not None:
        raise UserError(f"refusing to save {folder}: the weight {name} holds non-finite values")
    with atomic_path(folder, directory=True) as tmp:
        model.save_pretrained(tmp)
        record_attention(Path(tmp) / "config.json", model.config._attn_implementation)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (Path(tmp) / name).write_text(text)
        config = model.config
        described = {
            "architecture": type(model).__name__,
            "attn_implementation": config._attn_implementation,
            "entmax_alpha": getattr(config, "entmax_alpha", None),
            "model_sha256": file_sha256(Path(tmp) / "model.safetensors"),
            # CPU results are bit-identical for a given machine and thread count, so record the count
            "torch_threads": torch.get_num_threads(),
            # every file of the folder, so a changed config or tokenizer is caught like changed weights
            "files": {path.name: file_sha256(path) for path in sorted(Path(tmp).iterdir())},
            **manifest,
        }
        (Path(tmp) / MANIFEST).write_text(json.dumps(described, indent=2) + "\n")


def record_attention(config_file: Path, implementation: str | None) -> None:
    """Write the attention implementation a model runs into its config.json, which ``save_pretrained``
    leaves out: ``from_pretrained`` reads ``attn_implementation`` from there, so the folder reloads with
    the attention it was saved with, or, where that implementation is not registered (the process did not
    import it), refuses to load, instead of silently computing SDPA softmax."""
    if implementation is None:
        return
    config = json.loads(config_file.read_text())
    config["attn_implementation"] = implementation
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a checkpoint folder, or ``{}`` for a plain Hugging Face folder or hub id."""
    path = Path(folder) / MANIFEST
    return _json_object(path) if path.is_file() else {}


def verify_checkpoint(folder: str | os.PathLike) -> None:
    """Check a checkpoint folder against its manifest: ``files`` lists every file of the folder but the
    manifest itself, with the sha256 it had when saved, and the folder holds nothing else (no unlisted file,
    no symbolic link, no sub-folder), so nothing is read that the manifest does not vouch for. The shards
    a weight index names must be listed files of the folder.

    A folder without a manifest is refused: only :func:`resolve_outside_checkpoint` takes one.
    """
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise UserError(
            f"{folder}: no {MANIFEST}, so not a checkpoint this pipeline saved; allowed: a model folder the "
            f"{WRITERS} wrote (re-run it)"
        )
    manifest = read_manifest(folder)
    recorded = manifest.get("files")
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        raise UserError(
            f"{folder / MANIFEST}: 'files' must map every file of the folder to its sha256; re-run the stage "
            "that wrote it"
        )
    for name in recorded:
        if Path(name).name != name or name in ("", ".", ".."):
            raise UserError(f"{folder / MANIFEST}: files names {name!r}, not a file of the checkpoint folder")
    for path in sorted(folder.iterdir()):
        if path.is_symlink():
            raise UserError(
                f"{path} is a symbolic link; allowed in a checkpoint folder: plain files only (with DVC, "
                "cache.type reflink, hardlink or copy)"
            )
        if not path.is_file():
            raise UserError(f"{path} is not a plain file; allowed in a checkpoint folder: plain files only")
        if path.name != MANIFEST and path.name not in recorded:
            raise UserError(
                f"{path} is not listed in {folder / MANIFEST}; allowed: only the files the checkpoint was "
                "saved with (remove it, or re-run the stage that wrote the folder)"
            )
    for name, sha256 in sorted(recorded.items()):
        path = folder / name
        if not path.is_file():
            raise UserError(f"{path} is missing though {folder / MANIFEST} lists it; re-run the stage")
        if cached_file_sha256(path) != sha256:
            raise UserError(
                f"{path} does not match the sha256 in {folder / MANIFEST} (corrupt or changed since it was "
                "saved); re-run the stage that wrote it"
            )
    _check_weight_index(folder, set(recorded))


def _check_weight_index(folder: Path, allowed: set[str]) -> None:
    """Refuse a weight index (``model.safetensors.index.json``) whose shards are not files in ``allowed``
    (plain names of files in ``folder``): a shard path may not lead out of the folder."""
    index = folder / WEIGHTS[1]
    if not index.is_file():
        return
    weight_map = _json_object(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise UserError(f"{index}: 'weight_map' must map tensor names to shard files of {folder}")
    for shard in sorted(set(map(str, weight_map.values()))):
        if Path(shard).name != shard or shard in ("", ".", "..") or shard not in allowed:
            raise UserError(
                f"{index}: weight_map names the shard {shard!r}; allowed: the name of a file in {folder}"
                + (f" listed in its {MANIFEST}" if (folder / MANIFEST).is_file() else "")
            )


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; a one-line UserError for anything else."""
    try:
        content = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise UserError(f"{path}: not a readable JSON file ({' '.join(str(err).split())})") from None
    if not isinstance(content, dict):
        raise UserError(f"{path}: must hold a JSON object")
    return content


def _model_file(source: str | os.PathLike, name: str) -> Path | None:
    """The file ``name`` of a local model folder, or of a hub repository as transformers downloads it
    (None when there is no such file, or the hub cannot be reached: the load itself then reports)."""
    if Path(source).is_dir():
        path = Path(source) / name
        return path if path.is_file() else None
    resolved = cached_file(
        os.fspath(source),
        name,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
    return None if resolved is None else Path(resolved)


def refuse_foreign_code(source: str | os.PathLike) -> None:
    """Refuse a model folder or hub id whose files would have transformers import code shipped with them.

    ``trust_remote_code=False`` (passed on every load) already stops that, but with a traceback, or a
    prompt when the flag is left out; this refuses in one line, before anything is loaded: an ``auto_map``
    in config.json or tokenizer_config.json, and a ``model_type``, an architecture or a tokenizer class
    that transformers does not ship (it could only come with code of its own).
    """
    shipped = "allowed: a model transformers ships, whose files name no code of their own"
    for name in CODE_FILES:
        path = _model_file(source, name)
        if path is None:
            continue
        content = _json_object(path)
        if "auto_map" in content:
            raise UserError(f"{path}: auto_map asks to import code shipped with the model; {shipped}")
        if name == "config.json":
            model_type = content.get("model_type")
            if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
                raise UserError(f"{path}: model_type {model_type!r} is not one transformers knows; {shipped}")
            for architecture in content.get("architectures") or []:
                known = getattr(transformers, str(architecture), None)
                if not (isinstance(known, type) and issubclass(known, PreTrainedModel)):
                    raise UserError(
                        f"{path}: architectures names {architecture!r}, not a model class of transformers; "
                        f"{shipped}"
                    )
        tokenizer_class = content.get("tokenizer_class") if name == "tokenizer_config.json" else None
        if tokenizer_class is not None and not any(
            tokenizer_class_from_name(candidate) is not None
            for candidate in (str(tokenizer_class), f"{tokenizer_class}Fast")
        ):
            raise UserError(
                f"{path}: tokenizer_class {tokenizer_class!r} is not one transformers knows; {shipped}"
            )


def load_config(source: str | os.PathLike) -> PretrainedConfig:
    """The config of a model folder or hub id, read without running any code it ships."""
    refuse_foreign_code(source)
    return AutoConfig.from_pretrained(source, trust_remote_code=False)


def load_auto_tokenizer(source: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder, tokenizer folder or hub id, loaded without running any code it
    ships."""
    refuse_foreign_code(source)
    return AutoTokenizer.from_pretrained(source, trust_remote_code=False)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""A model folder holds a tokenizer when it has one of these (every tokenizer ``save_pretrained`` writes
tokenizer_config.json)."""


def folder_tokenizer(folder: str | os.PathLike) -> PreTrainedTokenizerBase | None:
    """The tokenizer of a local model folder (:func:`load_auto_tokenizer`), or None when it holds none: a
    model saved without one is configured and copied without one, not refused."""
    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        return None
    return load_auto_tokenizer(folder)


def describe_parent(source: str) -> dict[str, Any]:
    """Identify the checkpoint a stage started from: its path or id, and its weights' hash when local."""
    weights = Path(source) / "model.safetensors"
    # cached: the stage's checks verified (hashed) this folder a moment ago
    return {"source": source, "model_sha256": cached_file_sha256(weights) if weights.is_file() else None}


def resolve_checkpoint(source: str, key: str, *, writer: str) -> str:
    """Check that ``source`` is a checkpoint this pipeline wrote: a local folder with config.json,
    safetensors weights and its manifest, every file as saved (:func:`verify_checkpoint`), running no code
    (:func:`refuse_foreign_code`). ``writer`` names the stage(s) that write it, for the message.
    """
    path = Path(source)
    if not (path / "config.json").is_file():
        raise UserError(
            f"{key} = {source!r}: not a local model folder (need config.json and {WEIGHTS[0]}); allowed: "
            f"the folder the {writer} stage writes"
        )
    if not any((path / name).is_file() for name in WEIGHTS):
        raise UserError(f"{key} = {source!r}: no {WEIGHTS[0]} in that model folder")
    if not (path / MANIFEST).is_file():
        raise UserError(
            f"{key} = {source!r}: no {MANIFEST} there, so not a checkpoint this pipeline wrote; allowed: the "
            f"folder the {writer} stage writes (re-run it)"
        )
    verify_checkpoint(path)
    refuse_foreign_code(path)
    return source


def resolve_outside_checkpoint(source: str, key: str) -> str:
    """Check that ``source`` names a Hugging Face model folder or looks like a hub id (``org/name``): the
    one entry for a model from outside the pipeline (``pretrain.init``).

    A folder with a manifest is verified like any checkpoint; a plain downloaded one has no manifest to
    check against, but its weight index must stay inside it and it must run no code of its own.
    """
    path = Path(source)
    if (path / "config.json").is_file():
        if (path / MANIFEST).is_file():
            verify_checkpoint(path)
        else:
            # a download's files may be links into the hub's cache; their names must still be the folder's
            _check_weight_index(path, {p.name for p in path.iterdir() if p.is_file()})
        refuse_foreign_code(path)
        return source
    if path.exists() or source.startswith((".", "/", "artifacts")) or source.count("/") != 1:
        raise UserError(
            f"{key} = {source!r}: not a model folder (need config.json there) nor a hub id like 'org/name'"
        )
    return source


@contextmanager
def loading(source: str, key: str) -> Iterator[None]:
    """Turn an error loading ``source`` (unknown hub id, no network, missing or unreadable file) into a
    one-line UserError."""
    try:
        yield
    except (OSError, SafetensorError) as err:
        reason = " ".join(str(err).split())
        raise UserError(f"{key} = {source!r}: cannot load it ({reason})") from None
