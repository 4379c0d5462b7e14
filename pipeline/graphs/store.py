"""The attention-graph store: queries, keys and gold attention graphs of a teacher, sharded on disk.

Layout of a store folder::

    manifest.json              format, teacher fingerprint, split, kinds, shapes, counts, shards with sha256
    shard-00000.safetensors    flat arrays for sentences [0, shard_sentences)
    shard-00001.safetensors    ...

Inside a shard holding S sentences, for every stored side (``source``/``target``) and kind::

    sentence_ids          (S,) int64         the dataset rows the sentences came from
    lengths.SIDE          (S,) int64         tokens per sentence on that side
    tokens.SIDE.utf8      (bytes,) uint8     every token's UTF-8 text, concatenated
    tokens.SIDE.offsets   (T + 1,) int64     token t is utf8[offsets[t]:offsets[t + 1]]
    KIND.q                (L, H, Nq, d)      queries after the projection (unscaled), sentences concatenated
    KIND.k                (L, H, Nk, d)      keys after the projection
    KIND.indptr           (L, H, Nq + 1)     CSR row offsets into cols/probs (absolute within the shard)
    KIND.cols             (E,) int16|int32   key index of every edge (p > 0), within its sentence
    KIND.probs            (E,) float         the gold probability of every edge

Edges are ordered by (layer, head, sentence, query, key), so one layer's data is contiguous, and the edges
of query i of sentence s in head (l, h) are ``cols[indptr[l, h, o + i] : indptr[l, h, o + i + 1]]`` with o
the sentence's first query row in the shard. Sentence s of the store is row ``s − start`` of the shard whose
range holds it, so a train/validation split is just two lists of sentence indices.

The writer keeps at most one shard in memory, writes every shard under a temporary name and renames it,
and builds the whole store under a temporary folder name that becomes the real name only after the
manifest is written: a crash never leaves a store that looks whole. A shard's bytes are a function of its
content alone (its one metadata key holds canonical JSON), so re-running extract reproduces every sha256.

The reader trusts nothing it has not checked: opening validates the manifest
(:mod:`pipeline.graphs.manifest`), and each shard is verified on its first use in a process, cheapest
first: its size against the manifest's (whose counts bound it), its safetensors header, its sha256, its
tensor names, dtypes, shapes and offsets against the manifest, then what it holds (key indices within the
sentence and causal where the kind is, probabilities in [0, 1] with every query's summing to 1, finite
queries and keys). The sha256 only proves the file is the one the manifest describes, and a
manifest can be rewritten with its shards. Any problem is one :class:`~pipeline.errors.UserError` line
naming the file and, for what it holds, the first bad (sentence, layer, head).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import safetensors.numpy

from pipeline.atomic import atomic_path, write_json
from pipeline.attention_kinds import AttentionKind, attention_kind
from pipeline.errors import UserError
from pipeline.fingerprint import cached_file_sha256, file_sha256
from pipeline.graphs.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    PROBS_DTYPES,
    QK_DTYPES,
    SPLITS,
    Manifest,
    ShardEntry,
    read_manifest,
    sides_read,
)
from pipeline.graphs.mmap import SafetensorsError, map_safetensors

_INT16_LIMIT = np.iinfo(np.int16).max
# How far a stored query's probabilities may sum from 1: float16 storage rounds each by at most 2⁻¹¹
# relative, so a whole row by at most 2⁻¹¹ ≈ 5e-4; the rest is room for the normalizer's own tolerance.
ROW_SUM_TOLERANCE = 1e-2
# One metadata key holding canonical JSON: safetensors writes its metadata map in a random order (a Rust
# HashMap), so with several keys the same content gave different bytes, and sha256, from run to run.
_SHARD_METADATA = {"format": json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION}, sort_keys=True)}


class AttentionGraph(NamedTuple):
    """One sentence's tensors for one attention kind, every layer and head."""

    q: np.ndarray  # (layers, heads, n, head_dim) queries after the projection, before scaling
    k: np.ndarray  # (layers, heads, m, head_dim) keys after the projection
    probs: np.ndarray  # (layers, heads, n, m) gold attention probabilities; edges are p > 0


@dataclass(frozen=True)
class _SentenceEdges:
    """One sentence of one kind, reduced to what a shard stores."""

    q: np.ndarray  # (L, H, n, d) in the store dtype
    k: np.ndarray  # (L, H, m, d)
    head: np.ndarray  # (E,) l·H + h of every edge, edges in (l, h, i, j) order
    rows: np.ndarray  # (E,) query i
    cols: np.ndarray  # (E,) key j
    probs: np.ndarray  # (E,) p_ij in the probs dtype


