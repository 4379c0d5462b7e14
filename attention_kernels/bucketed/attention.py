"""Bucketed sparse attention: one validated entry point, a Triton kernel on CUDA and a PyTorch path elsewhere.

``bucketed_attention(q, k, v, q_buckets, k_buckets, *, alpha, causal, window, global_tokens, scale)``
computes, per (batch, head), o_i = Σ_{j∈A_i} p_ij v_j with p_i = α-entmax(scale · q_i·K) over

    A_i = {j : i and j share a bucket id ≥ 0} ∪ {j : |i − j| ≤ w // 2} ∪ {j : i < g or j < g}
          (∩ {j ≤ i} when causal, w = window: 0 or an odd size, g = global_tokens),

as :mod:`attention_kernels.attended` defines it for the whole project; softmax when α = 1, zeros for a query
with no key, each pair counted once however many buckets it shares.
With ``backend="auto"``, CUDA tensors in float16, bfloat16 or float32 run the Triton kernel (imported only
then, so CPU use never needs Triton) and everything else runs the sub-quadratic PyTorch path, which also
accepts float64. ``backend="triton"`` or ``"torch"`` forces one; the Triton kernel takes CPU tensors only
under ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests and debugging). Arguments are validated here
once, for both backends.

:func:`attention_kernels.indexed.attention.indexed_attention` is α-entmax attention whose keys are chosen by a
low-rank indexer, exact in its ``"certified"`` mode; import it from its module (the pipeline's stages do not
need it, so importing this package does not load it).
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from attention_kernels.attended import window_radius
from attention_kernels.bucketed import torch_path
from attention_kernels.checks import check_backend, check_causal, check_qkv, check_scale

__all__ = ["bucketed_attention"]

_ID_MAX = 2**31 - 1  # ids travel as int32


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
    batch, heads, n, m, _ = check_qkv(q, k, v, same_value_dim=True, grouped=True)
    _check_buckets("q_buckets", q_buckets, (batch, heads, n), q.device)
    _check_buckets("k_buckets", k_buckets, (batch, heads, m), q.device)
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not math.isfinite(alpha) or alpha < 1:
        raise ValueError(f"alpha must be a finite number ≥ 1 (1 = softmax, 1.5 = entmax15); got {alpha!r}")
    causal = check_causal(causal, n, m)
    radius = window_radius(window)
    global_tokens = _check_count("global_tokens", global_tokens)
    scale = check_scale(scale)
    backend = check_backend(backend, q)
    return float(alpha), causal, radius, global_tokens, scale, backend


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

    q (batch, heads, n, d); k, v (batch, kv_heads, m, d) with kv_heads a divisor of heads (grouped-query
    attention: query head h reads key/value head h // (heads / kv_heads), and no copy of the keys and
    values is made per query head); q_buckets (batch, heads, n, T) and k_buckets (batch, heads, m, T′)
    integer ids, −1 for none, one assignment of the keys per query head. Differentiable in q, k and v.
    ``backend``: "auto", "triton" or "torch" (see the module docstring). Bad arguments raise ValueError
    before any work.
    """
    alpha, causal, radius, global_tokens, scale, backend = _validate(
        q, k, v, q_buckets, k_buckets, alpha, causal, window, global_tokens, scale, backend
    )
    options = dict(alpha=alpha, causal=causal, radius=radius, global_tokens=global_tokens, scale=scale)
    if backend == "triton":
        from attention_kernels.bucketed.triton_kernel import triton_bucketed_attention

        return triton_bucketed_attention(q, k, v, q_buckets, k_buckets, **options)
    return torch_path.torch_bucketed_attention(q, k, v, q_buckets, k_buckets, **options)
