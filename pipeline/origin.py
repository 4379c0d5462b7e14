"""What a fitted artifact must have been fitted on, checked where the artifact is read.

Projections and predictor states are fitted on one teacher's attention graphs; they record that teacher's
fingerprint (``extra["graphs"]``, the graph store's ``teacher`` entry) and hold one tensor slice per head
of every layer. Used with another teacher, or with a model of another shape, they would silently predict
nonsense or fail deep inside a forward pass. An :class:`Origin` names what the reader expects; its checks
raise one-line :class:`UserError`\\ s naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from pipeline.fingerprint import cached_file_sha256


@dataclass(frozen=True)
class Origin:
    """The teacher weights (sha256 of model.safetensors; ``None``: unknown, not checked) and the attention
    shape (layers × heads × head size of one kind) a fitted artifact must match; ``source`` names them in
    errors."""

    teacher_sha256: str | None
    layers: int
    heads: int
    head_dim: int
    source: str

    @classmethod
    def of_store(cls, store: Any) -> Origin:
        """What a :class:`~pipeline.graphs.GraphStore` was extracted from."""
        return cls(
            store.manifest["teacher"].get("model_sha256"),
            store.layers,
            store.heads,
            store.head_dim,
            f"the graph store {store.folder}",
        )

    @classmethod
    def of_teacher(cls, folder: str | os.PathLike, layers: int, heads: int, head_dim: int) -> Origin:
        """A local teacher checkpoint whose attention kind has ``layers`` × ``heads`` × ``head_dim``."""
        weights = Path(folder) / "model.safetensors"
        sha = cached_file_sha256(weights) if weights.is_file() else None
        return cls(sha, layers, heads, head_dim, f"the teacher {folder}")

    def check_teacher(self, path: str | os.PathLike, graphs: Mapping[str, Any]) -> None:
        """``graphs`` is the teacher fingerprint ``path`` records; it must name the same weights."""
        stored = graphs.get("model_sha256")
        if self.teacher_sha256 is not None and stored != self.teacher_sha256:
            raise UserError(
                f"{path} was fitted on the graphs of another teacher ({graphs.get('checkpoint')}) than "
                f"{self.source}; re-run the stages that fit it on this teacher's graphs"
            )

    def check_layers(self, path: str | os.PathLike, layers: Iterable[int]) -> None:
        """A fitted artifact covers every layer, no more."""
        layers = sorted(layers)
        if layers != list(range(self.layers)):
            raise UserError(f"{path} covers layers {layers}; {self.source} has layers 0 … {self.layers - 1}")

    def check_heads(
        self, path: str | os.PathLike, what: str, heads: int, head_dim: int | None = None
    ) -> None:
        """``what`` (a layer or tensor of ``path``) is for these heads (and this head size, if given)."""
        if heads != self.heads or (head_dim is not None and head_dim != self.head_dim):
            shape = f"{heads} heads" + ("" if head_dim is None else f" × {head_dim} dims")
            raise UserError(
                f"{path}: {what} is for {shape}; {self.source} has {self.heads} heads × {self.head_dim} dims"
            )
