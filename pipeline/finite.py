"""Guards against NaN and infinity: a non-finite loss stops a training loop instead of saving garbage, and
non-finite weights stop whatever loads them before they spread through a forward pass."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from pipeline.errors import UserError


def require_finite(loss: float, what: str, step: int) -> float:
    """Return ``loss``, or raise a one-line :class:`UserError` when it is NaN or infinite.

    A diverged fit writes NaN weights that every later stage would read as a valid artifact; stopping at
    the first bad step names the cause while the inputs that caused it are still known.
    """
    if not math.isfinite(loss):
        raise UserError(
            f"{what}: the loss is {loss} at step {step}; nothing was saved (lower the learning rate, or "
            "check the inputs for NaN or infinite values)"
        )
    return loss


def first_non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor of ``tensors`` that holds NaN or ±inf, else None."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return name
    return None


def require_finite_tensors(tensors: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise a one-line :class:`UserError` naming the first floating-point tensor of ``tensors`` (a state
    dict) that holds NaN or infinite values; ``what`` names their file or folder.

    Writers refuse such weights, so a checkpoint that holds them was edited or written by another tool;
    caught at load, the message names the tensor instead of a failure deep inside the first forward pass.
    """
    name = first_non_finite(tensors)
    if name is not None:
        raise UserError(
            f"{what}: {name} holds NaN or infinite values (a corrupt or diverged checkpoint); re-run the "
            "stage that wrote it"
        )
