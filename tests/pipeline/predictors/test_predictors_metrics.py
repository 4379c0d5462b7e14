"""Graph scores on a hand-made example (causal, with padding)."""

import pytest
import torch

from pipeline.predictors.metrics import GoldGraph, GraphScoreSums, graph_scores, summarize

N = 4


def graph(*pairs):
    g = torch.zeros(N, N, dtype=torch.bool)
    for i, j in pairs:
        g[i, j] = True
    return g


def example():
    """Three sentences (lengths 3, 2, 0) × two heads; causal, so valid pairs are j ≤ i < L.

    Sentence 0 (6 valid pairs):
      head 0: gold {00, 10, 21, 22}; pred {00, 10, 11, 22} + future 01 + padding 30 (ignored)
              sparsity 1 − 4/6 = 1/3, recall 3/4, precision 3/4, exact: q0 ✓ q1 ✓ q2 ✗ → 2/3
      head 1: gold {00, 11, 22}; pred ∅ → sparsity 1, recall 0, precision undefined, exact 0
    Sentence 1 (3 valid pairs):
      head 0: gold {00, 11}; pred {00, 10, 11} → sparsity 0, recall 1, precision 2/3, exact 1
      head 1: gold ∅; pred {00} → sparsity 2/3, recall undefined, precision 0, exact undefined
    Sentence 2 is all padding: every score undefined.
    """
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    gold = torch.stack(
        [
            torch.stack([graph((0, 0), (1, 0), (2, 1), (2, 2)), graph((0, 0), (1, 1), (2, 2))]),
            torch.stack([graph((0, 0), (1, 1)), graph()]),
            torch.stack([graph((0, 0)), graph((0, 0))]),
        ]
    )
    pred = torch.stack(
        [
            torch.stack([graph((0, 0), (1, 0), (1, 1), (2, 2), (0, 1), (3, 0)), graph()]),
            torch.stack([graph((0, 0), (1, 0), (1, 1)), graph((0, 0))]),
            torch.stack([graph((0, 0)), graph((0, 0))]),
        ]
    )
    return pred, gold, valid


def test_hand_made_example():
    pred, gold, valid = example()
    sums = graph_scores(pred, gold, valid, valid, causal=True)
    means = sums.means()
    assert means["sparsity"].tolist() == pytest.approx([1 / 6, 5 / 6])
    assert means["recall"].tolist() == pytest.approx([7 / 8, 0.0])
    assert means["precision"].tolist() == pytest.approx([17 / 24, 0.0])
    assert means["exact"].tolist() == pytest.approx([5 / 6, 0.0])
    assert sums.counts["sparsity"].tolist() == [2, 2]
    assert sums.counts["recall"].tolist() == [2, 1]
    assert sums.counts["precision"].tolist() == [2, 1]


def test_sums_accumulate_over_batches():
    pred, gold, valid = example()
    whole = graph_scores(pred, gold, valid, valid, causal=True)
    parts = GraphScoreSums.zeros(2)
    for b in range(3):
        parts = parts + graph_scores(
            pred[b : b + 1], gold[b : b + 1], valid[b : b + 1], valid[b : b + 1], causal=True
        )
    for name in whole.sums:
        assert torch.allclose(parts.sums[name], whole.sums[name])
        assert torch.equal(parts.counts[name], whole.counts[name])


def test_one_gold_graph_scores_many_predictions_and_a_head_shared_mask():
    """The sweep scores every setting against one GoldGraph: the same sums as scoring each alone, and a
    mask shared by the heads (b, 1, n, m) scores as its copy per head."""
    pred, gold, valid = example()
    target = GoldGraph.of(gold, valid, valid, causal=True)
    for candidate in (pred, pred.flip(1), gold, pred[:, :1], torch.ones_like(pred[:, :1])):
        alone = graph_scores(candidate.expand_as(gold), gold, valid, valid, causal=True)
        shared = target.scores(candidate)
        for name in alone.sums:
            assert torch.equal(shared.sums[name], alone.sums[name]), name
            assert torch.equal(shared.counts[name], alone.counts[name]), name
    assert target.scores(gold).means()["recall"].tolist() == [1.0, 1.0]


def test_summary_averages_heads_and_layers_and_skips_undefined():
    pred, gold, valid = example()
    layer0 = graph_scores(pred, gold, valid, valid, causal=True)
    layer1 = graph_scores(
        pred[1:2], gold[1:2], valid[1:2], valid[1:2], causal=True
    )  # head 1 recall undefined
    summary = summarize([layer0, layer1])
    assert summary["sparsity"] == pytest.approx((1 / 6 + 5 / 6 + 0 + 2 / 3) / 4)
    assert summary["recall"] == pytest.approx((7 / 8 + 0 + 1) / 3)
    table = summary["per_layer_head"]["recall"]
    assert table[0] == pytest.approx([7 / 8, 0.0])
    assert table[1][0] == pytest.approx(1.0) and table[1][1] is None
