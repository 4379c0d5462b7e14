"""The attended set: which keys a query may attend. One definition for the kernels, predictors and metrics.

For a head with n queries and m keys, positions counted from 0 in the padded sequences (right padding, so the
first positions are the first real tokens), query i attends key j iff

    (i, j) ∈ A  =  ( S ∪ W ∪ G ) ∩ C ∩ V

    S = {(i, j) : q_buckets[i] ∩ k_buckets[j] ∖ {−1} ≠ ∅}     shared bucket id (the learned part)
    W = {(i, j) : |i − j| ≤ ⌊w / 2⌋}   for w ≥ 1, ∅ for w = 0   window of size w (the paper's knob: 1 is the
                                                                 diagonal, 3 adds one neighbour each side)
    G = {(i, j) : i < g or j < g}                                the first g tokens are global
    C = {(i, j) : j ≤ i}   when causal (needs n = m), else all   causality
    V = {(i, j) : query i and key j are real tokens}             valid pairs (padding excluded)

w is odd (or 0): an even size would name the same band as the odd size above it. The kernels take no
padding mask, so callers keep V by giving padding no bucket and by cutting padded rows and columns;
:func:`valid_pairs` is V ∩ C, the pairs a head may attend at all and the denominator of every sparsity.
"""

from __future__ import annotations

from numbers import Integral

import torch


def window_radius(window: object) -> int:
    """The band's radius ⌊w / 2⌋ for an odd window size w, −1 for w = 0 (no band); ValueError otherwise."""
    is_size = isinstance(window, Integral) and not isinstance(window, bool) and window >= 0
    if not is_size or (window > 0 and window % 2 == 0):
        raise ValueError(
            f"window must be 0 (none) or an odd size w (|i − j| ≤ w // 2: 1, 3, 5, ...); got {window!r}"
        )
    return int(window) // 2 if window > 0 else -1


def has_pattern(radius: int, global_tokens: int) -> bool:
    """Whether W ∪ G holds any pair: a band (``radius`` ≥ 0, see :func:`window_radius`) or global tokens."""
    return radius >= 0 or global_tokens > 0


def causal_pairs(n: int, m: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """(n, m) C: j ≤ i. Causal attention pairs a sequence with itself, so n must equal m."""
    if n != m:
        raise ValueError(f"causal attention needs as many queries as keys; got n = {n}, m = {m}")
    return torch.ones(n, m, dtype=torch.bool, device=device).tril()


def pattern_pairs(
    n: int,
    m: int,
    *,
    window: int = 0,
    global_tokens: int = 0,
    q_offset: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """(n, m) W ∪ G: the window band of size ``window`` and the first ``global_tokens`` rows and columns.

    The queries are positions ``q_offset … q_offset + n − 1`` (a decoding step with m − n cached keys has
    q_offset = m − n), the keys ``0 … m − 1``.
    """
    radius = window_radius(window)
    i = torch.arange(q_offset, q_offset + n, device=device)[:, None]
    j = torch.arange(m, device=device)[None, :]
    pattern = (i - j).abs() <= radius  # radius −1: no pair
    if global_tokens > 0:
        pattern = pattern | (i < global_tokens) | (j < global_tokens)
    return pattern


def shared_bucket_pairs(q_buckets: torch.Tensor, k_buckets: torch.Tensor) -> torch.Tensor:
    """(batch, heads, n, m) S from bucket ids (batch, heads, n | m, T) with −1 for none."""
    n, m = q_buckets.shape[-2], k_buckets.shape[-2]
    leading = torch.broadcast_shapes(q_buckets.shape[:-2], k_buckets.shape[:-2])
    shared = torch.zeros(*leading, n, m, dtype=torch.bool, device=q_buckets.device)
    # one (…, n, m) comparison per pair of id slots, OR-ed in place: comparing all T × T′ slots at once
    # would build a (…, n, m, T, T′) tensor and reduce it, T·T′ times the memory and most of the time
    q_ids = q_buckets.masked_fill(q_buckets < 0, -2)  # "none" (−1) then never equals a key's id or none
    for t in range(q_buckets.shape[-1]):
        for u in range(k_buckets.shape[-1]):
            shared |= q_ids[..., :, t, None] == k_buckets[..., None, :, u]
    return shared


def valid_pairs(q_valid: torch.Tensor, k_valid: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """(batch, n, m) V ∩ C from (batch, n) and (batch, m) masks, nonzero on real tokens."""
    pairs = q_valid.bool()[:, :, None] & k_valid.bool()[:, None, :]
    if causal:
        pairs = pairs & causal_pairs(pairs.shape[1], pairs.shape[2], device=pairs.device)
    return pairs


def attended_mask(
    q_buckets: torch.Tensor,
    k_buckets: torch.Tensor,
    *,
    causal: bool = False,
    window: int = 0,
    global_tokens: int = 0,
) -> torch.Tensor:
    """Boolean (batch, heads, n, m) (S ∪ W ∪ G) ∩ C, the set the kernels compute (V is the caller's)."""
    n, m = q_buckets.shape[-2], k_buckets.shape[-2]
    device = q_buckets.device
    mask = shared_bucket_pairs(q_buckets, k_buckets) | pattern_pairs(
        n, m, window=window, global_tokens=global_tokens, device=device
    )
    if causal:
        mask = mask & causal_pairs(n, m, device=device)
    return mask
