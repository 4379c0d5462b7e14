"""The ``configure`` stage's checks: its method and knobs name a predictor, before any file is read; its
projections were fitted on its teacher's graphs, and its state on those graphs with those projections' ranks
and the teacher's heads (the teacher's skeleton only: no weight is read)."""

from __future__ import annotations

from functools import cached_property

from transformers import PreTrainedModel

from pipeline.attention import model_skeleton
from pipeline.attention.configure import configured_predictor, fit_to_teacher
from pipeline.attention.sparsefinder import SPARSEFINDER
from pipeline.checkpoint import loading, resolve_checkpoint
from pipeline.checks import InputCheck, StageInputs
from pipeline.errors import UserError
from pipeline.params.configure import Configure
from pipeline.predictors.base import Predictor, make_predictor
from pipeline.predictors.state import StateFile
from pipeline.projection.model import HeadProjections, load_projections


def check_params(params: Configure) -> None:
    """One line naming ``configure.method`` or ``configure.knobs`` when they build no predictor."""
    try:
        make_predictor(params.method, **params.knobs)
    except UserError as err:
        raise UserError(f"configure.method = {params.method!r}, configure.knobs: {err}") from None


class ConfigureInputs(StageInputs):
    """The stage's inputs and its checks against them."""

    def __init__(self, params: Configure) -> None:
        self.params = params

    @cached_property
    def teacher(self) -> str:
        """``configure.teacher``, checked as a folder the teacher stage wrote."""
        return resolve_checkpoint(self.params.teacher, "configure.teacher", writer="teacher")

    @cached_property
    def kind(self) -> str:
        """The attention kind the projections were fitted for (the file read and verified)."""
        return load_projections(self.params.projections)[1]["kind"]

    @cached_property
    def predictor(self) -> Predictor:
        """The predictor of ``configure.method`` and ``configure.knobs``, its state not yet read."""
        params = self.params
        return configured_predictor(
            params.method, params.knobs, projections=params.projections, state=params.state
        )

    @cached_property
    def skeleton(self) -> PreTrainedModel:
        """The teacher with sparsefinder attention, without its weights."""
        with loading(self.teacher, "configure.teacher"):
            return model_skeleton(self.teacher, attn_implementation=SPARSEFINDER)

    @cached_property
    def fitted(self) -> tuple[Predictor, dict[int, HeadProjections] | None]:
        """(the predictor with its state, the projections per layer), checked against the teacher."""
        params = self.params
        return fit_to_teacher(
            self.teacher,
            self.skeleton,
            self.predictor,
            self.kind,
            projections=params.projections,
            state=params.state,
            knobs=params.knobs,
        )

    def checks(self) -> list[InputCheck]:
        params = self.params
        teacher = {"configure.teacher": params.teacher}
        projections = {"configure.projections": params.projections}
        # only a fitted predictor reads a state file
        state = {"configure.state": params.state} if self.predictor.fitted else {}
        checks = [InputCheck(teacher, lambda: self.teacher), InputCheck(projections, lambda: self.kind)]
        if state:
            checks.append(InputCheck(state, lambda: StateFile(params.state)))
        return [*checks, InputCheck(teacher | projections | state, lambda: self.fitted)]


def input_checks(params: Configure) -> list[InputCheck]:
    return ConfigureInputs(params).checks()


def check_inputs(params: Configure) -> ConfigureInputs:
    return ConfigureInputs(params).check()
