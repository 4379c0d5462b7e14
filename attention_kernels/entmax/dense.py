"""Dense α-entmax over the last dimension, with −inf marking excluded keys.

    α-entmax(z) = [(α − 1) z − τ 1]₊^{1/(α−1)},   τ such that the result sums to 1.

α = 1 is softmax, α = 1.5 is computed exactly by sorting (``entmax.entmax15``; long rows partially, see
:data:`PARTIAL_SORT`), α = 2 is sparsemax (also exact), any other α > 1 — and a per-head tensor α — by
bisection (``entmax.entmax_bisect``). This is the normaliser of dense α-entmax attention and of the dense
reference every kernel is tested against; it imports neither ``transformers`` nor the pipeline.
"""

from __future__ import annotations

import torch
from entmax import entmax15, entmax_bisect, sparsemax
from torch import Tensor

# Rows of more keys than this sort only their PARTIAL_SORT largest scores first (entmax's own ``k``), and
# twice as many whenever the support does not fit: exact, and about 4x faster at 1024 keys, where a learned
# sparse head keeps a few dozen. Shorter rows sort whole.
PARTIAL_SORT = 64
PARTIAL_SORT_ABOVE = 128


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype attention scores and their normaliser are computed in for inputs of ``dtype``: float32 for
    half and single precision (entmax is unstable in fp16/bf16), float64 for float64 (a gradcheck at strict
    tolerances)."""
    return torch.promote_types(dtype, torch.float32)


def entmax_normalize(scores: Tensor, alpha: float | Tensor) -> Tensor:
    """α-entmax over the last dimension of float32 ``scores`` in which −inf marks excluded keys.

    Rows with no finite score (a padding query that may attend to nothing) give all zeros instead of NaN.
    ``alpha`` is a float ≥ 1 or a tensor broadcastable to ``scores`` with size 1 in the last dimension
    (gradients flow into it). Excluded keys always get exactly zero probability and zero gradient.
    """
    has_key = (scores != float("-inf")).any(dim=-1, keepdim=True)
    # Neutral finite scores keep the normalizers away from all −inf rows (entmax15 indexes out of range and
    # softmax returns NaN there); those rows are zeroed afterwards.
    scores = scores.masked_fill(~has_key, 0.0)
    if isinstance(alpha, Tensor):
        probs = entmax_bisect(scores, alpha.to(scores.dtype), dim=-1)
    elif alpha == 1.0:
        probs = torch.softmax(scores, dim=-1)
    elif alpha == 1.5:
        probs = entmax15(scores, dim=-1, k=_partial_sort(scores))
    elif alpha == 2.0:
        probs = sparsemax(scores, dim=-1, k=_partial_sort(scores))
    else:
        probs = entmax_bisect(scores, alpha, dim=-1)
    return probs.masked_fill(~has_key, 0.0)


def _partial_sort(scores: Tensor) -> int | None:
    """entmax's ``k`` for rows of ``scores``: :data:`PARTIAL_SORT` for long rows, None (a full sort) else."""
    return PARTIAL_SORT if scores.shape[-1] > PARTIAL_SORT_ABOVE else None
