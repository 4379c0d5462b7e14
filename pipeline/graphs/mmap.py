"""Zero-copy reading of a safetensors file through one read-only numpy memory map.

The format is an 8-byte little-endian header length, a JSON header naming every tensor's dtype, shape and
byte range, then the raw data. Parsing the header ourselves lets every tensor be a view into the map, so
opening a shard reads a few kilobytes and random access touches only the pages it needs (``safe_open``
copies each tensor it returns).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def map_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of ``path`` as a read-only array view into one memory map.

    Raises ``ValueError`` naming the file when it is shorter than its header says (a truncated file).
    """
    path = Path(path)
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path.name}: truncated ({size} bytes, no safetensors header)")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    header_len = int.from_bytes(raw[:8].tobytes(), "little")
    if 8 + header_len > raw.size:
        raise ValueError(f"{path.name}: truncated (header needs {8 + header_len} bytes, file has {raw.size})")
    header = json.loads(raw[8 : 8 + header_len].tobytes())
    header.pop("__metadata__", None)
    base = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        start, stop = entry["data_offsets"]
        if base + stop > raw.size:
            raise ValueError(
                f"{path.name}: truncated (tensor {name} ends at byte {base + stop}, file has {raw.size})"
            )
        data = raw[base + start : base + stop].view(_DTYPES[entry["dtype"]])
        tensors[name] = data.reshape(entry["shape"])
    return tensors
