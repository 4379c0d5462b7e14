"""The ``evaluate`` stage's checks: its grid names predictors and knobs, its graph store is held out and was
extracted from its teacher, its projections were fitted on that store's teacher for a kind the store holds,
its state file holds every fitted setting the grid names, and a speed table has long sequences to run on,
within the teacher's positions (the teacher's config and skeleton only: no weight is read); each of these
runs in ``sparsefinder params`` once its own inputs exist."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path

from pipeline.attention import ENTMAX, model_skeleton
from pipeline.checkpoint import loading, resolve_checkpoint, seed_path
from pipeline.checks import InputCheck, StageInputs
from pipeline.corpus_card import read_corpus_card
from pipeline.errors import UserError
from pipeline.evaluation.student_models import check_parent, student_folders
from pipeline.evaluation.sweep import method_settings
from pipeline.graphs.store import GraphStore
from pipeline.models.language_model import max_context
from pipeline.origin import Origin
from pipeline.params.evaluate import Evaluate
from pipeline.params.student import Student
from pipeline.predictors.base import PREDICTORS, Predictor
from pipeline.predictors.state import load_states
from pipeline.projection.model import HeadProjections, load_projections


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

    def __init__(self, params: Evaluate, students: Mapping[str, Sequence[str]]) -> None:
        self.params = params
        self.declared = students  # student.instances: name → one model folder per seed

    @cached_property
    def students(self) -> dict[str, list[Path]]:
        """The declared students' folders (one per seed), each inside ``evaluate.students`` and holding a
        model."""
        return student_folders(self.params.students, self.declared)

    def check_parents(self) -> None:
        """Every declared student (every seed) was distilled from ``evaluate.teacher``."""
        key = f"evaluate.teacher = {self.params.teacher!r}"
        for name, folders in self.students.items():
            for folder in folders:
                check_parent(name, folder, key, self.weights)

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

    @cached_property
    def teacher(self) -> str:
        """``evaluate.teacher``, checked as a folder the teacher stage wrote."""
        return resolve_checkpoint(self.params.teacher, "evaluate.teacher", writer="teacher")

    @cached_property
    def weights(self) -> str | None:
        """The sha256 of the teacher's weights, checked as those the store was extracted from."""
        store = self.store
        weights = Origin.of_teacher(self.teacher, store.layers, store.heads, store.head_dim).teacher_sha256
        if weights != store.manifest["teacher"].get("model_sha256"):
            raise UserError(
                f"evaluate.teacher = {self.params.teacher!r} is not the teacher evaluate.graphs was "
                "extracted from"
            )
        return weights

    @cached_property
    def projections(self) -> tuple[str, dict[int, HeadProjections]]:
        """(kind, projections per layer), fitted on the store's teacher for a kind the store holds."""
        projections, extra = load_projections(self.params.projections, origin=Origin.of_store(self.store))
        kind = extra["kind"]
        if kind not in self.store.kinds:
            raise UserError(
                f"evaluate.graphs = {self.params.graphs!r} holds no {kind} graphs (the projections' kind)"
            )
        return kind, projections

    @cached_property
    def stored(self) -> list[Predictor]:
        """The state file's fitted predictors, fitted on the store's teacher with the projections' ranks."""
        ranks = {i: module.rank for i, module in self.projections[1].items()}
        return load_states(self.params.state, Origin.of_store(self.store), ranks=ranks)

    def check_state(self) -> None:
        """The state file holds every fitted setting the grid names."""
        _settings(self.params, self.stored, fitted=True)

    def check_speed(self) -> None:
        """A speed table runs on long sequences, which a corpus of sentence pairs does not hold."""
        params = self.params
        task = read_corpus_card(params.data, "evaluate.data").task
        if task == "translation" and params.speed.contexts:
            raise UserError(
                f"evaluate.speed.contexts = {params.speed.contexts}: {params.data} holds sentence pairs, "
                "not long sequences; allowed: [] (or a corpus of prepare.task lm, mlm or mqar)"
            )

    def check_positions(self) -> None:
        """A speed table within the teacher's learned positions (its skeleton: no weight is read)."""
        contexts = self.params.speed.contexts
        with loading(self.teacher, "evaluate.teacher"):
            limit = max_context(model_skeleton(self.teacher, attn_implementation=ENTMAX))
        if limit is not None and max(contexts) > limit:
            raise UserError(
                f"evaluate.speed.contexts = {contexts}: the teacher has learned positions for {limit} "
                f"tokens; allowed: contexts up to {limit} (rotary models take any length)"
            )

    def checks(self) -> list[InputCheck]:
        params = self.params
        graphs, teacher = {"evaluate.graphs": params.graphs}, {"evaluate.teacher": params.teacher}
        projections = graphs | {"evaluate.projections": params.projections}
        checks = [
            InputCheck(graphs, lambda: self.store),
            InputCheck(graphs | teacher, lambda: self.weights),
            InputCheck(projections, lambda: self.projections),
            InputCheck({"evaluate.data": params.data}, self.check_speed),
        ]
        if params.speed.contexts:  # nothing to check against the teacher without a speed table
            checks.append(InputCheck(teacher, self.check_positions))
        checks.append(InputCheck(projections | {"evaluate.state": params.state}, self.check_state))
        if params.students is not None and self.declared:
            students = {"evaluate.students": params.students}
            checks += [
                InputCheck(students, lambda: self.students),
                InputCheck(students | graphs | teacher, self.check_parents),
            ]
        return checks


def declared_students(section: Student | None) -> dict[str, list[str]]:
    """name → the model folders (one per seed) of every student a ``student`` section declares (none
    without one)."""
    if section is None:
        return {}
    return {
        name: [str(seed_path(spec.out, seed)) for seed in section.seeds]
        for name, spec in section.instances.items()
    }


def input_checks(params: Evaluate, students: Mapping[str, Sequence[str]]) -> list[InputCheck]:
    return EvaluateInputs(params, students).checks()


def check_inputs(params: Evaluate, students: Mapping[str, Sequence[str]]) -> EvaluateInputs:
    """The stage's inputs, after every check against them; ``students``: name → the model folders (one per
    seed) of every student the params declare (:func:`declared_students`)."""
    return EvaluateInputs(params, students).check()
