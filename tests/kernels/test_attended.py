"""The attended set's one definition (attention_kernels.attended) against plain loops."""

import pytest
import torch

from attention_kernels.attended import (
    attended_mask,
    pattern_pairs,
    shared_bucket_pairs,
    valid_pairs,
    window_radius,
)

# sentence 0 full, sentence 1 right-padded, sentence 2 left-padded
Q_VALID = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
K_VALID = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)


@pytest.mark.parametrize(("window", "radius"), [(0, -1), (1, 0), (3, 1), (5, 2), (27, 13)])
def test_window_size_names_the_paper_band(window, radius):
    assert window_radius(window) == radius


@pytest.mark.parametrize("window", [-1, 2, 4, 1.0, True, "3", None])
def test_window_must_be_zero_or_odd(window):
    with pytest.raises(ValueError, match=r"window must be 0 \(none\) or an odd size w"):
        window_radius(window)


@pytest.mark.parametrize(("window", "global_tokens"), [(0, 0), (1, 0), (3, 2), (7, 1), (0, 3)])
def test_pattern_matches_loops(window, global_tokens):
    n, m = 6, 9
    expected = [
        [(window > 0 and abs(i - j) <= window // 2) or min(i, j) < global_tokens for j in range(m)]
        for i in range(n)
    ]
    assert pattern_pairs(n, m, window=window, global_tokens=global_tokens).tolist() == expected


@pytest.mark.parametrize("q_offset", [0, 3, 8])
def test_pattern_rows_of_a_decoding_step_are_the_full_patterns_rows(q_offset):
    # a step decoding positions q_offset … m − 1 against m cached keys sees those rows of the whole pattern
    m = 9
    full = pattern_pairs(m, m, window=3, global_tokens=2)
    step = pattern_pairs(m - q_offset, m, window=3, global_tokens=2, q_offset=q_offset)
    assert torch.equal(step, full[q_offset:])


@pytest.mark.parametrize("causal", [True, False])
def test_valid_pairs_matches_loops(causal):
    mask = valid_pairs(Q_VALID, K_VALID, causal=causal)
    for b in range(3):
        for i in range(5):
            for j in range(5):
                expected = bool(Q_VALID[b, i] and K_VALID[b, j]) and (not causal or j <= i)
                assert mask[b, i, j].item() == expected


def test_causal_sentence_has_triangular_pair_count():
    valid = torch.ones(1, 7, dtype=torch.bool)
    assert valid_pairs(valid, valid, causal=True).sum().item() == 7 * 8 // 2


def test_causal_needs_a_square():
    with pytest.raises(ValueError, match="causal attention needs as many queries as keys"):
        valid_pairs(torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool), causal=True)


@pytest.mark.parametrize("causal", [True, False])
def test_attended_mask_matches_loops(causal):
    gen = torch.Generator().manual_seed(0)
    n, t = 11, 2
    qb = torch.randint(-1, 5, (2, 3, n, t), generator=gen, dtype=torch.int32)
    kb = torch.randint(-1, 5, (2, 3, n, t), generator=gen, dtype=torch.int32)
    mask = attended_mask(qb, kb, causal=causal, window=3, global_tokens=1)
    for b, h, i, j in torch.cartesian_prod(*(torch.arange(s) for s in (2, 3, n, n))).tolist():
        shared = bool({x for x in qb[b, h, i].tolist() if x >= 0} & set(kb[b, h, j].tolist()))
        pattern = abs(i - j) <= 1 or i < 1 or j < 1
        assert mask[b, h, i, j].item() == ((shared or pattern) and (not causal or j <= i))


def test_no_bucket_never_matches_no_bucket():
    none = torch.full((1, 1, 2, 2), -1, dtype=torch.int32)
    assert not shared_bucket_pairs(none, none).any()
