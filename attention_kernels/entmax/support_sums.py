"""The row sums that locate an α-entmax threshold, read from the scores in one fused pass.

For rows of scores s (…, M), per row a shift m (the query's largest score), a trial threshold τ and a
candidate τ′ (…), with x = (α − 1)(s − m):

    s₁ = Σ_j (x_j − τ)₊,   s₂ = Σ_j (x_j − τ)₊²,   k = |{j : x_j > τ}|,   k′ = |{j : x_j > τ′}|.

s₁, s₂ and k give the next Newton step and the exact threshold on the support {x > τ} (for α = 2 and
α = 1.5); k′ checks whether the previous step's exact value kept its support. Written as tensor operations
these are about eleven passes over the scores, each writing a temporary; compiled (``torch.compile``,
TorchInductor's C++ backend on CPU) they are one read of s with four running sums per row, several times
faster, and x is never written. Where compiling is not possible (no C++ compiler, an unsupported
platform), the same function runs eagerly, with one warning.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch


def _sums(
    scores: torch.Tensor, shift: torch.Tensor, tau: torch.Tensor, candidate: torch.Tensor, scale: float
) -> tuple[torch.Tensor, ...]:
    """s₁, s₂, k, k′ per row (…) of scores (…, M), shift, τ and τ′ (…), scale = α − 1."""
    x = (scores - shift[..., None]) * scale  # (…, M)
    tau, candidate = tau[..., None], candidate[..., None]
    d = (x - tau).clamp_min(0)  # (…, M)
    return d.sum(-1), (d * d).sum(-1), (d > 0).to(x.dtype).sum(-1), (x > candidate).to(x.dtype).sum(-1)


_eager = False  # set once compiling has failed: every later call runs eagerly


@functools.cache
def _compiled() -> Callable[..., tuple[torch.Tensor, ...]]:
    """``_sums`` compiled, made on first use: ``torch.compile`` imports Dynamo (seconds), which a process
    whose thresholds the C++ kernel finds never needs."""
    return torch.compile(_sums, dynamic=True)


def support_sums(
    scores: torch.Tensor, shift: torch.Tensor, tau: torch.Tensor, candidate: torch.Tensor, scale: float
) -> tuple[torch.Tensor, ...]:
    """s₁, s₂, k, k′ (each (…)) of rows of scores (…, M) shifted by m (…) and scaled by α − 1, at τ and
    τ′ (…); the per-row values may also be shaped (…, 1). A candidate of +∞ counts nothing.

    The compiled kernel always sees one layout, scores (R, M) with R, M ≥ 2 and fresh per-row values (R,):
    Dynamo compiles anew for another rank, a size of 1 or a view of another base, and after eight
    compilations of one function it runs it eagerly for good. So there is one compilation per dtype.
    """
    global _eager
    rows = scores.shape[:-1]
    flat = scores.reshape(-1, scores.shape[-1]).detach()  # (R, M); detached, it is no view of a base
    per_row = [v.reshape(-1).clone() for v in (shift, tau, candidate)]  # (R,) each, not views
    if not _eager and min(flat.shape) >= 2:
        try:
            with torch.no_grad():  # sums are never differentiated: one kernel whatever the grad mode
                sums = _compiled()(flat, *per_row, scale)
            return tuple(s.view(rows) for s in sums)
        except Exception as err:  # compilation failed: the environment lacks what Inductor needs
            _eager = True
            warnings.warn(
                f"entmax threshold sums run eagerly (torch.compile failed: {err!r:.200})", stacklevel=2
            )
    return tuple(s.view(rows) for s in _sums(flat, *per_row, scale))
