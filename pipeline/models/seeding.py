"""Weights drawn from a stream of their own, derived from the training seed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

Model = TypeVar("Model")


def built_with_seed(seed: int, build: Callable[[], Model]) -> Model:
    """``build()`` with the global generator at a seed derived from ``seed``, restored afterwards.

    The Trainer restarts the global generator from ``seed`` itself for dropout and data order, and weights
    drawn from that very stream would be correlated with them; the Trainer seeds only what happens after the
    model exists, so the weights need a seed of their own.
    """
    init_seed = int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        return build()
