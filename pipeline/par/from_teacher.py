"""A PAR student's starting point: the teacher's own sublayers, rearranged to the pattern."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from transformers import PreTrainedModel

from pipeline.attention.interface import attach_state
from pipeline.par.pattern import Stack
from pipeline.par.stacks import PreNormSublayer, Sublayer, build_stacks, stack_modules


def copy_part(target: Sublayer | PreNormSublayer, source: nn.Module) -> None:
    """Load the teacher layer ``source``'s parts into sublayer ``target`` (same names, same shapes)."""
    for part in target.PARTS:
        getattr(target, part).load_state_dict(getattr(source, part).state_dict())


def rebuild_from_teacher(
    model: PreTrainedModel, patterns: Mapping[Stack, str], *, seed: int
) -> dict[str, int]:
    """Rebuild a teacher ``model`` (Marian or Llama layers) to ``patterns``, in place, from its weights.

    In each stack the k-th sublayer of a kind takes the teacher's layer k's part of that kind (its
    self-attention, cross-attention or feed-forward, with that part's LayerNorm and attention state), so a
    pattern that drops attention keeps the teacher's lower attention layers and its feed-forwards in order;
    the teacher's own pattern, ``(sf)xL`` / ``(scf)xL``, gives back the teacher exactly. Sublayers beyond the
    teacher's layers start fresh, from a generator seeded with ``seed``. Returns how many sublayers per
    stack start from the teacher.
    """
    teacher_layers = {stack: list(module.layers) for stack, module in stack_modules(model).items()}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        build_stacks(model, patterns)
    attach_state(model)  # the attention state (a learned α) of the new attention modules
    copied = {}
    for stack, module in stack_modules(model).items():
        copied[stack] = 0
        for sublayer in module.layers:
            if sublayer.index < len(teacher_layers[stack]):
                copy_part(sublayer, teacher_layers[stack][sublayer.index])
                copied[stack] += 1
    return copied
