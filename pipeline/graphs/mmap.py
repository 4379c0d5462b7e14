"""Zero-copy reading of a safetensors file through one read-only numpy memory map.

The format is an 8-byte little-endian header length, a JSON header naming every tensor's dtype, shape and
byte range, then the raw data. Parsing the header ourselves lets every tensor be a view into the map, so
opening a shard reads a few kilobytes and random access touches only the pages it needs (``safe_open``
copies each tensor it returns).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
}
# the safetensors library's own limit: a header length beyond it is corruption, not a header to read
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(ValueError):
    """A file that is not a whole, well-formed safetensors file; the message names the file.

    ``reason`` is the message without the file name, for callers that name the file themselves.
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason


def map_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of ``path`` as a read-only array view into one memory map.

    Raises :class:`SafetensorsError` when the file is shorter than its header says (truncated) or the header
    is malformed: longer than :data:`MAX_HEADER_BYTES`, not a JSON object, an unknown dtype, a shape or byte
    range that is not non-negative integers, a byte range whose length is not the shape's, or byte ranges
    that do not tile the data exactly (a gap, an overlap or bytes after the last tensor: what the file
    holds beyond its tensors would be hashed and stored for nothing).
    """
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise SafetensorsError(path, f"truncated ({size} bytes, no safetensors header)")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    header_len = int.from_bytes(raw[:8].tobytes(), "little")
    if header_len > MAX_HEADER_BYTES:
        raise SafetensorsError(
            path, f"corrupt safetensors header (says it is {header_len} bytes; at most {MAX_HEADER_BYTES})"
        )
    if 8 + header_len > raw.size:
        raise SafetensorsError(path, f"truncated (header needs {8 + header_len} bytes, file has {raw.size})")
    header = _header(path, raw[8 : 8 + header_len].tobytes())
    base = 8 + header_len
    tensors = {name: _tensor(path, raw, base, name, entry) for name, entry in header.items()}
    _check_tiling(path, [(*header[name]["data_offsets"], name) for name in tensors], raw.size - base)
    return tensors


def _header(path: Path, text: bytes) -> dict[str, Any]:
    """The header's tensor entries (``__metadata__`` dropped); it must be one JSON object."""
    try:
        header = json.loads(text)
    except ValueError:  # bad JSON or bad UTF-8
        raise SafetensorsError(path, "corrupt safetensors header (not valid JSON)") from None
    if not isinstance(header, dict):
        raise SafetensorsError(path, "corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    return header


def _tensor(path: Path, raw: np.memmap, base: int, name: str, entry: Any) -> np.ndarray:
    """The view of tensor ``name`` that its header ``entry`` describes, once the entry is checked."""
    corrupt = f"corrupt safetensors header: tensor {name}"
    dtype = entry.get("dtype") if isinstance(entry, dict) else None
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise SafetensorsError(path, f"{corrupt} has dtype {dtype!r} (allowed: {', '.join(_DTYPES)})")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not _counts(shape) or not _counts(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise SafetensorsError(
            path,
            f"{corrupt} has shape {shape!r} and data_offsets {offsets!r} (allowed: lists of integers >= 0, "
            "data_offsets [start, stop] with start <= stop)",
        )
    start, stop = offsets
    nbytes = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if stop - start != nbytes:
        raise SafetensorsError(path, f"{corrupt} spans {stop - start} bytes; {dtype} {shape} is {nbytes}")
    if base + stop > raw.size:
        raise SafetensorsError(path, f"truncated (tensor {name} ends at byte {base + stop} of {raw.size})")
    return raw[base + start : base + stop].view(_DTYPES[dtype]).reshape(shape)


def _check_tiling(path: Path, spans: list[tuple[int, int, str]], data_bytes: int) -> None:
    """The tensors' byte ranges ``spans`` (start, stop, name) must cover [0, ``data_bytes``) without a gap
    or an overlap, as the safetensors format lays them out."""
    position = 0
    for start, stop, name in sorted(spans):
        if start != position:
            raise SafetensorsError(
                path, f"corrupt safetensors header: tensor {name} starts at data byte {start}, not {position}"
            )
        position = stop
    if position != data_bytes:
        raise SafetensorsError(
            path, f"corrupt safetensors header: {data_bytes - position} bytes after the last tensor"
        )


def _counts(value: Any) -> bool:
    """Whether ``value`` is a list of integers >= 0 (JSON booleans excluded)."""
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )
