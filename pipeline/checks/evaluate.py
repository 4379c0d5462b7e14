"""The ``evaluate`` stage's checks: its grid names predictors and knobs, its graph store is held out, its
state file holds every fitted setting the grid names, and a speed table has long sequences to run on;
each of these runs in ``sparsefinder params`` once its own inputs exist."""

from __future__ import annotations

from functools import cached_property

from pipeline.checks import InputCheck, StageInputs
from pipeline.corpus_card import read_corpus_card
from pipeline.errors import UserError
from pipeline.evaluation.sweep import method_settings
from pipeline.graphs.store import GraphStore
from pipeline.origin import Origin
from pipeline.params import Evaluate
from pipeline.predictors.base import PREDICTORS, Predictor
from pipeline.predictors.state import load_states


def _settings(params: Evaluate, stored: list[Predictor], *, fitted: bool) -> None:
    """Build the grid's settings as the sweep will (fitted methods only when ``fitted``, from ``stored``)."""
    for method, grid in params.methods.items():
        if method in PREDICTORS and PREDICTORS[method].fitted and not fitted:
            continue
        method_settings(
            method,
            grid,
            stored,
            params.state,
            windows=params.windows,
            global_tokens=params.global_tokens,
        )


def check_params(params: Evaluate) -> None:
    """One line naming ``evaluate.methods.METHOD`` when a method is no predictor, or a setting of a method
    that needs no fitted state (its knobs, windows, global tokens) builds none."""
    _settings(params, [], fitted=False)


class EvaluateInputs(StageInputs):
    """The stage's inputs and its checks against them, each run as soon as its own inputs exist."""

    def __init__(self, params: Evaluate) -> None:
        self.params = params

    @cached_property
    def store(self) -> GraphStore:
        """The graph store ``evaluate.graphs``, checked as held out from fitting."""
        store = GraphStore(self.params.graphs)
        if store.split == "train":
            raise UserError(
                f"evaluate.graphs = {self.params.graphs!r} was extracted from the train split, which the "
                "predictors were fitted on; allowed: a store of the valid or test split"
            )
        return store

    def check_state(self) -> None:
        """The state file holds every fitted setting the grid names, fitted on this store's teacher."""
        params = self.params
        _settings(params, load_states(params.state, Origin.of_store(self.store)), fitted=True)

    def check_speed(self) -> None:
        """A speed table runs on long sequences, which a corpus of sentence pairs does not hold."""
        params = self.params
        task = read_corpus_card(params.data, "evaluate.data").task
        if task == "translation" and params.speed.contexts:
            raise UserError(
                f"evaluate.speed.contexts = {params.speed.contexts}: {params.data} holds sentence pairs, "
                "not long sequences; allowed: [] (or a corpus of prepare.task lm or mlm)"
            )

    def checks(self) -> list[InputCheck]:
        graphs = {"evaluate.graphs": self.params.graphs}
        return [
            InputCheck(graphs, lambda: self.store),
            InputCheck(graphs | {"evaluate.state": self.params.state}, self.check_state),
            InputCheck({"evaluate.data": self.params.data}, self.check_speed),
        ]


def input_checks(params: Evaluate) -> list[InputCheck]:
    return EvaluateInputs(params).checks()


def check_inputs(params: Evaluate) -> GraphStore:
    """The graph store ``evaluate.graphs``, after every check against the inputs."""
    return EvaluateInputs(params).check().store
