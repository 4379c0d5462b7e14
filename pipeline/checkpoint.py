"""Checkpoints: Hugging Face model folders that describe themselves.

A checkpoint folder holds config.json, model.safetensors, generation_config.json, the tokenizer files and
``manifest.json``: architecture, attention implementation, α, the params that made it, and fingerprints of
its data and parent checkpoint. Folders are written under a temporary name and renamed, so an interrupted
save never leaves a folder that looks whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.atomic import atomic_path
from pipeline.errors import UserError
from pipeline.fingerprint import cached_file_sha256, file_sha256

MANIFEST = "manifest.json"
# weight files a local checkpoint folder may hold: one file, or the index of a sharded one
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def save_checkpoint(
    folder: str | os.PathLike,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    manifest: dict[str, Any],
) -> None:
    """Save model + tokenizer + manifest as one atomic folder (safetensors only); non-finite weights (a
    diverged run) are refused."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise UserError(f"refusing to save {folder}: the weight {name} holds non-finite values")
    with atomic_path(folder, directory=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
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


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a checkpoint folder, or ``{}`` for a plain Hugging Face folder or hub id."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise UserError(f"{path}: not a readable JSON manifest ({err})") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path}: a checkpoint manifest must be a JSON object")
    return manifest


def verify_checkpoint(folder: str | os.PathLike) -> None:
    """Check a local checkpoint's files against the sha256 its manifest recorded when it was saved: every
    file under ``files`` (only model.safetensors, ``model_sha256``, in older manifests).

    A plain Hugging Face folder (no manifest) has nothing to check against and passes.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    recorded = manifest.get("files")
    if recorded is None and "model_sha256" in manifest:
        recorded = {WEIGHTS[0]: manifest["model_sha256"]}
    if not isinstance(recorded, dict):
        if recorded is not None:
            raise UserError(f"{folder / MANIFEST}: 'files' must map file names to sha256")
        return
    for name, sha256 in sorted(recorded.items()):
        path = folder / name
        if Path(name).name != name or name in ("", ".", ".."):
            raise UserError(f"{folder / MANIFEST}: files names {name!r}, not a file of the checkpoint folder")
        if not path.is_file():
            raise UserError(f"{path} is missing though {folder / MANIFEST} lists it; re-run the stage")
        if cached_file_sha256(path) != sha256:
            raise UserError(
                f"{path} does not match the sha256 in {folder / MANIFEST} (corrupt or changed since it was "
                "saved); re-run the stage that wrote it"
            )


def describe_parent(source: str) -> dict[str, Any]:
    """Identify the checkpoint a stage started from: its path or id, and its weights' hash when local."""
    weights = Path(source) / "model.safetensors"
    return {"source": source, "model_sha256": file_sha256(weights) if weights.is_file() else None}


def resolve_checkpoint(source: str, key: str, *, local: bool = False) -> str:
    """Check that ``source`` names a local model folder or looks like a hub id (``org/name``).

    With ``local``, only a folder holding config.json and safetensors weights will do. A local folder's
    weights are checked against its manifest (:func:`verify_checkpoint`).
    """
    path = Path(source)
    if (path / "config.json").is_file():
        if local and not any((path / name).is_file() for name in WEIGHTS):
            raise UserError(f"{key} = {source!r}: no {WEIGHTS[0]} in that model folder")
        verify_checkpoint(path)
        return source
    if local:
        raise UserError(f"{key} = {source!r}: not a local model folder (need config.json and {WEIGHTS[0]})")
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
