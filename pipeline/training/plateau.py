"""The plateau guard: a trained model must predict its tokens clearly better than their frequencies do.

A model stuck on the unigram plateau predicts every token from how often it occurs and nothing else: its
cross-entropy is then the entropy of the label tokens' frequency distribution,

    H₁ = −Σ_w f(w) log f(w)   (nats; f: the frequency of label token w in the training split)

which is what the simplest model (a unigram table) scores. Attention graphs extracted from such a model
show nothing learned, so :func:`require_learning` stops the stage that trained it when its validation loss
is not below (1 − margin) · H₁.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from pipeline.errors import UserError


def unigram_entropy(rows: Iterable[Sequence[int]], *, vocab_size: int, pad_id: int | None = None) -> float:
    """H₁ in nats of the token ids in ``rows`` (ids ≥ 0 and other than ``pad_id``; −100 and padding are no
    label), 0 for no tokens."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for row in rows:
        ids = np.asarray(row, dtype=np.int64)
        keep = ids >= 0  # −100: no label
        if pad_id is not None:
            keep &= ids != pad_id
        ids = ids[keep]
        counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
    total = counts.sum()
    if total == 0:
        return 0.0
    frequencies = counts[counts > 0] / total
    return float(-(frequencies * np.log(frequencies)).sum())


def require_learning(stage: str, loss: float, entropy: float, margin: float) -> None:
    """Raise a one-line :class:`UserError` unless the validation ``loss`` lies below (1 − ``margin``) · the
    unigram ``entropy`` H₁ (both in nats per label token)."""
    bound = (1.0 - margin) * entropy
    if not (math.isfinite(loss) and loss < bound):
        raise UserError(
            f"{stage}: the trained model's validation loss {loss:.4f} is not below {bound:.4f} = "
            f"(1 − {stage}.unigram_margin {margin}) × the unigram entropy {entropy:.4f} of its training "
            f"labels: it has not learned beyond token frequencies; look at {stage}.train (lr, warmup_steps, "
            f"max_steps, batch_size) and {stage}.model, or lower {stage}.unigram_margin"
        )
