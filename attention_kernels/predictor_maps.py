"""A learned bucket predictor's per-token maps in C++ (``attention_kernels/native/predictor_maps.cpp``), for
inference on CPU.

    head MLP           y = W tanh(V x + c) + b   per head (or y = W x + b)
    nearest centroids  the top-k of −‖y − c_j‖², nearest first, ties to the lower index

The tensor references are :class:`pipeline.projection.model.HeadProjections` and :func:`nearest_by_tensors`
(beside the kernel; :func:`nearest_centroids` takes whichever runs), which run where these return None: where
gradients are asked for, off the CPU, in another dtype than float32, or where no wide kernel was built (no
compiler, or neither AVX-512 nor AVX2 with FMA; see :mod:`attention_kernels.native`). A tile of tokens goes
through every step of a map while it sits in registers or the cache, where the references pass over the whole
sequence once per step: projecting queries and keys of 1k-8k tokens and 8 heads (64 → 32 → 4) and giving each
its nearest of 16 centroids takes 0.33-0.41× their time on an AVX-512 core and 0.4-0.7× on an AVX2 one, most
of it the MLP's first product (``python -m benchmarks.attention`` prints the whole as ``predict_ms``).
"""

from __future__ import annotations

import ctypes

import torch

from attention_kernels.native import call, library, wide


def wide_kernel() -> ctypes.CDLL | None:
    """The C++ library where it was built for 512-bit or 256-bit vectors with FMA, else None."""
    return wide(library("predictor_maps"), 32)


def _runs_native(*tensors: torch.Tensor | None) -> ctypes.CDLL | None:
    """The wide library where it takes these tensors: float32 on the CPU, no gradient asked for."""
    given = [t for t in tensors if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in given):
        return None
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in given):
        return None
    return wide_kernel()


def head_mlp(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    hidden_weight: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """(b, H, n, r) W_h tanh(V_h x + c_h) + b_h for x (b, H, n, d), V = ``hidden_weight`` (H, e, d), c =
    ``hidden_bias`` (H, e), W = ``weight`` (H, r, e) and b = ``bias`` (H, r); W_h x + b_h with W (H, r, d)
    when ``hidden_weight`` is None. None where the C++ kernel cannot take them (see the module)."""
    kernel = _runs_native(x, weight, bias, hidden_weight, hidden_bias)
    if kernel is None or x.dim() != 4 or weight.dim() != 3:
        return None  # (other shapes: the reference's own error says what is wrong)
    batch, heads, n, d = x.shape
    hidden = 0 if hidden_weight is None else hidden_weight.shape[1]
    rank = weight.shape[1]
    fits = weight.shape == (heads, rank, hidden or d) and bias.shape == (heads, rank)
    if hidden:
        fits = fits and hidden_weight.shape == (heads, hidden, d) and hidden_bias.shape == (heads, hidden)
    if not fits:
        return None  # the reference's own error says what is wrong
    x = x.detach().contiguous()
    given = (hidden_weight, hidden_bias, weight, bias)  # the first two None when linear: no hidden layer
    maps = [None if m is None else m.detach().contiguous() for m in given]
    out = x.new_empty(batch, heads, n, rank)
    call(kernel, "head_mlp_float", x, *maps, batch * heads, heads, n, d, hidden, rank, out)
    return out


def nearest_centroid_ids(points: torch.Tensor, centroids: torch.Tensor, top_k: int) -> torch.Tensor | None:
    """int32 (b, H, n, top_k): the top_k nearest of a head's centroids (H, B, r) to each of ``points``
    (b, H, n, r), nearest first, ties to the lower index, 0 … top_k − 1 for a point that is NaN. None where
    the C++ kernel cannot take them (see the module); a ValueError unless 1 ≤ top_k ≤ B."""
    count = centroids.shape[-2]
    if not 1 <= top_k <= count:
        raise ValueError(f"top_k must be in [1, {count}], got {top_k}")
    kernel = _runs_native(points, centroids)
    if kernel is None or points.dim() != 4:
        return None
    batch, heads, n, rank = points.shape
    if centroids.shape != (heads, count, rank):
        return None  # the reference's own error says what is wrong
    points, centroids = points.detach().contiguous(), centroids.detach().contiguous()
    ids = torch.empty(batch, heads, n, top_k, dtype=torch.int32)
    groups = batch * heads
    call(kernel, "nearest_centroids_float", points, centroids, groups, heads, n, rank, count, top_k, ids)
    return ids


def nearest_centroids(points: torch.Tensor, centroids: torch.Tensor, top_k: int) -> torch.Tensor:
    """int32 (b, H, n, top_k): the top_k nearest of a head's centroids (H, B, r) to each of ``points``
    (b, H, n, r), nearest first, ties to the lower index (as a stable sort gives), 0 … top_k − 1 for a point
    that is NaN; no gradient. In C++ where it runs (:func:`nearest_centroid_ids`), else
    :func:`nearest_by_tensors`."""
    ids = nearest_centroid_ids(points, centroids, top_k)  # (it checks top_k)
    if ids is None:
        ids = nearest_by_tensors(points.detach(), centroids.detach().to(points.dtype), top_k)
    return ids


def nearest_by_tensors(x: torch.Tensor, centroids: torch.Tensor, top_k: int) -> torch.Tensor:
    """:func:`nearest_centroids` by tensor operations (the C++ kernel's reference).

    ‖x − c_j‖² = ‖x‖² + (‖c_j‖² − 2 x·c_j), and the first term is the same for every centroid j, so the
    ranking is that of e_j = ‖c_j‖² − 2 x·c_j: one batched matmul laid out (heads, B, tokens), so that each of
    the top_k passes is a vectorised minimum over B rows of tokens (an argmin over a short last dimension is
    about 30× slower on CPU).
    """
    b, h, n, r = x.shape
    n_centroids = centroids.shape[-2]
    points = x.permute(1, 3, 0, 2).reshape(h, r, b * n)  # (h, r, tokens)
    energy = torch.baddbmm(centroids.square().sum(-1, keepdim=True), centroids, points, alpha=-2.0)
    # NaN (a NaN point's every e_j) as 0 and ±∞ as the largest floats: they tie, and a tie takes the lower
    # index (the differences below would be NaN)
    energy.nan_to_num_()
    # Everything below works in place on the (h, B, tokens) energy, or in one buffer, since fresh tensors of
    # this size cost more in page faults than the arithmetic.
    index = torch.arange(n_centroids, device=x.device, dtype=energy.dtype)[None, :, None]  # (1, B, 1)
    above = energy if top_k == 1 else torch.empty_like(energy)
    nearest = []
    for rank in range(top_k):
        # j + B·[e_j > min e] (the sign of e_j − min e, float arithmetic: cheaper than a boolean mask on CPU):
        # its minimum over j is the first index at the minimum. The differences are taken from the energies
        # themselves at every pass, not from the last pass's differences: two distinct floats never differ
        # by 0, where differences of differences may round together (and ∞ − ∞ is NaN).
        torch.sub(energy, energy.amin(1, keepdim=True), out=above)
        torch.sign(above, out=above)
        first = above.mul_(n_centroids).add_(index).amin(1, keepdim=True)  # (h, 1, tokens)
        nearest.append(first.long())
        if rank + 1 < top_k:
            energy.scatter_(1, nearest[-1], torch.inf)
    return torch.cat(nearest, 1).view(h, top_k, b, n).permute(2, 0, 3, 1).to(torch.int32)  # (b, h, n, top_k)
