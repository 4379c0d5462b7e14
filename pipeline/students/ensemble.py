"""Attention self-ensembles (Hussain et al., KDD 2023, § 3.5): S sampled sub-models of one SSA model.

Each sub-model is the model with its own SSA draw in every self-attention layer (same weights, different
attention patterns); the ensemble predicts the mean of their next-token distributions:

    p(y_t | y_<t, x) = (1/S) Σ_s p_s(y_t | y_<t, x),   log p = logsumexp_s(log p_s) − log S

All S sub-models run in one batch. The inputs are repeated S times with the replica outermost
(``tensor.repeat(S, 1)``: rows [s·N, (s+1)·N) are replica s), and beam search keeps that layout (each row
grows into consecutive beams, reordered only within a sentence), so every call's batch splits into S equal
contiguous chunks, each drawing its own subsets (:func:`pipeline.attention.ssa.sampling` with ``replicas``).
A forward hook replaces the logits of every replica by the ensemble's log-probabilities, so beam search makes
the same choices in every replica and the first N rows hold the answer. Draws come from a generator seeded
with ``seed``; S = 1 is exactly one sampled pass with that seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from datasets import Dataset
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import ModelOutput

from pipeline.attention.ssa import sampling
from pipeline.errors import UserError
from pipeline.metrics.translation import perplexity, translate


def _repeat(value: Any, samples: int) -> Any:
    """``value`` repeated ``samples`` times along its first (batch) dimension, replica outermost."""
    if not isinstance(value, Tensor) or value.dim() == 0:
        return value
    return value.repeat(samples, *[1] * (value.dim() - 1))


def _average_replicas(samples: int, output: ModelOutput) -> ModelOutput:
    """Replace ``output.logits`` (S·N, …, V) by the log of the replicas' mean distribution, for every
    replica; ``loss``, when the model computed one, still belongs to each replica's own logits."""
    logits = output.logits
    log_probs = torch.log_softmax(logits.float(), dim=-1).unflatten(0, (samples, -1))  # (S, N, …, V)
    mean = torch.logsumexp(log_probs, dim=0) - math.log(samples)  # (N, …, V)
    output.logits = _repeat(mean.to(logits.dtype), samples)  # (S·N, …, V)
    return output


class Replicated:
    """A model seen through its ensemble: takes N-row inputs and returns N-row outputs.

    Calling it, or its ``generate``, runs the wrapped model on the inputs repeated S times (replica
    outermost) and keeps the first N rows of the logits or generated sequences; every other attribute is
    the model's own. Valid only inside :func:`self_ensemble`, whose hook makes the replicas agree.
    """

    def __init__(self, model: PreTrainedModel, samples: int) -> None:
        self.model, self.samples = model, samples

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, **inputs: Any) -> ModelOutput:
        output = self.model(**{name: _repeat(value, self.samples) for name, value in inputs.items()})
        output.logits = output.logits[: output.logits.shape[0] // self.samples]
        return output

    def generate(self, **inputs: Any) -> Tensor:
        sequences = self.model.generate(
            **{name: _repeat(value, self.samples) for name, value in inputs.items()}
        )
        return sequences[: sequences.shape[0] // self.samples]


@contextmanager
def self_ensemble(model: PreTrainedModel, samples: int, seed: int) -> Iterator[Replicated]:
    """Within the block ``model`` is an ensemble of ``samples`` SSA sub-models drawn with ``seed``.

    Inputs repeated replica-outermost go straight to ``model`` (every replica's logits become the
    ensemble's log-probabilities); the yielded :class:`Replicated` does the repeating and the cutting.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise UserError(f"self-ensemble samples must be an integer >= 1; got {samples!r}")

    def hook(_module: nn.Module, _args: Any, output: ModelOutput) -> ModelOutput:
        return _average_replicas(samples, output)

    with sampling(model, seed, replicas=samples):
        handle = model.register_forward_hook(hook)
        try:
            yield Replicated(model, samples)
        finally:
            handle.remove()


def ensemble_translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: Dataset,
    batch_size: int,
    samples: int,
    seed: int,
) -> tuple[list[str], list[str]]:
    """:func:`~pipeline.metrics.translation.translate` by a self-ensemble of ``samples`` sub-models: beam
    search (the model's generation config) over the ensemble's mean next-token distribution."""
    with self_ensemble(model, samples, seed) as ensemble:
        return translate(ensemble, tokenizer, dataset, batch_size)


def ensemble_perplexity(
    model: PreTrainedModel, dataset: Dataset, batch_size: int, samples: int, seed: int
) -> dict[str, float]:
    """:func:`~pipeline.metrics.translation.perplexity` of a self-ensemble of ``samples`` sub-models: each
    target token scored by the mean of the sub-models' probabilities."""
    with self_ensemble(model, samples, seed) as ensemble:
        return perplexity(ensemble, dataset, batch_size)