@dataclass(frozen=True)
class _Pending:
    sentence_id: int
    tokens: dict[str, list[str]]
    graphs: dict[str, _SentenceEdges]


def shard_name(index: int) -> str:
    """File name of shard number ``index``."""
    return f"shard-{index:05d}.safetensors"


class GraphStoreWriter:
    """Stream sentences into a new graph store; use as a context manager.

    ``split`` is the corpus split every sentence comes from (``train``, ``valid`` or ``test``), so a reader
    can tell a training store from a held-out one. ``scaling`` is the factor the teacher multiplies q·kᵀ by
    before its attention normalizer (Marian: head_dim^−½); queries are stored unscaled, exactly as the
    projection layers output them.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        teacher_fingerprint: Mapping[str, Any],
        split: str,
        attention_kinds: Sequence[str],
        layers: int,
        heads: int,
        head_dim: int,
        scaling: float,
        dtype: str = "float16",
        probs_dtype: str = "float32",
        shard_sentences: int = 512,
    ) -> None:
        kinds = [attention_kind(name) for name in attention_kinds]
        if not kinds or len(set(attention_kinds)) != len(kinds):
            raise ValueError(f"attention_kinds must be distinct and non-empty, got {list(attention_kinds)}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if dtype not in QK_DTYPES:
            raise ValueError(f"dtype must be one of {QK_DTYPES}, got {dtype!r}")
        if probs_dtype not in PROBS_DTYPES:
            raise ValueError(f"probs_dtype must be one of {PROBS_DTYPES}, got {probs_dtype!r}")
        if min(layers, heads, head_dim, shard_sentences) < 1:
            raise ValueError("layers, heads, head_dim and shard_sentences must all be >= 1")
        self.folder = Path(folder)
        self.kinds = kinds
        self.sides = sides_read(k.name for k in kinds)
        self.shape = (layers, heads, head_dim)
        self.dtype = np.dtype(dtype)
        self.probs_dtype = np.dtype(probs_dtype)
        self.shard_sentences = shard_sentences
        self._manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "teacher": dict(teacher_fingerprint),
            "split": split,
            "attention_kinds": [k.name for k in kinds],
            "kinds": {
                k.name: {"causal": k.causal, "query_side": k.query_side, "key_side": k.key_side}
                for k in kinds
            },
            "layers": layers,
            "heads": heads,
            "head_dim": head_dim,
            "dtype": dtype,
            "probs_dtype": probs_dtype,
            "scaling": float(scaling),
        }
        self._pending: list[_Pending] = []
        self._shards: list[dict[str, Any]] = []
        self._sentences = 0
        self._tokens = dict.fromkeys(self.sides, 0)
        self._edges = {k.name: 0 for k in kinds}
        self._tmp: Path | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> GraphStoreWriter:
        self._tmp = self._stack.enter_context(atomic_path(self.folder, directory=True))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                if self._sentences + len(self._pending) == 0:
                    raise ValueError(f"graph store {self.folder}: no sentence was added")
                self._flush()
                write_json(self._tmp / MANIFEST, self._finished_manifest())
            except BaseException as err:
                # the temporary folder must go whatever failed while finishing
                self._stack.__exit__(type(err), err, err.__traceback__)
                raise
        self._tmp = None
        return self._stack.__exit__(exc_type, exc, tb)

    def add(
        self, sentence_id: int, tokens: Mapping[str, Sequence[str]], graphs: Mapping[str, AttentionGraph]
    ) -> None:
        """Append one sentence: its tokens per side and, per stored kind, q, k and gold probabilities."""
        if self._tmp is None:
            raise RuntimeError("GraphStoreWriter.add must be called inside its `with` block")
        if set(graphs) != {k.name for k in self.kinds}:
            raise ValueError(
                f"expected graphs for kinds {[k.name for k in self.kinds]}, got {sorted(graphs)}"
            )
        missing = [s for s in self.sides if s not in tokens]
        if missing:
            raise ValueError(f"tokens missing for side(s) {missing}")
        sentence_tokens = {side: [str(t) for t in tokens[side]] for side in self.sides}
        edges = {}
        for kind in self.kinds:
            n, m = len(sentence_tokens[kind.query_side]), len(sentence_tokens[kind.key_side])
            edges[kind.name] = self._reduce(kind.name, kind.causal, graphs[kind.name], n, m)
        self._pending.append(_Pending(int(sentence_id), sentence_tokens, edges))
        if len(self._pending) == self.shard_sentences:
            self._flush()

    def _reduce(self, name: str, causal: bool, graph: AttentionGraph, n: int, m: int) -> _SentenceEdges:
        """Check shapes and turn dense probabilities into edge lists."""
        L, H, d = self.shape
        q, k, probs = (np.asarray(a) for a in graph)
        for label, array, shape in (
            ("q", q, (L, H, n, d)),
            ("k", k, (L, H, m, d)),
            ("probs", probs, (L, H, n, m)),
        ):
            if array.shape != shape:
                raise ValueError(
                    f"{name}.{label} has shape {array.shape}, expected {shape} (from the tokens)"
                )
        if n < 1 or m < 1:
            raise ValueError(f"{name}: a sentence needs at least one query and one key (n={n}, m={m})")
        layer, head, i, j = np.nonzero(probs > 0)  # C order: (layer, head, i, j) ascending
        if causal and (j > i).any():
            # a causal head attending the future means the teacher's mask was dropped
            raise ValueError(f"{name}: gold graph has edges to future keys although the kind is causal")
        return _SentenceEdges(
            q=q.astype(self.dtype),
            k=k.astype(self.dtype),
            head=layer * H + head,
            rows=i,
            cols=j,
            probs=probs[layer, head, i, j].astype(self.probs_dtype),
        )

    def _flush(self) -> None:
        """Write the buffered sentences as the next shard."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        arrays: dict[str, np.ndarray] = {"sentence_ids": np.array([p.sentence_id for p in pending], np.int64)}
        for side in self.sides:
            texts = [t for p in pending for t in p.tokens[side]]
            arrays.update(_token_arrays(side, [len(p.tokens[side]) for p in pending], texts))
            self._tokens[side] += len(texts)
        for kind in self.kinds:
            kind_arrays = self._kind_arrays([p.graphs[kind.name] for p in pending])
            arrays.update({f"{kind.name}.{key}": value for key, value in kind_arrays.items()})
            self._edges[kind.name] += int(kind_arrays["cols"].size)

        index = len(self._shards)
        start = self._sentences
        with atomic_path(self._tmp / shard_name(index)) as tmp:
            safetensors.numpy.save_file(arrays, str(tmp), metadata=_SHARD_METADATA)
        path = self._tmp / shard_name(index)
        self._sentences += len(pending)
        self._shards.append(
            {
                "file": path.name,
                "sentences": [start, self._sentences],
                "bytes": path.stat().st_size,
                "sha256": file_sha256(path),
            }
        )

    def _kind_arrays(self, sentences: list[_SentenceEdges]) -> dict[str, np.ndarray]:
        """Concatenate sentences into the shard's flat arrays, edges in (layer, head, sentence, row) order."""
        L, H, _ = self.shape
        q_lengths = np.array([s.q.shape[2] for s in sentences], np.int64)
        q_offsets = np.concatenate([[0], np.cumsum(q_lengths)])
        rows_total = int(q_offsets[-1])
        # global row id of every edge: (head, shard query row), so one stable sort gives CSR order
        row_id = np.concatenate(
            [s.head * rows_total + q_offsets[n] + s.rows for n, s in enumerate(sentences)]
        ).astype(np.int64)
        order = np.argsort(row_id, kind="stable")
        per_row = np.bincount(row_id, minlength=L * H * rows_total)
        flat = np.concatenate([[0], np.cumsum(per_row)])
        indptr = flat[np.arange(L * H)[:, None] * rows_total + np.arange(rows_total + 1)[None, :]]
        max_keys = max(s.k.shape[2] for s in sentences)
        cols_dtype = np.int16 if max_keys <= _INT16_LIMIT else np.int32
        return {
            "q": np.concatenate([s.q for s in sentences], axis=2),
            "k": np.concatenate([s.k for s in sentences], axis=2),
            "indptr": indptr.reshape(L, H, rows_total + 1).astype(np.int64),
            "cols": np.concatenate([s.cols for s in sentences])[order].astype(cols_dtype),
            "probs": np.concatenate([s.probs for s in sentences])[order],
        }

    def _finished_manifest(self) -> dict[str, Any]:
        return {
            **self._manifest,
            "counts": {
                "sentences": self._sentences,
                "tokens": dict(self._tokens),
                "edges": dict(self._edges),
                "bytes": sum(s["bytes"] for s in self._shards),
            },
            "shards": self._shards,
        }


