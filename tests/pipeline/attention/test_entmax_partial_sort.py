"""Long rows sort only their largest scores first (entmax's partial sort): the result is exactly the full
sort's, even when the support outgrows the first guess."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15, sparsemax

from attention_kernels.entmax.dense import PARTIAL_SORT, PARTIAL_SORT_ABOVE, entmax_normalize


@pytest.mark.parametrize(("alpha", "full"), [(1.5, entmax15), (2.0, sparsemax)])
@pytest.mark.parametrize("spread", [4.0, 0.003])  # peaked: a small support; flat: one wider than PARTIAL_SORT
def test_partial_sort_equals_the_full_sort(alpha: float, full, spread: float) -> None:
    keys = 2 * PARTIAL_SORT_ABOVE + 1
    scores = torch.randn(3, 2, 40, keys, generator=torch.Generator().manual_seed(0)) * spread
    scores[..., :, -5:] = float("-inf")
    probs = entmax_normalize(scores, alpha)
    reference = full(scores.masked_fill(scores == float("-inf"), -1e9), dim=-1)
    torch.testing.assert_close(probs, reference, rtol=0, atol=1e-6)
    support = (probs > 0).sum(-1)
    if spread < 1:
        assert support.max() > PARTIAL_SORT  # the partial sort had to grow
    else:
        assert support.max() < PARTIAL_SORT
