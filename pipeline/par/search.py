"""PAR's architecture search on the teacher (the ``par_search`` stage's work).

The teacher becomes a supernet (:mod:`pipeline.par.supernet`) whose every self-attention and feed-forward
position mixes {self-attention, feed-forward, identity}; it is distilled from the teacher with two parameter
groups: the blocks (``train.lr``, ``train.weight_decay``) and the mixing parameters θ
(``architecture.lr``, ``architecture.weight_decay``), θ held at its start for ``architecture.frozen_steps``
(:class:`FrozenArchitecture`). The most probable choice per position gives the searched patterns; the
teacher rearranged to them (:func:`~pipeline.par.from_teacher.rebuild_from_teacher`) is the searched model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from datasets import DatasetDict
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

from pipeline.checkpoint import describe_parent
from pipeline.corpus_card import Task
from pipeline.models.marian import set_generation
from pipeline.par.from_teacher import rebuild_from_teacher
from pipeline.par.pattern import Stack, attention_share, compact_pattern, teacher_pattern
from pipeline.par.stacks import reads_encoder
from pipeline.par.supernet import architecture_parameters, build_supernet, mixing_weights, searched_patterns
from pipeline.params.par_search import ParSearch
from pipeline.training.run import data_for_model, train_stage
from pipeline.training.trainer import is_main_process


class FrozenArchitecture(TrainerCallback):
    """θ stays at its start for the first ``steps`` optimizer steps: its gradients are zeroed as they are
    computed (so they add nothing to the norm the other gradients are clipped by) and dropped before the
    step (so AdamW leaves θ and its moments untouched, weight decay included). Safe under DDP: θ keeps
    ``requires_grad``, only the values change."""

    def __init__(self, parameters: list[torch.nn.Parameter], steps: int) -> None:
        self.parameters = parameters
        self.steps = steps
        self.frozen = steps > 0
        for parameter in parameters:
            parameter.register_hook(self._gradient)

    def _gradient(self, gradient: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(gradient) if self.frozen else gradient

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.frozen = state.global_step < self.steps

    def on_pre_optimizer_step(self, args, state, control, **kwargs) -> None:
        if self.frozen:
            for parameter in self.parameters:
                parameter.grad = None


@dataclass(frozen=True)
class Searched:
    """A finished search: the searched ``model`` (the teacher rearranged to ``patterns``), the mixing weights
    the patterns were read from, the sublayers per stack that start from the teacher, whether the teacher's
    decoder reads an encoder, the seconds the supernet trained, and the teacher as a parent."""

    model: PreTrainedModel
    patterns: dict[Stack, str]
    mixing_weights: dict[Stack, list[dict[str, float] | str]]
    copied: dict[str, int]
    cross: bool
    train_seconds: float
    parent: dict[str, Any]

    def mixing(self, teachers: dict[Stack, int]) -> dict[str, Any]:
        """The ``mixing`` file: the searched and the teacher's patterns (the teacher's layers per stack,
        ``teachers``), the mixing weights per position, the sublayers copied from the teacher."""
        return {
            "patterns": {stack: compact_pattern(pattern) for stack, pattern in self.patterns.items()},
            "teacher_patterns": {
                stack: compact_pattern(teacher_pattern(stack, layers, cross=self.cross))
                for stack, layers in teachers.items()
            },
            "mixing_weights": self.mixing_weights,
            "sublayers_from_teacher": self.copied,
        }

    def metrics(self, teachers: dict[Stack, int]) -> dict[str, Any]:
        """The stage's metrics: the searched model's self-attention sublayers, their share of the teacher's
        (its layers per stack, ``teachers``), its sublayers, and the training time."""
        attention, share = attention_share(self.patterns, sum(teachers.values()))
        return {
            "attention_sublayers": attention,
            "attention_fraction": share,
            "sublayers": sum(len(pattern) for pattern in self.patterns.values()),
            "train_seconds": round(self.train_seconds, 1),
        }


def search_architecture(
    params: ParSearch,
    teacher: PreTrainedModel,
    teacher_folder: str,
    tokenizer: PreTrainedTokenizerBase,
    corpus: tuple[DatasetDict, PreTrainedTokenizerBase, Task],
) -> Searched | None:
    """Search ``teacher`` (loaded from ``teacher_folder``, with its own ``tokenizer``) on ``corpus`` (the
    prepared data, the tokenizer it was cut with, its task), training in ``params.run_dir``; None in every
    process but the main one (DDP), which alone goes on to write."""
    data, corpus_tokenizer, task = corpus
    cross = reads_encoder(teacher)
    supernet, searched = copy.deepcopy(teacher), copy.deepcopy(teacher)  # the teacher is read once
    build_supernet(supernet, params.architecture.temperature)
    supernet.train()
    architecture = architecture_parameters(supernet)
    blocks = [p for p in supernet.parameters() if not any(p is a for a in architecture)]
    optimizer = torch.optim.AdamW(
        [
            {"params": blocks, "lr": params.train.lr, "weight_decay": params.train.weight_decay},
            {
                "params": architecture,
                "lr": params.architecture.lr,
                "weight_decay": params.architecture.weight_decay,
            },
        ]
    )
    key = f"par_search.teacher = {params.teacher!r}"
    data = data_for_model(data, corpus_tokenizer, tokenizer, supernet, task=task, key=key)
    parent = {"teacher": describe_parent(teacher_folder)}
    supernet, train_seconds, _ = train_stage(
        params,
        supernet,
        tokenizer,
        data,
        parent,
        teacher=teacher,
        callbacks=[FrozenArchitecture(architecture, params.architecture.frozen_steps)],
        optimizer=optimizer,
    )
    if not is_main_process():
        return None

    table = mixing_weights(supernet)
    patterns = searched_patterns(table)
    copied = rebuild_from_teacher(searched, patterns, seed=params.train.seed)
    if task == "translation":
        set_generation(searched, params.eval)
    return Searched(searched, patterns, table, copied, cross, train_seconds, parent)