def _token_arrays(side: str, lengths: list[int], texts: list[str]) -> dict[str, np.ndarray]:
    encoded = [t.encode("utf-8") for t in texts]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in encoded], dtype=np.int64)]).astype(np.int64)
    return {
        f"lengths.{side}": np.array(lengths, np.int64),
        f"tokens.{side}.utf8": np.frombuffer(b"".join(encoded), np.uint8).copy(),
        f"tokens.{side}.offsets": offsets,
    }


@dataclass(frozen=True)
class Record:
    """One (sentence, layer, head) of one kind: q, k and the gold graph as CSR."""

    sentence: int  # index in the store
    sentence_id: int  # dataset row it came from
    kind: str
    layer: int
    head: int
    causal: bool
    q: np.ndarray  # (n, d) float32, unscaled
    k: np.ndarray  # (m, d) float32
    indptr: np.ndarray  # (n + 1,) int64, starting at 0: row i's edges are cols[indptr[i]:indptr[i + 1]]
    cols: np.ndarray  # (E,) int64 key indices
    probs: np.ndarray  # (E,) float32 gold probabilities
    query_tokens: list[str]
    key_tokens: list[str]

    @property
    def n(self) -> int:
        return self.q.shape[0]

    @property
    def m(self) -> int:
        return self.k.shape[0]

    def edge_rows(self) -> np.ndarray:
        """(E,) query index of every edge."""
        return np.repeat(np.arange(self.n), np.diff(self.indptr))

    def gold_mask(self) -> np.ndarray:
        """(n, m) bool, True on gold edges (p > 0)."""
        mask = np.zeros((self.n, self.m), bool)
        mask[self.edge_rows(), self.cols] = True
        return mask

    def gold_probs(self) -> np.ndarray:
        """(n, m) float32 gold probabilities, zero off the graph."""
        dense = np.zeros((self.n, self.m), np.float32)
        dense[self.edge_rows(), self.cols] = self.probs
        return dense

    def valid_mask(self) -> np.ndarray:
        """(n, m) bool, the pairs the head may attend (key j ≤ query i when causal)."""
        valid = np.ones((self.n, self.m), bool)
        return np.tril(valid) if self.causal else valid


