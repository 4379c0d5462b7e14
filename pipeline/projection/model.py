"""Per-head low-rank projections of queries and keys, and their safetensors file.

For each head h of a layer, g_h(x) = W_h x + b_h maps a d-dimensional query or key to r dimensions
(r = 4 by default). Queries and keys have their own maps, or one shared map when ``shared=True``. All heads
are applied at once: x′[b, h, n] = W[h] x[b, h, n] + b[h].

File format (one file for every layer): tensors ``layer{L}.q_weight`` (H, r, d), ``layer{L}.q_bias`` (H, r)
and, unless shared, ``layer{L}.k_weight`` / ``layer{L}.k_bias``; the safetensors header holds one JSON
string under ``"projections"``: ``{"layers": {"L": {n_heads, head_dim, rank, shared}}, "extra": {...}}``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from pipeline.atomic import atomic_path
from pipeline.errors import UserError

METADATA_KEY = "projections"


class HeadProjections(nn.Module):
    """Query and key projections d → r for the H heads of one layer.

    Parameters: ``q_weight`` (H, r, d), ``q_bias`` (H, r) and, unless ``shared``, ``k_weight``, ``k_bias``.
    Initialised like :class:`torch.nn.Linear` (uniform in ±1/√d), from ``generator`` when given.
    """

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        rank: int = 4,
        *,
        shared: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.rank, self.shared = n_heads, head_dim, rank, shared
        self.q_weight = nn.Parameter(torch.empty(n_heads, rank, head_dim))
        self.q_bias = nn.Parameter(torch.empty(n_heads, rank))
        if not shared:
            self.k_weight = nn.Parameter(torch.empty(n_heads, rank, head_dim))
            self.k_bias = nn.Parameter(torch.empty(n_heads, rank))
        bound = 1 / math.sqrt(head_dim)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-bound, bound, generator=generator)

    def config(self) -> dict[str, Any]:
        """Constructor arguments, JSON-ready."""
        return {"n_heads": self.n_heads, "head_dim": self.head_dim, "rank": self.rank, "shared": self.shared}

    def project_queries(self, q: torch.Tensor) -> torch.Tensor:
        """(batch, H, n, d) → (batch, H, n, r)."""
        return torch.einsum("bhnd,hrd->bhnr", q, self.q_weight) + self.q_bias[:, None, :]

    def project_keys(self, k: torch.Tensor) -> torch.Tensor:
        """(batch, H, m, d) → (batch, H, m, r), through the query map when shared."""
        if self.shared:
            return self.project_queries(k)
        return torch.einsum("bhnd,hrd->bhnr", k, self.k_weight) + self.k_bias[:, None, :]

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected (queries, keys): (batch, H, n, r) and (batch, H, m, r)."""
        return self.project_queries(q), self.project_keys(k)


def save_projections(
    path: str | os.PathLike,
    layers: Mapping[int, HeadProjections],
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write every layer's projections to one safetensors file (atomically); ``extra`` is stored as JSON."""
    tensors = {
        f"layer{idx}.{name}": p.detach().cpu().contiguous()
        for idx, module in layers.items()
        for name, p in module.named_parameters()
    }
    header = {"layers": {str(idx): m.config() for idx, m in layers.items()}, "extra": dict(extra or {})}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={METADATA_KEY: json.dumps(header)})


def load_projections(
    path: str | os.PathLike, device: torch.device | str = "cpu"
) -> tuple[dict[int, HeadProjections], dict[str, Any]]:
    """Read a file written by :func:`save_projections`: ({layer: module}, extra)."""
    if not os.path.isfile(path):
        raise UserError(f"projections file {path} not found; run the project stage first")
    with safe_open(str(path), framework="pt", device=str(device)) as f:
        meta = f.metadata() or {}
        if METADATA_KEY not in meta:
            raise UserError(f"{path}: not a projections file (no {METADATA_KEY!r} metadata)")
        header = json.loads(meta[METADATA_KEY])
        layers = {}
        for idx, config in header["layers"].items():
            module = HeadProjections(**config).to(device)
            names = [name for name, _ in module.named_parameters()]
            module.load_state_dict({name: f.get_tensor(f"layer{idx}.{name}") for name in names})
            layers[int(idx)] = module
    return layers, header["extra"]
