"""Quantization predictor: equal-size bins per projected dimension, no learning.

For each of the r projected dimensions, queries and keys are ranked separately among the L valid tokens of
their sentence and cut into β bins of ⌈L/β⌉ tokens:

    bin_d(x_i) = rank_d(x_i) // ⌈L/β⌉ ∈ {0, …, β − 1},

or, with the knob the Sparsefinder MT experiments sweep, into bins of a fixed s tokens (bin = rank // s, so
a longer sentence gets more bins: ⌈L/s⌉).

Query i and key j share bucket (d, b) when both fall in bin b of dimension d, so

    Ĝ = {(i, j) : ∃ d, bin_d(q′_i) = bin_d(k′_j)},

with bucket ids made unique across dimensions as id = d·β + bin (B = r·β buckets in all, one per dimension
for every token; with s tokens per bin, β is the most bins the padded length allows). Ties are broken by
position (stable sort), so the bins always hold exactly ⌈L/β⌉ (or s) tokens except the last. Padding is
ranked after every valid token and gets bucket id −1, so it neither shifts the ranks of real tokens nor
shares a bucket with anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.predictors.base import HeadInputs, Prediction, Predictor, positive_int, register


def quantile_bins(
    x: torch.Tensor,
    n_bins: int | None,
    valid: torch.Tensor | None = None,
    *,
    tokens_per_bin: int | None = None,
) -> torch.Tensor:
    """(batch, heads, n, r) int64 bin of every token in every dimension; −1 on padding.

    ``x`` is (batch, heads, n, r); ``valid`` is (batch, n), ``True`` on real tokens (all when ``None``).
    Bins hold ⌈L/n_bins⌉ tokens, or ``tokens_per_bin`` when given (then ``n_bins`` is ignored).
    """
    if tokens_per_bin is None and (n_bins is None or n_bins < 1):
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    b, _, n, _ = x.shape
    if valid is None:
        valid = torch.ones(b, n, dtype=torch.bool, device=x.device)
    pad = ~valid[:, None, :, None].expand_as(x)  # (b, h, n, r)
    # Two stable sorts give the order (is padding, value, position): padding last, ties by position.
    by_value = x.argsort(dim=-2, stable=True)
    by_padding = pad.gather(-2, by_value).to(torch.int8).argsort(dim=-2, stable=True)
    order = by_value.gather(-2, by_padding)  # order[..., rank, d] = token holding that rank
    positions = torch.arange(n, device=x.device)[:, None].expand_as(order)
    ranks = torch.empty_like(order).scatter_(-2, order, positions)  # inverse permutation
    n_valid = valid.sum(-1)  # (b,)
    if tokens_per_bin is not None:
        bin_size = torch.full_like(n_valid, tokens_per_bin)
    else:
        bin_size = (n_valid + n_bins - 1).div(n_bins, rounding_mode="floor").clamp_min(1)  # ⌈L/β⌉
    bins = ranks.div(bin_size[:, None, None, None], rounding_mode="floor")
    return bins.masked_fill(pad, -1)


def quantization_buckets(
    q_proj: torch.Tensor,
    k_proj: torch.Tensor,
    n_bins: int | None,
    q_valid: torch.Tensor | None = None,
    k_valid: torch.Tensor | None = None,
    *,
    tokens_per_bin: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel bucket ids d·β + bin: int32 (batch, heads, n, r) for queries, (batch, heads, m, r) for keys."""
    r = q_proj.shape[-1]
    if tokens_per_bin is not None:  # as many bins as the longer padded side can fill
        n_bins = -(-max(q_proj.shape[-2], k_proj.shape[-2]) // tokens_per_bin)
    offsets = torch.arange(r, device=q_proj.device) * n_bins  # (r,)

    def ids(x: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        bins = quantile_bins(x, n_bins, valid, tokens_per_bin=tokens_per_bin)
        return torch.where(bins >= 0, bins + offsets, bins).to(torch.int32)

    return ids(q_proj, q_valid), ids(k_proj, k_valid)


@register
@dataclass(frozen=True)
class QuantizationPredictor(Predictor):
    """β equal-size bins per projected dimension (or bins of ``tokens_per_bin`` tokens, which then replaces
    ``bins``); query and key share a bucket when they share a bin."""

    name = "quantization"
    scope = "sentence"
    bins: int | None = 4
    tokens_per_bin: int | None = None

    def check(self) -> None:
        if self.tokens_per_bin is not None:
            positive_int(self.name, "tokens_per_bin", self.tokens_per_bin)
            object.__setattr__(self, "bins", None)  # the bin count now follows each sentence's length
        else:
            positive_int(self.name, "bins", self.bins)

    def predict(self, layer: int, inputs: HeadInputs) -> Prediction:
        q_proj, k_proj = inputs.projected()
        q_ids, k_ids = quantization_buckets(
            q_proj, k_proj, self.bins, inputs.q_valid, inputs.k_valid, tokens_per_bin=self.tokens_per_bin
        )
        return Prediction(q_buckets=q_ids, k_buckets=k_ids)