class _ShardError(Exception):
    """A shard that disagrees with its manifest entry or with itself; the message says how."""


class _Shard:
    """One shard file, verified and memory-mapped on first use."""

    def __init__(self, folder: Path, entry: ShardEntry, manifest: Manifest) -> None:
        self.path = folder / entry.file
        self.start, self.stop = entry.sentences
        self._entry = entry
        self._manifest = manifest
        self._tensors: dict[str, np.ndarray] = {}
        self._offsets: dict[str, np.ndarray] = {}

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        """Every array of the shard, as views into its memory map."""
        self._open()
        return self._tensors

    @property
    def offsets(self) -> dict[str, np.ndarray]:
        """Per side, (S + 1,) int64 first token of every sentence within the shard."""
        self._open()
        return self._offsets

    def _open(self) -> None:
        if not self._tensors:
            problem = self.problem()
            if problem is not None:
                raise UserError(f"graph store shard {self.path}: {problem}; re-run extract")

    def problem(self, *, rehash: bool = False) -> str | None:
        """What is wrong with the shard, or None once it is verified and mapped.

        In order, cheapest first: the file exists and has the manifest's size (which the manifest's counts
        bound, so a forged huge file is refused before it is hashed), its safetensors header is well formed
        (the header alone is read), its sha256 is the manifest's (hashed once per process unless
        ``rehash``; a flipped byte stops here, named as corruption), its tensors pass
        :func:`_check_tensors` and what they hold passes :func:`_check_contents`.
        """
        self._tensors = {}
        try:
            self._check_size()
            tensors = map_safetensors(self.path)
            if cached_file_sha256(self.path, rehash=rehash) != self._entry.sha256:
                raise _ShardError("sha256 mismatch (corrupt)")
            offsets = _check_tensors(tensors, self._manifest, self.stop - self.start, self.start)
            _check_contents(tensors, self._manifest, offsets, self.start)
        except SafetensorsError as err:
            return err.reason
        except _ShardError as err:
            return str(err)
        self._tensors, self._offsets = tensors, offsets
        return None

    def _check_size(self) -> None:
        if not self.path.is_file():
            raise _ShardError("missing")
        size, expected = self.path.stat().st_size, self._entry.bytes
        if size < expected:
            raise _ShardError(f"truncated ({size} of {expected} bytes)")
        if size > expected:
            raise _ShardError(f"{size} bytes, manifest says {expected}")


