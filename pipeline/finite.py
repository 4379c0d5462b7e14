"""The guard every training loop shares: a non-finite loss stops the stage instead of saving garbage."""

from __future__ import annotations

import math

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
