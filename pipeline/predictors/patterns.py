"""Fixed attention patterns and the set of pairs a head may attend at all.

All masks are boolean, ``True`` meaning "query i may attend key j".

- window of size w:   W_ij = [ |i − j| ≤ ⌊w/2⌋ ]   for w ≥ 1, and no pair for w = 0
  (w = 1 is the diagonal, w = 3 adds one neighbour each side, ...).
- global:             G_ij = [ i = f_q or j = f_k ]  with f_q / f_k the sentence's first valid query / key,
                      and/or [ i = l_q or j = l_k ] with l_q / l_k its last valid query / key.
- valid pairs:        V_ij = valid_q(i) ∧ valid_k(j) ∧ (j ≤ i when causal).

Positions are absolute indices into the padded tensors, so left and right padding both work.
"""

from __future__ import annotations

import torch


def window_mask(n: int, m: int, window: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """(n, m) mask with W_ij = [|i − j| ≤ window // 2]; all ``False`` when ``window == 0``."""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if window == 0:
        return torch.zeros(n, m, dtype=torch.bool, device=device)
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(m, device=device)[None, :]
    return (i - j).abs() <= window // 2


def first_valid(valid: torch.Tensor) -> torch.Tensor:
    """(batch,) index of the first ``True`` of each (batch, n) row (0 for an all-padding row)."""
    return valid.int().argmax(-1)


def last_valid(valid: torch.Tensor) -> torch.Tensor:
    """(batch,) index of the last ``True`` of each (batch, n) row (n − 1 for an all-padding row)."""
    n = valid.shape[-1]
    return n - 1 - valid.flip(-1).int().argmax(-1)


def global_mask(
    q_valid: torch.Tensor, k_valid: torch.Tensor, *, first: bool = True, last: bool = False
) -> torch.Tensor:
    """(batch, n, m) mask of the first valid token's row and column and/or the last valid token's.

    ``q_valid`` is (batch, n) and ``k_valid`` (batch, m), ``True`` on real tokens.
    """
    n, m = q_valid.shape[-1], k_valid.shape[-1]
    i = torch.arange(n, device=q_valid.device)[None, :, None]  # (1, n, 1)
    j = torch.arange(m, device=k_valid.device)[None, None, :]  # (1, 1, m)
    mask = torch.zeros(q_valid.shape[0], n, m, dtype=torch.bool, device=q_valid.device)
    if first:
        mask = mask | (i == first_valid(q_valid)[:, None, None]) | (j == first_valid(k_valid)[:, None, None])
    if last:
        mask = mask | (i == last_valid(q_valid)[:, None, None]) | (j == last_valid(k_valid)[:, None, None])
    return mask


def valid_pairs(q_valid: torch.Tensor, k_valid: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """(batch, n, m) mask V_ij = valid_q(i) ∧ valid_k(j) ∧ (j ≤ i when ``causal``)."""
    mask = q_valid[:, :, None] & k_valid[:, None, :]
    if causal:
        n, m = q_valid.shape[-1], k_valid.shape[-1]
        mask = mask & torch.ones(n, m, dtype=torch.bool, device=mask.device).tril()
    return mask
