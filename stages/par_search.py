"""Stage ``par_search``: PAR's architecture search on the teacher.

The teacher becomes a supernet (:mod:`pipeline.par.supernet`) whose every self-attention and feed-forward
position mixes {self-attention, feed-forward, identity}; it is distilled from the teacher with two parameter
groups: the blocks (``train.lr``, ``train.weight_decay``) and the mixing parameters θ
(``architecture.lr``, ``architecture.weight_decay``), θ held at its start for ``architecture.frozen_steps``.
The most probable choice per position gives the searched patterns; the teacher rearranged to them
(:func:`~pipeline.par.from_teacher.rebuild_from_teacher`) is saved as ``out``, for ``student@par`` to
start from. ``mixing`` keeps the mixing weights per position, ``plot`` draws them.
"""

from __future__ import annotations

import copy
import shutil

import torch
from transformers import TrainerCallback

from pipeline.atomic import staged_outputs, write_json
from pipeline.attention import load_model
from pipeline.checkpoint import describe_parent, loading, save_checkpoint
from pipeline.checks.par_search import check_inputs
from pipeline.errors import exits_cleanly
from pipeline.models.marian import set_generation
from pipeline.par.from_teacher import rebuild_from_teacher
from pipeline.par.pattern import attention_share, compact_pattern, teacher_pattern
from pipeline.par.stacks import reads_encoder
from pipeline.par.supernet import architecture_parameters, build_supernet, mixing_weights, searched_patterns
from pipeline.params import ParSearch
from pipeline.plots.par import plot_mixing_weights
from pipeline.stage import stage_params
from pipeline.timings import metrics_files, write_metrics
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


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params: ParSearch = stage_params("par_search", argv)
    inputs = check_inputs(params)
    teacher_folder, tokenizer, teachers = inputs.teacher, inputs.tokenizer, inputs.layers
    data, corpus_tokenizer, task = inputs.corpus
    with loading(teacher_folder, "par_search.teacher"):
        teacher = load_model(teacher_folder)
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
        return

    table = mixing_weights(supernet)
    patterns = searched_patterns(table)
    copied = rebuild_from_teacher(searched, patterns, seed=params.train.seed)
    if task == "translation":
        set_generation(searched, params.eval)
    # the searched model, its mixing weights, their plot and the metrics are swapped in together, so a
    # failure on the last never leaves the new model beside another search's patterns
    outputs = (params.out, params.mixing, params.plot, *metrics_files(params.metrics))
    with staged_outputs(*outputs):
        save_checkpoint(
            params.out,
            searched,
            tokenizer,
            {"stage": "par_search", "params": params.model_dump(), "parent": parent},
        )
        write_json(
            params.mixing,
            {
                "patterns": {stack: compact_pattern(pattern) for stack, pattern in patterns.items()},
                "teacher_patterns": {
                    stack: compact_pattern(teacher_pattern(stack, layers, cross=cross))
                    for stack, layers in teachers.items()
                },
                "mixing_weights": table,
                "sublayers_from_teacher": copied,
            },
        )
        plot_mixing_weights(table, patterns, params.plot)
        attention, share = attention_share(patterns, sum(teachers.values()))
        write_metrics(
            params.metrics,
            {
                "attention_sublayers": attention,
                "attention_fraction": share,
                "sublayers": sum(len(pattern) for pattern in patterns.values()),
                "train_seconds": round(train_seconds, 1),
            },
        )
    shutil.rmtree(params.run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
