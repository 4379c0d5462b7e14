"""Content fingerprints of files and folders (sha256), used in manifests and resume guards."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# sha256 of every file this process has hashed, by (resolved path, size, mtime_ns, inode): a file read by
# several readers (a store's shards, a teacher's weights) is hashed once, a rewritten or replaced one again
_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def cached_file_sha256(path: str | os.PathLike, *, rehash: bool = False) -> str:
    """:func:`file_sha256`, from this process's cache unless ``rehash`` or the file changed since."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if rehash or key not in _DIGESTS:
        _DIGESTS[key] = file_sha256(path)
    return _DIGESTS[key]


def folder_sha256(folder: str | os.PathLike) -> str:
    """Hash of every file's relative path and content, in sorted order (hidden files skipped)."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(file_sha256(path).encode())
    return digest.hexdigest()


def value_sha256(value: Any) -> str:
    """Hash of a JSON-serialisable value (canonical key order)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def tensors_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    """Hash of named tensors: every name, dtype, shape and the raw bytes, in sorted name order.

    Stored in the header of the safetensors files this project writes and checked when they are read, so a
    flipped byte in a tensor is caught where the file is used.
    """
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
