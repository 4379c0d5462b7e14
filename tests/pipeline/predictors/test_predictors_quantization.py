"""Quantization predictor against ranking and binning written as plain loops."""

import math

import pytest
import torch

from attention_kernels.attended import shared_bucket_pairs
from pipeline.predictors import HeadInputs, QuantizationPredictor
from pipeline.predictors.quantization import quantile_bins, quantization_buckets


def loop_bins(x, valid, n_bins, tokens_per_bin=None):
    """bins[b][h][i][d]: rank among valid tokens by (value, position), cut into ⌈L/β⌉-sized bins (or s)."""
    batch, heads, n, r = x.shape
    bins = [[[[-1] * r for _ in range(n)] for _ in range(heads)] for _ in range(batch)]
    for b in range(batch):
        tokens = [i for i in range(n) if valid[b, i]]
        size = tokens_per_bin or math.ceil(len(tokens) / n_bins)
        for h in range(heads):
            for d in range(r):
                ranked = sorted(tokens, key=lambda i: (x[b, h, i, d].item(), i))
                for rank, i in enumerate(ranked):
                    bins[b][h][i][d] = rank // size
    return bins


def make_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    # small integers so that ties are common
    q = torch.randint(0, 4, (3, 2, 7, 3), generator=gen).float()
    k = torch.randint(0, 4, (3, 2, 8, 3), generator=gen).float()
    q_valid = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [0] + [1] * 4 + [0] * 2], dtype=torch.bool)
    k_valid = torch.tensor([[1] * 8, [1] * 6 + [0] * 2, [1] * 3 + [0] * 5], dtype=torch.bool)
    return q, k, q_valid, k_valid


@pytest.mark.parametrize("n_bins", [1, 2, 3, 4, 10])
def test_bins_match_loops(n_bins):
    q, _, q_valid, _ = make_inputs(0)
    assert quantile_bins(q, n_bins, q_valid).tolist() == loop_bins(q, q_valid, n_bins)


@pytest.mark.parametrize("n_bins", [2, 3, 5])
def test_mask_matches_loops(n_bins):
    q, k, q_valid, k_valid = make_inputs(1)
    qb, kb = loop_bins(q, q_valid, n_bins), loop_bins(k, k_valid, n_bins)
    inputs = HeadInputs(q, k, q_valid, k_valid, causal=False, q_proj=q, k_proj=k)
    prediction = QuantizationPredictor(bins=n_bins).predict(0, inputs)
    mask = shared_bucket_pairs(prediction.q_buckets, prediction.k_buckets)
    for b in range(3):
        for h in range(2):
            for i in range(7):
                for j in range(8):
                    shared = any(qb[b][h][i][d] >= 0 and qb[b][h][i][d] == kb[b][h][j][d] for d in range(3))
                    assert mask[b, h, i, j].item() == shared, (b, h, i, j)


def test_bucket_ids_are_unique_per_dimension():
    q, k, q_valid, k_valid = make_inputs(2)
    n_bins = 3
    qb, kb = quantization_buckets(q, k, n_bins, q_valid, k_valid)
    assert qb.dtype == torch.int32 and qb.shape == (3, 2, 7, 3) and kb.shape == (3, 2, 8, 3)
    bins = quantile_bins(q, n_bins, q_valid)
    for d in range(3):
        real = bins[..., d] >= 0
        assert torch.equal(qb[..., d][real], bins[..., d][real].int() + d * n_bins)
    assert torch.equal(qb < 0, bins < 0)


def test_bins_are_balanced_and_padding_is_none():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 1, 12, 2, generator=gen)
    valid = torch.tensor([[1] * 10 + [0] * 2], dtype=torch.bool)
    bins = quantile_bins(x, 4, valid)  # L = 10 → bins of ⌈10/4⌉ = 3: sizes 3, 3, 3, 1
    for d in range(2):
        assert torch.bincount(bins[0, 0, :10, d]).tolist() == [3, 3, 3, 1]
    assert (bins[0, 0, 10:] == -1).all()


@pytest.mark.parametrize("tokens_per_bin", [1, 2, 3])
def test_fixed_tokens_per_bin_matches_loops_and_grows_with_the_sentence(tokens_per_bin):
    q, k, q_valid, k_valid = make_inputs(4)
    bins = quantile_bins(q, None, q_valid, tokens_per_bin=tokens_per_bin)
    assert bins.tolist() == loop_bins(q, q_valid, None, tokens_per_bin)
    # the 7-token sentence gets more bins than the 4-token one
    assert (
        bins[0].max() == math.ceil(7 / tokens_per_bin) - 1
        and bins[2].max() == math.ceil(4 / tokens_per_bin) - 1
    )
    predictor = QuantizationPredictor(tokens_per_bin=tokens_per_bin)
    assert predictor.bins is None and "tokens_per_bin" in predictor.describe()
    prediction = predictor.predict(0, HeadInputs(q, k, q_valid, k_valid, causal=False, q_proj=q, k_proj=k))
    qb, kb = loop_bins(q, q_valid, None, tokens_per_bin), loop_bins(k, k_valid, None, tokens_per_bin)
    mask = shared_bucket_pairs(prediction.q_buckets, prediction.k_buckets)
    expected = [
        [[[any(qb[b][h][i][d] >= 0 and qb[b][h][i][d] == kb[b][h][j][d] for d in range(3)) for j in range(8)]
          for i in range(7)] for h in range(2)] for b in range(3)
    ]  # fmt: skip
    assert mask.tolist() == expected