def _tensor_names(manifest: Manifest) -> list[str]:
    """The tensors every shard of ``manifest`` holds, no more (see the module docstring)."""
    names = ["sentence_ids"]
    for side in manifest.sides:
        names += [f"lengths.{side}", f"tokens.{side}.utf8", f"tokens.{side}.offsets"]
    for kind in manifest.attention_kinds:
        names += [f"{kind}.{part}" for part in ("q", "k", "indptr", "cols", "probs")]
    return names


def _check_tensors(
    tensors: Mapping[str, np.ndarray], manifest: Manifest, sentences: int, first: int
) -> dict[str, np.ndarray]:
    """Check a shard's tensors against its manifest; returns per side (S + 1,) each sentence's first token.

    Names: exactly :func:`_tensor_names`. Dtypes: int64 ids, lengths, offsets and indptr, uint8 utf8, q/k in
    the manifest's ``dtype``, probs in its ``probs_dtype``, cols int16|int32. Shapes, from the manifest and
    each other: S = ``sentences``; every length >= 1; Nq/Nk are the sums of the kind's query/key-side lengths;
    offsets run non-decreasing from 0 to len(utf8) and indptr, read in (layer, head, row) order, from 0 to
    len(cols) (one head's last offset is the next one's first); probs as long as cols. Only the lengths,
    offsets and indptr are read; the rest is the header's. ``first`` is the shard's first sentence in the
    store, for messages.
    """
    names = _tensor_names(manifest)
    missing, unexpected = [n for n in names if n not in tensors], sorted(set(tensors) - set(names))
    if missing or unexpected:
        raise _ShardError(f"tensors do not match the manifest (missing: {missing}; unexpected: {unexpected})")
    L, H, d = manifest.layers, manifest.heads, manifest.head_dim
    _expect(tensors, "sentence_ids", ("int64",), (sentences,))
    starts = {}
    for side in manifest.sides:
        lengths = _expect(tensors, f"lengths.{side}", ("int64",), (sentences,))
        if (lengths < 1).any():
            raise _ShardError(f"tensor lengths.{side} has a sentence without tokens")
        starts[side] = np.concatenate([[0], np.cumsum(lengths)])
        utf8 = _expect(tensors, f"tokens.{side}.utf8", ("uint8",), (None,))
        offsets = _expect(tensors, f"tokens.{side}.offsets", ("int64",), (int(starts[side][-1]) + 1,))
        if _first_bad_offset(offsets, len(utf8)) is not None:
            raise _ShardError(
                f"tensor tokens.{side}.offsets is not non-decreasing offsets from 0 to {len(utf8)}"
            )
    for name in manifest.attention_kinds:
        kind = attention_kind(name)
        nq, nk = int(starts[kind.query_side][-1]), int(starts[kind.key_side][-1])
        _expect(tensors, f"{name}.q", (manifest.dtype,), (L, H, nq, d))
        _expect(tensors, f"{name}.k", (manifest.dtype,), (L, H, nk, d))
        cols = _expect(tensors, f"{name}.cols", ("int16", "int32"), (None,))
        _expect(tensors, f"{name}.probs", (manifest.probs_dtype,), (len(cols),))
        indptr = _expect(tensors, f"{name}.indptr", ("int64",), (L, H, nq + 1))
        bad = _first_bad_offset(indptr.ravel(), len(cols))
        if bad is not None:
            head, row = divmod(bad, nq + 1)
            raise _ShardError(
                f"tensor {name}.indptr is not non-decreasing offsets from 0 to {len(cols)}, first at "
                f"{_place(manifest, starts[kind.query_side], first, head, min(row, nq - 1))}"
            )
    return starts


def _first_bad_offset(values: np.ndarray, end: int) -> int | None:
    """The first index of ``values`` that breaks "non-decreasing from 0 to ``end``", or None."""
    if values[0] != 0:
        return 0
    drops = np.flatnonzero(values[1:] < values[:-1])
    if drops.size:
        return int(drops[0]) + 1
    return None if values[-1] == end else len(values) - 1


def _place(
    manifest: Manifest, row_starts: np.ndarray, first: int, head: int, row: int, what: str = "query"
) -> str:
    """``sentence S, layer L, head H, query I``: where flat head ``head`` (l·H + h) and shard row ``row``
    (on the side whose sentences start at ``row_starts``) are, ``first`` being the shard's first sentence."""
    layer, head = divmod(head, manifest.heads)
    sentence = int(np.searchsorted(row_starts, row, side="right")) - 1
    within = row - int(row_starts[sentence])
    return f"sentence {first + sentence}, layer {layer}, head {head}, {what} {within}"


