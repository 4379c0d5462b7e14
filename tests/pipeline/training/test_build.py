"""A model trained from scratch starts from weights its seed fixes (the Trainer seeds only what follows)."""

from __future__ import annotations

import torch

from pipeline.models.marian import build_marian
from pipeline.params import ModelShape

SHAPE = ModelShape(d_model=16, encoder_layers=1, decoder_layers=1, heads=2, ffn_dim=32, max_positions=32)


def weights(seed: int, *, before: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(before)  # whatever the global generator held before must not matter
    return build_marian(SHAPE, 50, 0, 1, seed).state_dict()


def test_the_seed_alone_fixes_the_initial_weights():
    first, again, other = weights(3, before=0), weights(3, before=1), weights(4, before=0)
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)
