"""Hinge loss: a hand-worked example, a loop implementation, and the negative sampler's guarantees."""

import pytest
import torch

from attention_kernels.attended import valid_pairs
from pipeline.projection.hinge import hinge_loss, hinge_losses, sample_negatives


def test_hand_worked_example():
    """Causal, r = 2, ω = 1, with every negative set forced (never more candidates than positives).

    q′0 = (0, 0)  q′1 = (1, 1)  q′2 = (2, 0);   k′0 = (1, 0)  k′1 = (0, 2)  k′2 = (3, 0)

    Sentence 0 (length 3), gold {00, 02 (future: ignored), 11, 20, 22}:
      q0: P = {0}, candidates ∅ → N = ∅:     relu(1 + ‖(0,0)−(1,0)‖²)            = relu(1 + 1)         = 2
      q1: P = {1}, candidates {0} → N = {0}: relu(1 + ‖(1,1)−(0,2)‖² − ‖(1,1)−(1,0)‖²) = relu(1 + 2 − 1) = 2
      q2: P = {0, 2}, candidates {1}:        relu(1 + (1 + 1) − ‖(2,0)−(0,2)‖²)  = relu(1 + 2 − 8)     = 0
      mean over queries = 4/3
    Sentence 1 (length 2, same vectors), gold {00, 11, 12 (padding key: ignored), 22 (padding query)}:
      q0 = 2, q1 = 2 as above → mean 2
    Loss = mean over the two (sentence, head) cells = (4/3 + 2) / 2 = 5/3.
    """
    q = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]]).expand(2, 1, 3, 2)
    k = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]).expand(2, 1, 3, 2)
    gold = torch.zeros(2, 1, 3, 3, dtype=torch.bool)
    for i, j in [(0, 0), (0, 2), (1, 1), (2, 0), (2, 2)]:
        gold[0, 0, i, j] = True
    for i, j in [(0, 0), (1, 1), (1, 2), (2, 2)]:
        gold[1, 0, i, j] = True
    valid = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    per_cell, counted = hinge_losses(q, k, gold, valid, valid, causal=True, omega=1.0)
    assert per_cell.flatten().tolist() == pytest.approx([4 / 3, 2.0])
    assert counted.all()
    assert hinge_loss(q, k, gold, valid, valid, causal=True).item() == pytest.approx(5 / 3)


def loop_loss(q, k, pos, neg, omega):
    """Per-cell mean of relu(ω + Σ_P ‖q − k‖² − Σ_N ‖q − k‖²) over queries with a positive."""
    batch, heads, n, _ = q.shape
    out = torch.zeros(batch, heads, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            terms = []
            for i in range(n):
                if pos[b, h, i].any():
                    d = ((q[b, h, i] - k[b, h]) ** 2).sum(-1).double()
                    terms.append(torch.relu(omega + d[pos[b, h, i]].sum() - d[neg[b, h, i]].sum()))
            out[b, h] = sum(terms) / len(terms) if terms else 0.0
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_matches_loops_with_the_same_negatives(causal):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 6, 4, generator=gen)
    m = 6 if causal else 7  # causal attention pairs a sequence with itself
    k = torch.randn(3, 2, m, 4, generator=gen)
    gold = torch.rand(3, 2, 6, m, generator=gen) < 0.3
    q_valid = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0]], dtype=torch.bool)
    k_valid = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4], dtype=torch.bool)[:, :m]
    per_cell, _ = hinge_losses(
        q, k, gold, q_valid, k_valid, causal=causal, generator=torch.Generator().manual_seed(7)
    )
    # replay the sampler with the same seed to learn which negatives were drawn
    allowed = valid_pairs(q_valid, k_valid, causal=causal)[:, None]
    pos = gold & allowed
    neg = sample_negatives(pos, allowed & ~pos, torch.Generator().manual_seed(7))
    assert torch.allclose(per_cell.double(), loop_loss(q, k, pos, neg, 1.0), atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_negatives_are_always_allowed_non_positive_and_balanced(causal):
    gen = torch.Generator().manual_seed(1)
    valid = torch.tensor([[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7], dtype=torch.bool)
    allowed = valid_pairs(valid, valid, causal=causal)[:, None]
    for _ in range(200):
        gold = torch.rand(3, 2, 9, 9, generator=gen) < 0.4  # includes future and padding pairs
        pos = gold & allowed
        candidates = allowed & ~pos
        neg = sample_negatives(pos, candidates, gen)
        assert not (neg & ~allowed).any(), "negative outside valid / causal pairs"
        assert not (neg & gold).any(), "negative that is a positive"
        expected = torch.minimum(pos.sum(-1), candidates.sum(-1))
        assert torch.equal(neg.sum(-1), expected)


def test_negatives_are_uniform():
    # one query, one positive, four candidates: each should be drawn about 1/4 of the time
    pos = torch.tensor([True, False, False, False, False]).view(1, 1, 1, 5)
    gen = torch.Generator().manual_seed(2)
    counts = torch.zeros(5)
    for _ in range(2000):
        counts += sample_negatives(pos, ~pos, gen).view(5).float()
    assert counts[0] == 0
    assert ((counts[1:] / 2000 - 0.25).abs() < 0.04).all()


def test_loss_is_differentiable():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    gold = torch.rand(1, 2, 5, 5, generator=gen) < 0.3
    valid = torch.ones(1, 5, dtype=torch.bool)

    def fn(q, k):
        return hinge_loss(q, k, gold, valid, valid, causal=True, generator=torch.Generator().manual_seed(4))

    assert torch.autograd.gradcheck(fn, (q, k))
