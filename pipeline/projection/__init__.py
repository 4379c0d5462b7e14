"""Per-head low-rank projections of queries and keys learned from gold attention graphs.

- :mod:`~pipeline.projection.model`: :class:`HeadProjections` and its safetensors file.
- :mod:`~pipeline.projection.hinge`: the contrastive hinge loss and its negative sampling.
- :mod:`~pipeline.projection.train`: training one layer and its held-out loss.
"""

from pipeline.projection.hinge import hinge_loss, hinge_losses, sample_negatives
from pipeline.projection.model import HeadProjections, load_projections, save_projections
from pipeline.projection.train import (
    Batch,
    BatchesFn,
    batch_masks,
    held_out_loss,
    in_memory_batches,
    train_layer_projections,
)

__all__ = [
    "Batch",
    "BatchesFn",
    "HeadProjections",
    "batch_masks",
    "held_out_loss",
    "hinge_loss",
    "hinge_losses",
    "in_memory_batches",
    "load_projections",
    "sample_negatives",
    "save_projections",
    "train_layer_projections",
]
