"""A student's starting point: a model folder (the teacher, or the teacher with a predictor) with the
student's attention in place.

- ``sparsefinder``: starts from the ``configure`` stage's folder, the teacher with its attention restricted
  to a learned predictor's graph. The predictor stays as it was fitted: the graph is discrete, so it gives
  the projections no gradient, and the model learns to live with the recall it actually gets.
- ``ssa``: starts from the teacher, with stochastically subsampled self-attention in training
  (:func:`~pipeline.attention.ssa.attach_ssa`); "+FT" switches sampling off for the last steps
  (:class:`DenseFinetune`).
- ``sbm`` and ``samsa``: start from the teacher, with freshly initialised (seeded) SBM or SAMSA heads in its
  self-attention (:func:`~pipeline.students.attention.attach_student_attention`).
- ``par``: the teacher's stacks rearranged to a pattern of sublayers
  (:func:`~pipeline.par.from_teacher.rebuild_from_teacher`), or the ``par_search`` stage's folder, which
  already is.
- ``entmax``: the control, the teacher trained on with its own dense α-entmax.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

from pipeline.attention.entmax import ENTMAX
from pipeline.attention.loading import load_model
from pipeline.attention.sparsefinder import SPARSEFINDER
from pipeline.attention.ssa import set_sampling
from pipeline.checkpoint import load_auto_tokenizer, loading, read_manifest, resolve_checkpoint
from pipeline.errors import UserError
from pipeline.par.from_teacher import rebuild_from_teacher
from pipeline.par.pattern import parse_pattern
from pipeline.par.stacks import PAR, reads_encoder, stack_modules
from pipeline.params.student import ParStudent, SsaStudent, StudentRun, StudentSpec
from pipeline.students.attention import attach_student_attention


def build_student(
    spec: StudentSpec, key: str, *, seed: int, checked: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The student of ``spec``, in training mode, and its tokenizer; ``key`` names ``spec.init`` in errors
    and ``seed`` draws the initial values of the parameters its attention adds. ``checked`` is the folder
    :func:`check_student_init` already returned for ``spec``, not verified again (its files are hashed)."""
    init = check_student_init(spec, key) if checked is None else checked
    with loading(init, key):
        model = load_model(init, attn_implementation=ENTMAX if spec.attention == PAR else spec.attention)
        tokenizer = load_auto_tokenizer(init)
    if isinstance(spec, ParStudent):
        arrange_par(model, spec, key, seed=seed)
    attach_student_attention(model, spec, seed=seed)
    for name, parameter in model.named_parameters():
        if f".{SPARSEFINDER}." in name:  # the predictor is fixed; see the module docstring
            parameter.requires_grad_(False)
    return model.train(), tokenizer


def check_student_init(spec: StudentSpec, key: str) -> str:
    """``spec.init`` after checking, from its manifest alone (no weight is read), that it is a folder of
    the stage this student starts from, with the attention that student needs."""
    # the stage whose folder each student starts from (a PAR student also from a teacher, given patterns)
    writer = {SPARSEFINDER: "configure", PAR: "par_search or teacher"}.get(spec.attention, "teacher")
    init = resolve_checkpoint(spec.init, key, writer=writer)
    implementation = read_manifest(init).get("attn_implementation")
    wanted = SPARSEFINDER if spec.attention == SPARSEFINDER else ENTMAX
    if implementation is None:
        raise UserError(
            f"{key} = {spec.init!r} has no manifest naming its attention; allowed: a model folder written "
            "by this pipeline's teacher or configure stage"
        )
    if implementation != wanted:
        raise UserError(
            f"{key} = {spec.init!r} holds a model with {implementation} attention; allowed: a folder with "
            f"{wanted} attention ({spec.attention} students start from one)"
        )
    return init


def arrange_par(model: PreTrainedModel, spec: ParStudent, key: str, *, seed: int) -> None:
    """Rebuild the teacher ``model`` to ``spec``'s patterns (checked by :func:`par_patterns`)."""
    patterns = par_patterns(model, spec, key)
    if patterns is not None:
        rebuild_from_teacher(model, patterns, seed=seed)


def par_patterns(model: PreTrainedModel, spec: ParStudent, key: str) -> dict[str, Any] | None:
    """The patterns to rebuild ``model`` (the init folder's model, or its skeleton: no weight is needed)
    to, or None for a model that already has PAR stacks (a ``par_search`` folder), which must come
    without patterns; a teacher needs one per stack it has (an encoder–decoder's two, a decoder-only LM's
    decoder)."""
    stacks = list(stack_modules(model))
    wanted = " and ".join(stacks) + (" patterns" if len(stacks) > 1 else " pattern")
    given = [stack for stack in ("encoder", "decoder") if getattr(spec, stack) is not None]
    searched = getattr(model.config, PAR, None)
    if searched is not None and given:
        raise UserError(
            f"{key} = {spec.init!r} already holds a PAR model ({searched}); allowed: no patterns with it, "
            "or the teacher as init"
        )
    if searched is not None:
        return None
    if given != stacks:
        found = " and ".join(given) or "no"
        raise UserError(
            f"{key} = {spec.init!r} is no PAR model and {found} patterns are given; allowed: its {wanted} "
            "to rebuild it to, or a par_search folder as init"
        )
    cross = reads_encoder(model)
    try:
        return {stack: parse_pattern(getattr(spec, stack), stack, cross=cross) for stack in stacks}
    except ValueError as err:
        raise UserError(f"{key}: {err}") from None


class DenseFinetune(TrainerCallback):
    """ "+FT": sample attention until step ``start``, then train with dense attention to the end (a resumed
    run finds the right mode from its step)."""

    def __init__(self, start: int) -> None:
        self.start = start

    def on_step_begin(self, args, state, control, model=None, **kwargs) -> None:
        set_sampling(model, state.global_step < self.start)


def student_callbacks(params: StudentRun) -> list[TrainerCallback]:
    """The training callbacks the student's attention asks for."""
    spec = params.spec
    if isinstance(spec, SsaStudent) and spec.dense_fraction > 0.0:
        steps = params.train.max_steps
        return [DenseFinetune(steps - round(spec.dense_fraction * steps))]
    return []
