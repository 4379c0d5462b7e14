"""The schema of a graph store's ``manifest.json``, checked every time a store is opened.

A manifest that fails any rule is refused as a whole with one line naming the file, the key and what is
allowed, e.g. ``.../manifest.json: shards[0].file = '/tmp/x.safetensors': not a shard file name inside the
store (allowed: shard-NNNNN.safetensors)``. The rules:

- ``format``/``format_version`` are this reader's; every key is present with its JSON type, no other key;
- ``attention_kinds`` are known, distinct kinds and exactly the keys of ``kinds``, whose causal flag and
  sides are the kind's definition (:mod:`pipeline.attention_kinds`); ``counts.tokens`` has exactly the sides
  the kinds read and ``counts.edges`` exactly the kinds;
- ``layers``, ``heads``, ``head_dim`` ≥ 1; ``dtype``/``probs_dtype`` allowed; ``scaling`` finite and > 0;
- every shard ``file`` is a bare ``shard-NNNNN.safetensors`` name, so a manifest never makes a reader open
  a file outside the store folder. The folder's own entries may be symlinks (DVC's symlink cache type makes
  them so): what a shard holds is checked by its sha256, not by where it lives;
- shard ranges ``[start, stop)`` are non-empty and contiguous from 0 to ``counts.sentences`` (no gap, no
  overlap); shard ``bytes`` ≥ 0 sum to ``counts.bytes``; ``sha256`` is 64 lowercase hex digits;
- the counts are possible: every side has at least one token per sentence, every kind at most one edge
  per (layer, head, query, key), and no shard is larger than the most bytes these counts and shapes can
  take (:meth:`Manifest.max_bytes`). A reader checks a shard's size before hashing it, so a forged
  manifest claiming a huge shard is refused here, in milliseconds, not after minutes of hashing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.attention_kinds import KINDS, SIDES, attention_kind
from pipeline.errors import UserError

FORMAT = "sparsefinder-graph-store"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "valid", "test")
QK_DTYPES = ("float16", "float32")
PROBS_DTYPES = ("float16", "float32")
_SHARD_FILE = re.compile(r"shard-\d{5}\.safetensors")
_ITEMSIZE = {"float16": 2, "float32": 4}
# What a shard may hold beyond its arrays, for the size bound (max_bytes). Its safetensors header: an
# 8-byte length and JSON of well under 256 bytes per tensor (name, dtype, shape, byte range) plus the
# metadata. Its token texts: tokenizer pieces are a few characters, so a kilobyte per token on average
# admits any real vocabulary while keeping a forged size far out of bounds.
HEADER_BYTES_PER_TENSOR = 256
HEADER_BYTES = 1024
MAX_TOKEN_BYTES = 1024

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Side = Literal[SIDES]


def sides_read(kinds: Iterable[str]) -> list[str]:
    """The sides (in :data:`SIDES` order) whose tokens the attention kinds ``kinds`` read."""
    specs = [KINDS[name] for name in kinds]
    return [side for side in SIDES if any(side in (k.query_side, k.key_side) for k in specs)]


def _known_kind(name: str) -> str:
    attention_kind(name)  # ValueError naming the allowed kinds
    return name


def _shard_file_name(name: str) -> str:
    if not _SHARD_FILE.fullmatch(name):
        raise ValueError("not a shard file name inside the store (allowed: shard-NNNNN.safetensors)")
    return name


class _Strict(BaseModel):
    """JSON types exactly (no "3" for 3), no unknown key: a manifest is written by code, never by hand."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class KindSpec(_Strict):
    causal: bool
    query_side: Side
    key_side: Side


class Counts(_Strict):
    sentences: PositiveInt
    tokens: dict[Side, NonNegativeInt]
    edges: dict[str, NonNegativeInt]
    bytes: NonNegativeInt


