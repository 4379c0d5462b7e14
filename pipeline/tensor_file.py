"""Self-verifying safetensors files: named tensors plus one JSON header that holds their hash.

The projections and the predictor states are such files. The header is canonical JSON under one metadata
key (one key, because safetensors writes its metadata map in no fixed order), so equal content gives equal
bytes. Writing refuses non-finite tensors (a diverged fit is an error, not an artifact); reading checks the
hash, so a flipped byte stops the stage that reads the file, with one line naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from pipeline.atomic import atomic_path
from pipeline.errors import UserError
from pipeline.fingerprint import tensors_sha256
from pipeline.finite import first_non_finite

HASH_KEY = "tensors_sha256"
# the header key of the layout's version: a reader refuses any other than its own
VERSION_KEY = "format_version"


def write_tensor_file(
    path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], key: str, header: Mapping[str, Any]
) -> None:
    """Write ``tensors`` and ``header`` (stored as JSON under metadata ``key``, with the tensors' hash)."""
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    if (name := first_non_finite(tensors)) is not None:
        raise UserError(f"refusing to write {path}: {name} holds non-finite values (the fit diverged)")
    described = {**header, HASH_KEY: tensors_sha256(tensors)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={key: json.dumps(described, sort_keys=True)})


def read_tensor_file(
    path: str | os.PathLike, key: str, what: str, remedy: str, *, version: int
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(header, tensors) of a file :func:`write_tensor_file` wrote with ``format_version`` = ``version`` in
    its header; ``what`` names the kind of file and ``remedy`` the stage that makes it, in one-line errors for
    a missing, foreign, corrupt or other-version file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} not found; {remedy} first")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{path}: not a readable safetensors file ({reason}); {remedy} again") from None
    if key not in metadata:
        raise UserError(f"{path}: not a {what} (no {key!r} metadata)")
    try:
        header = json.loads(metadata[key])
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise UserError(f"{path}: the {what} header is not a JSON object; {remedy} again")
    if HASH_KEY not in header:
        raise UserError(f"{path}: no {HASH_KEY} in its header (written by an older version); {remedy} again")
    if header[HASH_KEY] != tensors_sha256(tensors):
        raise UserError(f"{path}: its tensors do not match the hash in its header (corrupt); {remedy} again")
    found = header.get(VERSION_KEY)
    if found != version:
        said = f"no {VERSION_KEY} in its header" if found is None else f"{VERSION_KEY} = {found!r}"
        raise UserError(
            f"{path}: {said}: written by an older or foreign tool (this reader reads version {version}); "
            f"re-{remedy}"
        )
    return header, tensors
