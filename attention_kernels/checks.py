"""Argument checks shared by the attention entry points: one-line ValueErrors naming the bad argument."""

from __future__ import annotations

import math
import os
from numbers import Real

import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TRITON_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
BACKENDS = ("auto", "triton", "torch")


def check_qkv(
    q: object, k: object, v: object, *, same_value_dim: bool, grouped: bool = False, **indices: object
) -> tuple[int, int, int, int, int]:
    """(batch, heads, n, m, d) of queries (b, h, n, d), keys (b, h, m, d) and values (b, h, m, d_v), which
    must be float tensors of one dtype on one device (d_v = d when ``same_value_dim``); ``indices`` name
    further float tensors (b, h, n | m, ·) that must live on the same device. With ``grouped``, keys and
    values may have fewer heads h_kv, a divisor of h (grouped-query attention)."""
    tensors = {"q": q, "k": k, "v": v, **indices}
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.dim() != 4:
            last = "d" if name in ("q", "k", "v") else "features"
            raise ValueError(f"{name} must be (batch, heads, tokens, {last}); got shape {tuple(x.shape)}")
        if x.dtype not in FLOATS:
            raise ValueError(f"{name} must be float16, bfloat16, float32 or float64; got {x.dtype}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    devices = {x.device for x in tensors.values()}  # type: ignore[union-attr]
    if len(devices) != 1:
        names = ", ".join(tensors)
        raise ValueError(f"{names} must be on one device; got {', '.join(sorted(map(str, devices)))}")
    batch, heads, n, d = q.shape
    m = k.shape[2]
    if min(batch, heads, n, d) < 1 or m < 1:
        raise ValueError(f"q and k must be non-empty; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    kv_heads = k.shape[1] if grouped and k.shape[1] >= 1 and heads % k.shape[1] == 0 else heads
    if tuple(k.shape) != (batch, kv_heads, m, d):
        if grouped:
            raise ValueError(
                f"k must be (batch, kv_heads, m, d) = ({batch}, a divisor of {heads}, m, {d}); "
                f"got {tuple(k.shape)}"
            )
        raise ValueError(f"k must be (batch, heads, m, d) = ({batch}, {heads}, m, {d}); got {tuple(k.shape)}")
    if same_value_dim and tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}; got {tuple(v.shape)}")
    if tuple(v.shape[:3]) != (batch, kv_heads, m) or v.shape[3] < 1:
        raise ValueError(
            f"v must be (batch, heads, m, d_v) = ({batch}, {kv_heads}, {m}, ·); got {tuple(v.shape)}"
        )
    return batch, heads, n, m, d


def check_causal(causal: object, n: int, m: int) -> bool:
    """``causal`` as a bool; causal attention pairs a sequence with itself (n = m)."""
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False; got {causal!r}")
    if causal and n != m:
        raise ValueError(f"causal attention needs as many queries as keys; got n = {n}, m = {m}")
    return causal


def check_scale(scale: object) -> float | None:
    """None (1/√d) or a finite number > 0, as a float."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be None (1/√d) or a finite number > 0; got {scale!r}")
    return float(scale)


def check_backend(backend: object, q: torch.Tensor) -> str:
    """The backend that will run: "triton" or "torch"."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    if backend == "auto":
        return "triton" if q.is_cuda and q.dtype in TRITON_FLOATS else "torch"
    if backend == "triton":
        if q.dtype not in TRITON_FLOATS:
            raise ValueError(f"backend 'triton' takes float16, bfloat16 or float32; got {q.dtype}")
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 for Triton's CPU interpreter); "
                f"got tensors on {q.device}"
            )
    return backend
