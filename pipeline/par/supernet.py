"""The PAR search space: a supernet whose every sublayer mixes self-attention, feed-forward and identity.

At each position l of a stack (the teacher's sublayer positions: two per layer, around a decoder layer's
cross-attention, which stays as it is)

    X^l = Σ_{i ∈ {s, f, identity}} m_{l,i} · F_i^l(X^{l−1}),

with F_s and F_f the residual sublayers of :mod:`pipeline.par.stacks` (post-LN in a Marian, pre-norm in a
Llama) and F_identity(X) = X. The
mixing weights are m_l = Gumbel-softmax(θ_l, τ) in training (one draw per forward) and softmax(θ_l) in
evaluation; θ_l starts at 0 (uniform). After the search, each position keeps its most probable choice
(:func:`searched_patterns`).

Both candidates at a position start from the teacher layer the position belongs to (its self-attention or
its feed-forward), so the supernet starts from the teacher's own blocks.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from pipeline.attention.interface import attach_state
from pipeline.par.from_teacher import copy_part
from pipeline.par.pattern import CROSS, FEED_FORWARD, SELF, Stack, teacher_pattern
from pipeline.par.stacks import (
    PreNormSublayer,
    Sublayer,
    reads_encoder,
    replace_layers,
    stack_modules,
    sublayer_class,
)

IDENTITY = "identity"
CHOICES = (SELF, FEED_FORWARD, IDENTITY)  # the order of θ's entries


class MixedSublayer(nn.Module):
    """One searched position: Σ_i m_i · F_i(x) over :data:`CHOICES`; θ is ``architecture``."""

    def __init__(
        self,
        attention: Sublayer | PreNormSublayer,
        feed_forward: Sublayer | PreNormSublayer,
        temperature: float,
    ) -> None:
        super().__init__()
        self.attention = attention
        self.feed_forward = feed_forward
        self.temperature = temperature
        self.architecture = nn.Parameter(torch.zeros(len(CHOICES)))

    def mixing(self) -> Tensor:
        """m (3,): a Gumbel-softmax draw in training, the softmax of θ in evaluation."""
        if self.training:
            return nn.functional.gumbel_softmax(self.architecture, tau=self.temperature)
        return self.architecture.softmax(-1)

    def forward(self, hidden_states: Tensor, *args, **kwargs) -> Tensor:  # (b, t, d) → (b, t, d)
        m = self.mixing()
        return (
            m[0] * self.attention(hidden_states, *args, **kwargs)
            + m[1] * self.feed_forward(hidden_states, *args, **kwargs)
            + m[2] * hidden_states
        )


def build_supernet(model: PreTrainedModel, temperature: float) -> None:
    """Turn a teacher ``model`` (Marian or Llama layers) into the supernet, in place: every self-attention
    and feed-forward position becomes a :class:`MixedSublayer` of candidates copied from its teacher layer;
    cross-attention sublayers are the teacher's."""
    config = model.config
    cross = reads_encoder(model)
    teachers = {stack: list(module.layers) for stack, module in stack_modules(model).items()}
    built: dict[Stack, list[nn.Module]] = {}
    for stack, layers in teachers.items():
        built[stack] = []
        mixed = 0  # the searched positions so far: the next one's cache slot
        for layer_index, _ in enumerate(layers):
            for letter in teacher_pattern(stack, 1, cross=cross):
                if letter == CROSS:
                    built[stack].append(sublayer_class(model, CROSS)(config, stack, layer_index))
                    continue
                candidates = (
                    sublayer_class(model, SELF)(config, stack, mixed),
                    sublayer_class(model, FEED_FORWARD)(config, stack, mixed),
                )
                mixed += 1
                built[stack].append(MixedSublayer(*candidates, temperature))
    replace_layers(model, built)
    attach_state(model)  # the attention state (a learned α) of the new attention modules
    for stack, module in stack_modules(model).items():
        owners = _owners(stack, teachers[stack], cross)
        for sublayer, teacher in zip(module.layers, owners, strict=True):
            if isinstance(sublayer, MixedSublayer):
                copy_part(sublayer.attention, teacher)
                copy_part(sublayer.feed_forward, teacher)
            else:
                copy_part(sublayer, teacher)


def _owners(stack: Stack, layers: list[nn.Module], cross: bool) -> Iterator[nn.Module]:
    """The teacher layer each supernet sublayer of ``stack`` belongs to, in order."""
    for layer in layers:
        for _ in teacher_pattern(stack, 1, cross=cross):
            yield layer


def architecture_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every θ of the supernet (what the architecture optimizer updates)."""
    return [module.architecture for module in model.modules() if isinstance(module, MixedSublayer)]


def mixing_weights(model: PreTrainedModel) -> dict[Stack, list[dict[str, float] | str]]:
    """Per stack, per position: {choice: softmax(θ)} for a searched position, ``"c"`` for a kept
    cross-attention."""
    table: dict[Stack, list[dict[str, float] | str]] = {}
    for stack, module in stack_modules(model).items():
        table[stack] = []
        for sublayer in module.layers:
            if isinstance(sublayer, MixedSublayer):
                probabilities = sublayer.architecture.detach().softmax(-1).tolist()
                table[stack].append({c: round(p, 4) for c, p in zip(CHOICES, probabilities, strict=True)})
            else:
                table[stack].append(CROSS)
    return table


def searched_patterns(table: dict[Stack, list[dict[str, float] | str]]) -> dict[Stack, str]:
    """The most probable choice at every position (identity: the position is dropped), as flat patterns.

    A decoder needs one self-attention (else no target token sees the ones before it) and an encoder one
    sublayer; when the argmax leaves a stack without it, the position most likely to be attention is one.
    """
    patterns: dict[Stack, str] = {}
    for stack, positions in table.items():
        letters = [p if isinstance(p, str) else max(CHOICES, key=p.__getitem__) for p in positions]
        searched = [i for i, p in enumerate(positions) if not isinstance(p, str)]
        wanted = SELF if stack == "decoder" else SELF + FEED_FORWARD
        if not any(letters[i] in wanted for i in searched):
            letters[max(searched, key=lambda i: positions[i][SELF])] = SELF
        patterns[stack] = "".join(letter for letter in letters if letter != IDENTITY)
    return patterns
