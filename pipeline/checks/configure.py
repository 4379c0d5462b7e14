"""The ``configure`` stage's check: its method and knobs name a predictor, before the teacher is loaded."""

from __future__ import annotations

from pipeline.errors import UserError
from pipeline.params import Configure
from pipeline.predictors.base import make_predictor

# the teacher, projections and state are checked against each other as the stage loads them
INPUTS: tuple[str, ...] = ()


def check_params(params: Configure) -> None:
    """One line naming ``configure.method`` or ``configure.knobs`` when they build no predictor."""
    try:
        make_predictor(params.method, **params.knobs)
    except UserError as err:
        raise UserError(f"configure.method = {params.method!r}, configure.knobs: {err}") from None
