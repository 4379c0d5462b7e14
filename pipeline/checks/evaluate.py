"""The ``evaluate`` stage's checks: its grid names predictors and knobs, its graph store is held out, its
state file holds every fitted setting the grid names, and a speed table has long sequences to run on."""

from __future__ import annotations

from pipeline.corpus_card import read_corpus_card
from pipeline.errors import UserError
from pipeline.evaluation.sweep import method_settings
from pipeline.graphs.store import GraphStore
from pipeline.origin import Origin
from pipeline.params import Evaluate
from pipeline.predictors.base import PREDICTORS, Predictor
from pipeline.predictors.state import load_states

INPUTS = ("graphs", "state", "data")


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


def check_inputs(params: Evaluate) -> GraphStore:
    """The graph store ``evaluate.graphs``, after checking that it was held out from fitting, that the
    state file holds every fitted setting the grid names, and that a speed table runs on long sequences."""
    store = GraphStore(params.graphs)
    if store.split == "train":
        raise UserError(
            f"evaluate.graphs = {params.graphs!r} was extracted from the train split, which the predictors "
            "were fitted on; allowed: a store of the valid or test split"
        )
    _settings(params, load_states(params.state, Origin.of_store(store)), fitted=True)
    task = read_corpus_card(params.data, "evaluate.data").task
    if task == "translation" and params.speed.contexts:
        raise UserError(
            f"evaluate.speed.contexts = {params.speed.contexts}: {params.data} holds sentence pairs, not "
            "long sequences; allowed: [] (or a corpus of prepare.task lm or mlm)"
        )
    return store