def _check_contents(
    tensors: Mapping[str, np.ndarray], manifest: Manifest, starts: Mapping[str, np.ndarray], first: int
) -> None:
    """What a shard's header cannot tell, for every kind: its edges pass :func:`_check_edges`, its queries
    and keys are finite. ``starts`` are :func:`_check_tensors`' sentence starts, ``first`` is the shard's
    first sentence in the store.

    One vectorised pass over the shard's edges and q/k, once per shard and process like the hash: a shard
    that lies under a valid sha256 (its manifest rewritten to match) is refused, naming the first bad
    (sentence, layer, head), before any stage computes with it.
    """
    for name in manifest.attention_kinds:
        kind = attention_kind(name)
        _check_edges(tensors, manifest, kind, starts, first)
        for part, side in (("q", kind.query_side), ("k", kind.key_side)):
            values = tensors[f"{name}.{part}"]
            if not _all_finite(values):
                layer, head, token = (int(i) for i in np.argwhere(~np.isfinite(values).all(axis=-1))[0])
                where = _place(manifest, starts[side], first, layer * manifest.heads + head, token, "token")
                raise _ShardError(f"{name}.{part} is not finite at {where}; allowed: finite values")


# the exponent bits of each float dtype a store holds: all ones make an Inf or a NaN
_EXPONENT_BITS = {np.dtype(np.float16): np.uint16(0x7C00), np.dtype(np.float32): np.uint32(0x7F800000)}


def _all_finite(values: np.ndarray) -> bool:
    """Whether float16/float32 ``values`` are all finite, read off the exponent bits (all ones: Inf or
    NaN): numpy's ``isfinite`` on float16 converts every element and is ten times slower."""
    exponent = _EXPONENT_BITS[values.dtype]
    return not ((values.view(exponent.dtype) & exponent) == exponent).any()


def _check_edges(
    tensors: Mapping[str, np.ndarray],
    manifest: Manifest,
    kind: AttentionKind,
    starts: Mapping[str, np.ndarray],
    first: int,
) -> None:
    """Every query of ``kind`` has edges; their keys lie within its sentence, and at or before the query
    when the kind is causal; their probabilities lie in [0, 1] and sum to 1 within
    :data:`ROW_SUM_TOLERANCE` (a shard keeps every p > 0, so whole rows)."""
    name = kind.name
    q_starts, k_starts = starts[kind.query_side], starts[kind.key_side]
    indptr = tensors[f"{name}.indptr"].reshape(manifest.layers * manifest.heads, -1)  # (L·H, rows + 1)
    cols, probs = tensors[f"{name}.cols"], tensors[f"{name}.probs"]
    rows = indptr.shape[1] - 1
    row_starts = indptr[:, :-1].ravel()  # (L·H·rows,) first edge of every query, in (layer, head, row) order

    def at(flat_row: int) -> str:
        return _place(manifest, q_starts, first, *divmod(flat_row, rows))

    edge_counts = np.diff(indptr, axis=1).ravel()
    empty = np.flatnonzero(edge_counts == 0)
    if empty.size:
        raise _ShardError(
            f"{name}: {at(int(empty[0]))} has no edge; allowed: every query attends at least one key (its "
            "probabilities sum to 1)"
        )
    # the last key each query may attend: its sentence's last, or the query itself when causal
    sentence = np.repeat(np.arange(len(q_starts) - 1), np.diff(q_starts))  # (rows,)
    last = np.diff(k_starts)[sentence] - 1
    if kind.causal:
        last = np.minimum(last, np.arange(rows) - q_starts[sentence])
    # rows are non-empty, so reduceat's segments are exactly the rows
    outside = np.maximum.reduceat(cols, row_starts) > np.tile(last, len(indptr))
    if cols.min() < 0:  # rare: a second pass to find the rows
        outside |= np.minimum.reduceat(cols, row_starts) < 0
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        limit = int(last[row % rows])
        keys = cols[row_starts[row] : row_starts[row] + edge_counts[row]]
        key = int(keys[(keys < 0) | (keys > limit)][0])
        causal = f" and at or before the query ({name} is causal)" if kind.causal else ""
        raise _ShardError(
            f"{name}.cols holds key {key} at {at(row)}; allowed: keys 0 … {limit}, within the "
            f"sentence{causal}"
        )
    within = (probs >= 0) & (probs <= 1)  # NaN fails both
    if not within.all():
        edge = int(np.argmin(within))
        row = int(np.searchsorted(row_starts, edge, side="right")) - 1
        raise _ShardError(f"{name}.probs holds {probs[edge]} at {at(row)}; allowed: probabilities in [0, 1]")
    sums = np.add.reduceat(probs, row_starts, dtype=np.float64)
    off = np.flatnonzero(np.abs(sums - 1) > ROW_SUM_TOLERANCE)
    if off.size:
        raise _ShardError(
            f"{name}.probs sum to {sums[off[0]]:.6g} at {at(int(off[0]))}; allowed: every query's "
            f"probabilities sum to 1 (± {ROW_SUM_TOLERANCE})"
        )


