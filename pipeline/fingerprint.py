"""Content fingerprints of files and folders (sha256), used in manifests and resume guards."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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
