"""The approximate indexer's low-rank rows on a 7-bit grid.

Each row x of q_index and of k_index (one query's, one key's) is replaced by step·Q with

    step = max_c |x_c| / 63   (1 where x is all zero),   Q_c = round(x_c / step) ∈ [−63, 63]

(round half to even). The predicted sets Ŝ are defined on these values, on every path: the scanned C++
kernel computes the low-rank scores scale·step_q·step_k·Σ_c Q_qc·Q_kc from the codes in integers
(``attention_kernels/native/coded_product.h``: u8 × s8 multiply-adds do four float FMAs' work per
instruction), the PyTorch paths from these floats; the two differ by round-off only. A row's grid is its
own, so a key's codes do not change as more keys arrive (a decoder's cache keeps them).

The grid costs the indexer little: on the lm profile's teacher (rank 24, n = 4096) the largest deviation of
the approximate output from dense entmax stayed within 0.006 × max |o| of the float indexer's on every layer
(``docs/kernels.md``). Coding a coded row again finds the same Q (x/step lies within a few roundings of an
integer of at most 63), so the kernel may code what this module returns.
"""

from __future__ import annotations

import torch

__all__ = ["LEVELS", "on_grid"]

LEVELS = 63
"""Codes lie in [−LEVELS, LEVELS]: 7 bits, so that the kernel adds two u8 × s8 pair sums in 16 bits."""


def on_grid(x: torch.Tensor) -> torch.Tensor:
    """x (…, r) with each row over the last dim on its own 7-bit grid (module docstring), detached, in
    float32 (float64 stays float64)."""
    x = x.detach()
    x = x if x.dtype == torch.float64 else x.float()
    step = x.abs().amax(dim=-1, keepdim=True) / LEVELS  # (…, 1)
    step = torch.where(step > 0, step, torch.ones_like(step))
    return torch.round(x / step).clamp(-LEVELS, LEVELS) * step
