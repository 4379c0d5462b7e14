"""Window, global and valid-pair masks against their definitions written as plain loops."""

import pytest
import torch

from pipeline.predictors.buckets import predicted_graph
from pipeline.predictors.patterns import global_mask, valid_pairs, window_mask

# sentence 0 full, sentence 1 right-padded, sentence 2 left-padded
Q_VALID = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
K_VALID = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)


def positions(valid_row):
    return [i for i, v in enumerate(valid_row.tolist()) if v]


@pytest.mark.parametrize("window", [0, 1, 2, 3, 5, 9])
def test_window_matches_loops(window):
    n, m = 5, 7
    expected = [[window > 0 and abs(i - j) <= window // 2 for j in range(m)] for i in range(n)]
    assert window_mask(n, m, window).tolist() == expected


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("last", [True, False])
def test_global_matches_loops(first, last):
    mask = global_mask(Q_VALID, K_VALID, first=first, last=last)
    for b in range(Q_VALID.shape[0]):
        qs, ks = positions(Q_VALID[b]), positions(K_VALID[b])
        for i in range(Q_VALID.shape[1]):
            for j in range(K_VALID.shape[1]):
                expected = (first and (i == qs[0] or j == ks[0])) or (last and (i == qs[-1] or j == ks[-1]))
                assert mask[b, i, j].item() == expected, (b, i, j)


@pytest.mark.parametrize("causal", [True, False])
def test_valid_pairs_matches_loops(causal):
    mask = valid_pairs(Q_VALID, K_VALID, causal=causal)
    for b in range(Q_VALID.shape[0]):
        for i in range(Q_VALID.shape[1]):
            for j in range(K_VALID.shape[1]):
                expected = bool(Q_VALID[b, i] and K_VALID[b, j]) and (not causal or j <= i)
                assert mask[b, i, j].item() == expected


def test_causal_sentence_has_triangular_pair_count():
    length = 7
    valid = torch.ones(1, length, dtype=torch.bool)
    assert valid_pairs(valid, valid, causal=True).sum().item() == length * (length + 1) // 2


@pytest.mark.parametrize("causal", [True, False])
def test_predicted_graph_is_union_then_valid(causal):
    gen = torch.Generator().manual_seed(0)
    learned = torch.rand(3, 2, 5, 6, generator=gen) < 0.2
    graph = predicted_graph(
        learned, Q_VALID, K_VALID, causal=causal, window=3, global_first=True, global_last=True
    )
    for b in range(3):
        qs, ks = positions(Q_VALID[b]), positions(K_VALID[b])
        for h in range(2):
            for i in range(5):
                for j in range(6):
                    pattern = abs(i - j) <= 1 or i in (qs[0], qs[-1]) or j in (ks[0], ks[-1])
                    ok = i in qs and j in ks and (not causal or j <= i)
                    assert graph[b, h, i, j].item() == ((bool(learned[b, h, i, j]) or pattern) and ok)


def test_window_only_baseline_broadcasts_over_heads():
    graph = predicted_graph(None, Q_VALID, K_VALID, causal=False, window=1)
    assert graph.shape == (3, 1, 5, 6)
    assert graph[0, 0].tolist() == window_mask(5, 6, 1).tolist()
