"""Pair counting (``pipeline.attention.counting``): pooled per head, averaged over every head of the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.attention.counting import PairCounter, measure_sparsity


class Layers(nn.Module):
    """Two counting modules with different head counts, as an encoder and a decoder may have."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.decoder = PairCounter(), PairCounter()


def test_layers_with_different_head_counts_average_over_every_head():
    model = Layers()
    with measure_sparsity(model) as result:
        model.encoder.record_counts(torch.tensor([1.0, 3.0]), torch.tensor([4.0, 4.0]))  # 2 heads
        model.decoder.record_counts(torch.tensor([2.0, 0.0, 2.0, 4.0]), torch.tensor([4.0] * 4))  # 4 heads
        model.encoder.record_counts(torch.tensor([1.0, 1.0]), torch.tensor([4.0, 4.0]))  # pooled per head
    assert result["per_layer_head"] == [[0.75, 0.5], [0.5, 1.0, 0.5, 0.0]]
    assert result["sparsity"] == pytest.approx((0.75 + 0.5 + 0.5 + 1.0 + 0.5 + 0.0) / 6)
    assert not model.encoder.measuring and not model.decoder.measuring


def test_nothing_counted_leaves_the_result_empty():
    with measure_sparsity(Layers()) as result:
        pass
    assert result == {}
