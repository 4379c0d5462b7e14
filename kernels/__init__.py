"""Bucketed sparse attention: one validated entry point, a Triton kernel on CUDA and a PyTorch path elsewhere.

``bucketed_attention(q, k, v, q_buckets, k_buckets, *, alpha, causal, window, global_tokens, scale)``
computes, per (batch, head), o_i = Σ_{j∈A_i} p_ij v_j with p_i = α-entmax(scale · q_i·K) over

    A_i = {j : i and j share a bucket id ≥ 0} ∪ {j : |i − j| ≤ w // 2} ∪ {j : i < g or j < g}
          (∩ {j ≤ i} when causal, w = window: 0 or an odd size, g = global_tokens),

as :mod:`kernels.attended` defines it for the whole project; softmax when α = 1, zeros for a query with
no key, each pair counted once however many buckets it shares.
With ``backend="auto"``, CUDA tensors in float16, bfloat16 or float32 run the Triton kernel (imported only
then, so CPU use never needs Triton) and everything else runs the sub-quadratic PyTorch path, which also
accepts float64. ``backend="triton"`` or ``"torch"`` forces one; the Triton kernel takes CPU tensors only
under ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests and debugging). Arguments are validated here
once, for both backends.
"""

from __future__ import annotations

import math
import os
from numbers import Integral, Real

import torch

from kernels import torch_bucketed
from kernels.attended import window_radius

__all__ = ["bucketed_attention"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TRITON_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_ID_MAX = 2**31 - 1  # ids travel as int32
BACKENDS = ("auto", "triton", "torch")


def _check_buckets(name: str, buckets: object, lead: tuple[int, int, int], device: torch.device) -> None:
    """Bucket ids: an integer tensor (batch, heads, tokens, T ≥ 1) on ``device`` with values in [−1, 2³¹)."""
    if not isinstance(buckets, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of bucket ids; got {type(buckets).__name__}")
    if buckets.is_floating_point() or buckets.is_complex() or buckets.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer bucket ids (int32); got dtype {buckets.dtype}")
    if buckets.dim() != 4 or tuple(buckets.shape[:3]) != lead or buckets.shape[3] < 1:
        raise ValueError(
            f"{name} must be (batch, heads, tokens, T) = ({', '.join(map(str, lead))}, T ≥ 1); "
            f"got {tuple(buckets.shape)}"
        )
    if buckets.device != device:
        raise ValueError(f"{name} is on {buckets.device} but q is on {device}")
    if buckets.numel():
        low, high = (int(x) for x in torch.aminmax(buckets))
        if low < -1 or high > _ID_MAX:
            raise ValueError(
                f"{name} ids must be −1 (none) or in [0, {_ID_MAX}]; got values in [{low}, {high}]"
            )


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"{name} must be an integer ≥ 0; got {value!r}")
    return int(value)


def _validate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_buckets: object,
    k_buckets: object,
    alpha: object,
    causal: object,
    window: object,
    global_tokens: object,
    scale: object,
    backend: object,
) -> tuple[float, bool, int, int, float | None, str]:
    """Raise ValueError naming the first bad argument; return the options the backends take (window as
    its radius w // 2, −1 for none)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be (batch, heads, tokens, d); got shape {tuple(x.shape)}")
        if x.dtype not in _FLOATS:
            raise ValueError(f"{name} must be float16, bfloat16, float32 or float64; got {x.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    batch, heads, n, d = q.shape
    m = k.shape[2]
    if min(batch, heads, n, d) < 1 or m < 1:
        raise ValueError(f"q and k must be non-empty; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if tuple(k.shape) != (batch, heads, m, d):
        raise ValueError(f"k must be (batch, heads, m, d) = ({batch}, {heads}, m, {d}); got {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}; got {tuple(v.shape)}")
    _check_buckets("q_buckets", q_buckets, (batch, heads, n), q.device)
    _check_buckets("k_buckets", k_buckets, (batch, heads, m), q.device)
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not math.isfinite(alpha) or alpha < 1:
        raise ValueError(f"alpha must be a finite number ≥ 1 (1 = softmax, 1.5 = entmax15); got {alpha!r}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False; got {causal!r}")
    if causal and n != m:
        raise ValueError(f"causal attention needs as many queries as keys; got n = {n}, m = {m}")
    radius = window_radius(window)
    global_tokens = _check_count("global_tokens", global_tokens)
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, Real) or not math.isfinite(scale) or scale <= 0
    ):
        raise ValueError(f"scale must be None (1/√d) or a finite number > 0; got {scale!r}")
    backend = _check_backend(backend, q)
    return float(alpha), causal, radius, global_tokens, None if scale is None else float(scale), backend


def _check_backend(backend: object, q: torch.Tensor) -> str:
    """The backend that will run: "triton" or "torch"."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    if backend == "auto":
        return "triton" if q.is_cuda and q.dtype in _TRITON_FLOATS else "torch"
    if backend == "triton":
        if q.dtype not in _TRITON_FLOATS:
            raise ValueError(f"backend 'triton' takes float16, bfloat16 or float32; got {q.dtype}")
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 for Triton's CPU interpreter); "
                f"got tensors on {q.device}"
            )
    return backend


def bucketed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    alpha: float = 1.5,
    causal: bool = False,
    window: int = 0,
    global_tokens: int = 0,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Bucketed α-entmax attention (softmax for α = 1); returns (batch, heads, n, d) in q's dtype.

    q (batch, heads, n, d); k, v (batch, heads, m, d); q_buckets (batch, heads, n, T) and k_buckets
    (batch, heads, m, T′) integer ids, −1 for none. Differentiable in q, k and v. ``backend``: "auto",
    "triton" or "torch" (see the module docstring). Bad arguments raise ValueError before any work.
    """
    alpha, causal, radius, global_tokens, scale, backend = _validate(
        q, k, v, q_buckets, k_buckets, alpha, causal, window, global_tokens, scale, backend
    )
    options = dict(alpha=alpha, causal=causal, radius=radius, global_tokens=global_tokens, scale=scale)
    if backend == "triton":
        from kernels.triton_bucketed import triton_bucketed_attention

        return triton_bucketed_attention(q, k, v, q_buckets, k_buckets, **options)
    return torch_bucketed.torch_bucketed_attention(q, k, v, q_buckets, k_buckets, **options)