def _expect(
    tensors: Mapping[str, np.ndarray], name: str, dtypes: Sequence[str], shape: tuple[int | None, ...]
) -> np.ndarray:
    """Tensor ``name``, if its dtype is one of ``dtypes`` and its shape is ``shape`` (None: any length)."""
    array = tensors[name]
    fits = len(array.shape) == len(shape) and all(
        want is None or want == have for have, want in zip(array.shape, shape, strict=True)
    )
    if array.dtype.name not in dtypes or not fits:
        wanted = ", ".join("any" if n is None else str(n) for n in shape)
        raise _ShardError(
            f"tensor {name} is {array.dtype.name} {list(array.shape)}, expected {'|'.join(dtypes)} [{wanted}]"
        )
    return array


class GraphStore:
    """Read-only, memory-mapped view of a graph store folder with random access by (sentence, layer, head).

    Opening reads and validates the manifest (:mod:`pipeline.graphs.manifest`); each shard is verified on
    first use (size, sha256, header, shapes); any problem is a one-line :class:`UserError` naming the file.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        manifest = read_manifest(self.folder)
        self.manifest: dict[str, Any] = manifest.model_dump(mode="json")
        self.split: str = manifest.split
        self.kinds: tuple[str, ...] = tuple(manifest.attention_kinds)
        self.layers: int = manifest.layers
        self.heads: int = manifest.heads
        self.head_dim: int = manifest.head_dim
        self.scaling: float = manifest.scaling
        self.sides = manifest.sides
        self._shards = [_Shard(self.folder, entry, manifest) for entry in manifest.shards]
        self._starts = [shard.start for shard in self._shards]

    def __len__(self) -> int:
        return self.manifest["counts"]["sentences"]

    @property
    def nbytes(self) -> int:
        """Total bytes of the shards."""
        return self.manifest["counts"]["bytes"]

    def causal(self, kind: str) -> bool:
        """Whether ``kind``'s valid pairs are causal (key j ≤ query i)."""
        return self._kind(kind)["causal"]

    def sides_of(self, kind: str) -> tuple[str, str]:
        """(query side, key side) of ``kind``."""
        spec = self._kind(kind)
        return spec["query_side"], spec["key_side"]

    def lengths(self, side: str) -> np.ndarray:
        """(sentences,) int64 tokens per sentence on ``side`` (``source`` or ``target``)."""
        if side not in self.sides:
            raise ValueError(f"side {side!r} not stored; stored: {', '.join(self.sides)}")
        return np.concatenate([np.asarray(s.tensors[f"lengths.{side}"]) for s in self._shards])

    def sentence_ids(self) -> np.ndarray:
        """(sentences,) int64 dataset row of every stored sentence."""
        return np.concatenate([np.asarray(s.tensors["sentence_ids"]) for s in self._shards])

    def tokens(self, sentence: int, side: str) -> list[str]:
        """The tokens of ``sentence`` on ``side``."""
        shard, local = self._locate(sentence)
        first, last = shard.offsets[side][local], shard.offsets[side][local + 1]
        offsets = shard.tensors[f"tokens.{side}.offsets"][first : last + 1]
        utf8 = shard.tensors[f"tokens.{side}.utf8"][offsets[0] : offsets[-1]].tobytes()
        starts = offsets - offsets[0]
        return [utf8[a:b].decode("utf-8") for a, b in itertools.pairwise(starts)]

    def get(self, sentence: int, layer: int, head: int, kind: str = "decoder_self") -> Record:
        """q, k, gold CSR and tokens of one (sentence, layer, head) of ``kind``."""
        self._check_layer_head(layer, head)
        q_side, k_side = self.sides_of(kind)
        shard, local = self._locate(sentence)
        t = shard.tensors
        q0, q1 = shard.offsets[q_side][local : local + 2]
        k0, k1 = shard.offsets[k_side][local : local + 2]
        ptr = np.array(t[f"{kind}.indptr"][layer, head, q0 : q1 + 1])
        return Record(
            sentence=sentence,
            sentence_id=int(t["sentence_ids"][local]),
            kind=kind,
            layer=layer,
            head=head,
            causal=self.causal(kind),
            q=np.array(t[f"{kind}.q"][layer, head, q0:q1], np.float32),
            k=np.array(t[f"{kind}.k"][layer, head, k0:k1], np.float32),
            indptr=ptr - ptr[0],
            cols=np.array(t[f"{kind}.cols"][ptr[0] : ptr[-1]], np.int64),
            probs=np.array(t[f"{kind}.probs"][ptr[0] : ptr[-1]], np.float32),
            query_tokens=self.tokens(sentence, q_side),
            key_tokens=self.tokens(sentence, k_side),
        )

    def layer_arrays(self, sentence: int, layer: int, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every head of one (sentence, layer): q (H, n, d) and k (H, m, d) float32, gold (H, n, m) bool."""
        self._check_layer_head(layer, 0)
        q_side, k_side = self.sides_of(kind)
        shard, local = self._locate(sentence)
        t = shard.tensors
        q0, q1 = shard.offsets[q_side][local : local + 2]
        k0, k1 = shard.offsets[k_side][local : local + 2]
        n, m = int(q1 - q0), int(k1 - k0)
        gold = np.zeros((self.heads, n, m), bool)
        ptr = np.array(t[f"{kind}.indptr"][layer, :, q0 : q1 + 1])  # (H, n + 1)
        cols = t[f"{kind}.cols"]
        for h in range(self.heads):
            rows = np.repeat(np.arange(n), np.diff(ptr[h]))
            gold[h, rows, cols[ptr[h, 0] : ptr[h, -1]]] = True
        q = np.array(t[f"{kind}.q"][layer, :, q0:q1], np.float32)
        k = np.array(t[f"{kind}.k"][layer, :, k0:k1], np.float32)
        return q, k, gold

    def edge_counts(self, kind: str) -> np.ndarray:
        """(layers, heads, sentences) int64 number of gold edges of every head in every sentence."""
        q_side, _ = self.sides_of(kind)
        counts = []
        for shard in self._shards:
            indptr = shard.tensors[f"{kind}.indptr"]
            offsets = shard.offsets[q_side]
            counts.append(indptr[:, :, offsets[1:]] - indptr[:, :, offsets[:-1]])
        return np.concatenate(counts, axis=2)

    def verify(self) -> list[str]:
        """Check every shard afresh (sha256 re-hashed), then the manifest's token and edge counts.

        One line per problem, naming the file (relative to the store folder); empty when the store is whole.
        Manifest problems never get here: the store refuses to open.
        """
        problems = [f"{s.path.name}: {problem}" for s in self._shards if (problem := s.problem(rehash=True))]
        return problems or self._count_problems()

    def _count_problems(self) -> list[str]:
        """The manifest's token and edge totals that the (verified) shards disagree with."""
        totals = [("tokens", d, sum(int(s.offsets[d][-1]) for s in self._shards)) for d in self.sides]
        totals += [("edges", k, sum(s.tensors[f"{k}.cols"].size for s in self._shards)) for k in self.kinds]
        counts = self.manifest["counts"]
        return [
            f"{MANIFEST}: counts.{group}.{key} = {counts[group][key]}: the shards hold {total}"
            for group, key, total in totals
            if counts[group][key] != total
        ]

    def _kind(self, kind: str) -> dict[str, Any]:
        if kind not in self.kinds:
            raise ValueError(f"attention kind {kind!r} not in this store; stored: {', '.join(self.kinds)}")
        return self.manifest["kinds"][kind]

    def _locate(self, sentence: int) -> tuple[_Shard, int]:
        if not 0 <= sentence < len(self):
            raise IndexError(f"sentence {sentence} out of range [0, {len(self)})")
        shard = self._shards[bisect.bisect_right(self._starts, sentence) - 1]
        return shard, sentence - shard.start

    def _check_layer_head(self, layer: int, head: int) -> None:
        if not 0 <= layer < self.layers:
            raise IndexError(f"layer {layer} out of range [0, {self.layers})")
        if not 0 <= head < self.heads:
            raise IndexError(f"head {head} out of range [0, {self.heads})")