class ShardEntry(_Strict):
    file: Annotated[str, AfterValidator(_shard_file_name)]
    sentences: tuple[NonNegativeInt, NonNegativeInt]
    bytes: NonNegativeInt
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Manifest(_Strict):
    """A validated manifest; read one with :func:`read_manifest`."""

    format: Literal[FORMAT]
    format_version: int
    teacher: dict[str, Any]
    split: Literal[SPLITS]
    attention_kinds: Annotated[list[Annotated[str, AfterValidator(_known_kind)]], Field(min_length=1)]
    kinds: dict[str, KindSpec]
    layers: PositiveInt
    heads: PositiveInt
    head_dim: PositiveInt
    dtype: Literal[QK_DTYPES]
    probs_dtype: Literal[PROBS_DTYPES]
    scaling: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    counts: Counts
    shards: Annotated[list[ShardEntry], Field(min_length=1)]

    @field_validator("format_version")
    @classmethod
    def _version(cls, version: int) -> int:
        if version != FORMAT_VERSION:
            raise ValueError(f"this reader reads version {FORMAT_VERSION} only; re-run extract")
        return version

    @property
    def sides(self) -> list[str]:
        """The sides whose tokens the store holds: those its kinds read."""
        return sides_read(self.attention_kinds)

    @model_validator(mode="after")
    def _across_keys(self) -> Manifest:
        """Rules across keys; each message starts with the key it is about."""
        self._check_kinds()
        self._check_counts()
        self._check_shards()
        return self

    def _check_kinds(self) -> None:
        if len(set(self.attention_kinds)) != len(self.attention_kinds):
            raise ValueError(f"attention_kinds = {self.attention_kinds}: lists a kind twice")
        _same_keys("kinds", self.kinds, self.attention_kinds)
        for name, spec in self.kinds.items():
            kind = KINDS[name]
            expected = KindSpec(causal=kind.causal, query_side=kind.query_side, key_side=kind.key_side)
            if spec != expected:
                raise ValueError(f"kinds.{name} = {spec.model_dump()}: {name} is {expected.model_dump()}")

    def _check_counts(self) -> None:
        _same_keys("counts.tokens", self.counts.tokens, self.sides)
        _same_keys("counts.edges", self.counts.edges, self.attention_kinds)
        tokens, sentences = self.counts.tokens, self.counts.sentences
        for side, count in tokens.items():
            if count < sentences:
                raise ValueError(
                    f"counts.tokens.{side} = {count}: fewer than counts.sentences = {sentences} (every "
                    "sentence has at least one token)"
                )
        for name, edges in self.counts.edges.items():
            kind = KINDS[name]
            pairs = self.layers * self.heads * tokens[kind.query_side] * tokens[kind.key_side]
            if edges > pairs:
                raise ValueError(
                    f"counts.edges.{name} = {edges}: more than the {pairs} (layer, head, query, key) "
                    "pairs the token counts allow"
                )

    def max_bytes(self) -> int:
        """The most bytes the shards can take together for these counts and shapes: every array at the size
        the counts give it, key indices as int32, token texts at :data:`MAX_TOKEN_BYTES` a token on average
        and every shard's header at its bound (see the module docstring for the arrays)."""
        tokens, edges = self.counts.tokens, self.counts.edges
        sentences, shards = self.counts.sentences, len(self.shards)
        tensors = 1 + 3 * len(tokens) + 5 * len(edges)
        total = shards * (8 + HEADER_BYTES + HEADER_BYTES_PER_TENSOR * tensors) + 8 * sentences
        for count in tokens.values():  # lengths, offsets (one more per shard), texts
            total += 8 * sentences + 8 * (count + shards) + MAX_TOKEN_BYTES * count
        for name, count in edges.items():
            kind = KINDS[name]
            rows, keys = tokens[kind.query_side], tokens[kind.key_side]
            per_head = (rows + keys) * self.head_dim * _ITEMSIZE[self.dtype] + 8 * (rows + shards)
            total += self.layers * self.heads * per_head + count * (4 + _ITEMSIZE[self.probs_dtype])
        return total

    def _check_shards(self) -> None:
        stop = 0
        for i, shard in enumerate(self.shards):
            start, end = shard.sentences
            if start != stop or end <= start:
                raise ValueError(
                    f"shards[{i}].sentences = {[start, end]}: expected a non-empty range starting at {stop} "
                    "(ranges run contiguously from 0, without overlap)"
                )
            stop = end
        if stop != self.counts.sentences:
            raise ValueError(f"counts.sentences = {self.counts.sentences}: the shards hold {stop} sentences")
        files = [shard.file for shard in self.shards]
        for i, name in enumerate(files):
            if name in files[:i]:
                raise ValueError(f"shards[{i}].file = {name!r}: shards[{files.index(name)}] is that file too")
        total = sum(shard.bytes for shard in self.shards)
        if total != self.counts.bytes:
            raise ValueError(f"counts.bytes = {self.counts.bytes}: the shards' bytes sum to {total}")
        most = self.max_bytes()
        for i, shard in enumerate(self.shards):
            if shard.bytes > most:
                raise ValueError(
                    f"shards[{i}].bytes = {shard.bytes}: more than the {most} bytes the store's counts and "
                    "shapes allow for all its shards together (counts.tokens, counts.edges, layers, heads, "
                    "head_dim, dtype)"
                )
        if total > most:
            raise ValueError(
                f"counts.bytes = {total}: more than the {most} bytes the store's counts and shapes allow"
            )


def _same_keys(key: str, mapping: Mapping[str, Any], expected: Sequence[str]) -> None:
    """``mapping`` must have exactly the keys ``expected`` (which follow from ``attention_kinds``)."""
    if set(mapping) != set(expected):
        raise ValueError(f"{key} has keys {list(mapping)}; attention_kinds call for {list(expected)}")


def read_manifest(folder: Path) -> Manifest:
    """The validated manifest of the store ``folder``; one-line :class:`UserError` naming the file if bad."""
    path = folder / MANIFEST
    if not path.is_file():
        raise UserError(f"no graph store at {folder} (missing {MANIFEST}); run the extract stage first")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UserError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        return Manifest.model_validate_json(raw)
    except ValidationError as err:
        raise UserError(f"{path}: {_one_line(err)}") from None


def _one_line(err: ValidationError) -> str:
    """The first error as ``key = value: what is wrong`` (``key: ...`` when missing or unknown)."""
    first = err.errors()[0]
    message = first["msg"].removeprefix("Value error, ")
    key = _key(first["loc"])
    if first["type"] == "json_invalid":
        return f"not valid JSON ({message.removeprefix('Invalid JSON: ')})"
    if not key:
        return message
    if first["type"] in {"missing", "extra_forbidden"}:
        return f"{key}: {message}"
    return f"{key} = {first['input']!r}: {message}"


def _key(loc: tuple[int | str, ...]) -> str:
    """``("shards", 0, "file")`` → ``shards[0].file``."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif part == "[key]":
            key += " (key)"
        else:
            key += f".{part}" if key else part
    return key
