"""Per-head low-rank projections of queries and keys, and their safetensors file.

For each head h of a layer, a map g_h sends a d-dimensional query or key to r dimensions (r = 4 by default):

- linear (``hidden=None``): g_h(x) = W_h x + b_h, with W_h (r, d), b_h (r,);
- tanh MLP (``hidden=e``): g_h(x) = W_h tanh(V_h x + c_h) + b_h, with V_h (e, d), c_h (e,), W_h (r, e),
  b_h (r,), the projector Sparsefinder's reference code trains.

Queries and keys have their own maps, or one shared map when ``shared=True``. All heads are applied at once:
x′[b, h, n] = g_h(x[b, h, n]).

File format (one file for every layer): tensors ``layer{L}.q_weight`` (H, r, d or e), ``layer{L}.q_bias``
(H, r), with an MLP also ``layer{L}.q_hidden_weight`` (H, e, d) and ``layer{L}.q_hidden_bias`` (H, e); unless
shared, the same under ``k_``. The safetensors header holds one JSON string under ``"projections"``:
``{"format_version": 1, "layers": {"L": {n_heads, head_dim, rank, shared[, hidden]}}, "extra": {...}}``; a
layer config without ``hidden`` is linear. A file without ``format_version`` (written before it was
recorded, or by another tool) is refused.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from attention_kernels.predictor_maps import head_mlp
from pipeline.errors import UserError
from pipeline.origin import Origin
from pipeline.tensor_file import read_tensor_file, write_tensor_file

METADATA_KEY = "projections"
FORMAT_VERSION = 1


class HeadProjections(nn.Module):
    """Query and key projections d → r for the H heads of one layer, linear or through a tanh hidden layer.

    Parameters, per side s ∈ {q, k} (only q when ``shared``): ``s_weight`` (H, r, d) and ``s_bias`` (H, r)
    when linear; with ``hidden = e``, ``s_hidden_weight`` (H, e, d), ``s_hidden_bias`` (H, e), then
    ``s_weight`` (H, r, e) and ``s_bias`` (H, r). Each map is initialised like :class:`torch.nn.Linear`
    (weight and bias uniform in ±1/√fan_in), from ``generator`` when given, in that parameter order.
    """

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        rank: int = 4,
        *,
        shared: bool = False,
        hidden: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if hidden is not None and hidden < 1:
            raise ValueError(f"hidden must be None (linear) or a positive int, got {hidden}")
        self.n_heads, self.head_dim, self.rank = n_heads, head_dim, rank
        self.shared, self.hidden = shared, hidden
        fan_ins: list[int] = []
        for side in ("q",) if shared else ("q", "k"):
            if hidden is not None:
                fan_ins += self._add_map(f"{side}_hidden", hidden, head_dim)
            fan_ins += self._add_map(side, rank, head_dim if hidden is None else hidden)
        with torch.no_grad():
            for p, fan_in in zip(self.parameters(), fan_ins, strict=True):
                bound = 1 / math.sqrt(fan_in)
                p.uniform_(-bound, bound, generator=generator)

    def _add_map(self, prefix: str, out_dim: int, in_dim: int) -> list[int]:
        """Register ``prefix_weight`` (H, out, in) and ``prefix_bias`` (H, out); their fan-ins."""
        setattr(self, f"{prefix}_weight", nn.Parameter(torch.empty(self.n_heads, out_dim, in_dim)))
        setattr(self, f"{prefix}_bias", nn.Parameter(torch.empty(self.n_heads, out_dim)))
        return [in_dim, in_dim]

    def config(self) -> dict[str, Any]:
        """Constructor arguments, JSON-ready; ``hidden`` only for an MLP, so linear configs stay as before."""
        config = {
            "n_heads": self.n_heads,
            "head_dim": self.head_dim,
            "rank": self.rank,
            "shared": self.shared,
        }
        if self.hidden is not None:
            config["hidden"] = self.hidden
        return config

    def _project(self, x: torch.Tensor, side: str) -> torch.Tensor:
        """(batch, H, n, d) → (batch, H, n, r) through side ``side``'s maps.

        Without gradients on the CPU the C++ maps run (:func:`attention_kernels.predictor_maps.head_mlp`).
        Otherwise the hidden layer's tanh is 2σ(2u) − 1 with its constants folded into the maps,
        W tanh(V x + c) + b = 2W σ(2V x + 2c) + (b − W 1) (doubling is exact), so the one pass over the
        hidden units is an in-place σ: this torch's CPU tanh runs lane by lane, about 2 ns per float, 9× its
        σ.
        """
        weight, bias = getattr(self, f"{side}_weight"), getattr(self, f"{side}_bias")
        inner_weight = inner_bias = None
        if self.hidden is not None:
            inner_weight = getattr(self, f"{side}_hidden_weight")
            inner_bias = getattr(self, f"{side}_hidden_bias")
        native = head_mlp(x, weight, bias, inner_weight, inner_bias)
        if native is not None:
            return native
        if inner_weight is not None:
            inner_weight, inner_bias = 2 * inner_weight, 2 * inner_bias
            weight, bias = 2 * weight, bias - weight.sum(-1)
            # matmul, not einsum: einsum's batched product of the same is 2.5-4.5× slower on CPU; in place on
            # the fresh product, which would cost page faults anew (σ's backward reads only its output)
            x = torch.matmul(x, inner_weight.mT).add_(inner_bias[:, None, :]).sigmoid_()  # (b, H, n, e)
        return torch.einsum("bhnd,hrd->bhnr", x, weight).add_(bias[:, None, :])

    def project_queries(self, q: torch.Tensor) -> torch.Tensor:
        """(batch, H, n, d) → (batch, H, n, r)."""
        return self._project(q, "q")

    def project_keys(self, k: torch.Tensor) -> torch.Tensor:
        """(batch, H, m, d) → (batch, H, m, r), through the query map when shared."""
        return self._project(k, "q" if self.shared else "k")

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected (queries, keys): (batch, H, n, r) and (batch, H, m, r)."""
        return self.project_queries(q), self.project_keys(k)


def save_projections(
    path: str | os.PathLike,
    layers: Mapping[int, HeadProjections],
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write every layer's projections to one safetensors file (atomically); ``extra`` is stored as JSON.

    Non-finite weights (a diverged fit) are refused rather than saved.
    """
    tensors = {
        f"layer{idx}.{name}": p for idx, module in layers.items() for name, p in module.named_parameters()
    }
    header = {
        "format_version": FORMAT_VERSION,
        "layers": {str(idx): m.config() for idx, m in layers.items()},
        "extra": dict(extra or {}),
    }
    write_tensor_file(path, tensors, METADATA_KEY, header)


def load_projections(
    path: str | os.PathLike, device: torch.device | str = "cpu", *, origin: Origin | None = None
) -> tuple[dict[int, HeadProjections], dict[str, Any]]:
    """Read a file written by :func:`save_projections`: ({layer: module}, extra).

    The tensors must hash to the header's ``tensors_sha256``; with ``origin``, the file must have been fitted
    on its teacher and cover its layers, heads and head size. Every problem is a one-line :class:`UserError`.
    """
    header, tensors = read_tensor_file(
        path, METADATA_KEY, "projections file", "run the project stage", version=FORMAT_VERSION
    )
    try:
        configs = {int(idx): dict(config) for idx, config in header["layers"].items()}
        extra = dict(header["extra"])
        layers = {idx: HeadProjections(**config) for idx, config in configs.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UserError(f"{path}: the projections header is malformed ({err!r})") from None
    if origin is not None:
        origin.check_teacher(path, extra.get("graphs", {}))
        origin.check_layers(path, layers)
    for idx, module in layers.items():
        if origin is not None:
            origin.check_heads(path, f"layer {idx}", module.n_heads, module.head_dim)
        state = {name: tensors.get(f"layer{idx}.{name}") for name, _ in module.named_parameters()}
        for name, tensor in state.items():
            expected = tuple(getattr(module, name).shape)
            if tensor is None or tuple(tensor.shape) != expected:
                found = "missing" if tensor is None else f"of shape {tuple(tensor.shape)}"
                raise UserError(f"{path}: layer{idx}.{name} is {found}; its header asks for {expected}")
        module.load_state_dict(state)
    return {idx: module.to(device) for idx, module in layers.items()}, extra
