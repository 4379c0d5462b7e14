"""Write a ``sparsefinder`` model folder from a teacher, its learned projections and fitted predictor state.

The folder is the teacher's checkpoint with ``config.sparsefinder`` set and every attention module of the
projections' kind carrying its layer's :class:`~pipeline.attention.sparsefinder.SparsefinderHead`, so

    load_model(folder, attn_implementation="sparsefinder")

computes α-entmax over the predicted graph in that kind and plain α-entmax elsewhere. The projections and
the predictor state must come from this teacher's graphs: their recorded teacher fingerprint is checked
against the teacher's weights.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.attention.interface import module_head_dim, module_heads
from pipeline.attention.loading import load_model
from pipeline.attention.recording import attention_layers
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_predictor
from pipeline.attention_kinds import attention_kind
from pipeline.checkpoint import (
    folder_tokenizer,
    loading,
    read_manifest,
    resolve_checkpoint,
    save_checkpoint,
)
from pipeline.corpus_card import MQAR_CARD
from pipeline.errors import UserError
from pipeline.origin import Origin
from pipeline.predictors.base import Predictor, make_predictor
from pipeline.predictors.state import StateFile, select_state
from pipeline.projection.model import HeadProjections, load_projections


def _origin(teacher: str, model: PreTrainedModel, kind: str) -> Origin:
    """What projections and states used with ``teacher``'s ``kind`` attention must have been fitted on."""
    modules = attention_layers(model, attention_kind(kind))
    return Origin.of_teacher(teacher, len(modules), module_heads(modules[0]), module_head_dim(modules[0]))


def configured_predictor(
    method: str,
    knobs: Mapping[str, Any] | None = None,
    *,
    projections: str | os.PathLike | None = None,
    state: str | os.PathLike | None = None,
) -> Predictor:
    """The predictor ``method`` with ``knobs`` (its state not yet read), after checking that the inputs it
    needs are given. It reads no file, so a misspelt knob is reported before any path is checked and
    before the teacher (which may be large) is loaded."""
    predictor = make_predictor(method, **(knobs or {}))
    if predictor.fitted and state is None:
        raise UserError(f"predictor {predictor.name} is fitted; give its state file (--centroids)")
    if predictor.needs_projections and projections is None:
        raise UserError(f"predictor {predictor.name} works on projected queries and keys; give --projections")
    return predictor


def configure_sparsefinder(
    teacher: str,
    out: str | os.PathLike,
    *,
    method: str,
    knobs: Mapping[str, Any] | None = None,
    window: int = 0,
    global_tokens: int = 0,
    projections: str | os.PathLike | None = None,
    state: str | os.PathLike | None = None,
    kind: str = "decoder_self",
    certified: bool = False,
) -> PreTrainedModel:
    """Write the sparsefinder model folder ``out`` (atomically) and return the model.

    ``method`` and ``knobs`` name the predictor (``make_predictor``); ``projections`` is the project stage's
    file (its attention kind is the one configured; ``kind`` only matters without projections), ``state``
    the cluster stage's file for fitted predictors (k-means centroids, ...). ``certified`` (the τ-indexer
    only): exact α-entmax, the predictor deciding only which key blocks are skipped. Every mismatch is a
    one-line :class:`UserError`: first the predictor's (:func:`configured_predictor`), then the input
    files', and only then the teacher is loaded and the inputs checked against it.
    """
    predictor = configured_predictor(method, knobs, projections=projections, state=state)
    resolve_checkpoint(teacher, "teacher", writer="teacher")
    if projections is not None:
        # the projections name the attention kind they were fitted for (read before the teacher is loaded)
        kind = load_projections(projections)[1]["kind"]
    if predictor.fitted:
        StateFile(state)  # a missing or unreadable state file is reported before the teacher is loaded
    with loading(teacher, "teacher"):
        model = load_model(teacher, attn_implementation=SPARSEFINDER)
        tokenizer = folder_tokenizer(teacher)  # None: the teacher was saved without one
    predictor, layers = fit_to_teacher(
        teacher, model, predictor, kind, projections=projections, state=state, knobs=knobs
    )
    return write_configured(
        teacher,
        out,
        model,
        tokenizer,
        predictor,
        kind=kind,
        layers=layers,
        window=window,
        global_tokens=global_tokens,
        certified=certified,
    )


def fit_to_teacher(
    teacher: str,
    model: PreTrainedModel,
    predictor: Predictor,
    kind: str,
    *,
    projections: str | os.PathLike | None = None,
    state: str | os.PathLike | None = None,
    knobs: Mapping[str, Any] | None = None,
) -> tuple[Predictor, dict[int, HeadProjections] | None]:
    """(``predictor`` with its state, the projections per layer), read knowing the shape of ``teacher``'s
    ``kind`` attention (``model``: the teacher, or its skeleton, which is enough): the projections must have
    been fitted on ``teacher``'s graphs of that shape, and the state on those graphs with those projections'
    ranks. Every mismatch is a one-line :class:`UserError`."""
    layers = None
    if projections is not None:
        layers, _ = load_projections(projections, origin=_origin(teacher, model, kind))
    if predictor.fitted:
        # the state's shapes are checked against the teacher's heads and the projections' rank
        ranks = {layer: module.rank for layer, module in (layers or {}).items()}
        origin = _origin(teacher, model, kind)
        predictor = select_state(state, predictor, origin, explicit=set(knobs or {}), ranks=ranks)
    return predictor, layers


def write_configured(
    teacher: str,
    out: str | os.PathLike,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    predictor: Predictor,
    *,
    kind: str,
    layers: dict[int, HeadProjections] | None,
    window: int = 0,
    global_tokens: int = 0,
    certified: bool = False,
) -> PreTrainedModel:
    """Attach ``predictor`` (checked by :func:`fit_to_teacher`) to the loaded teacher ``model`` and write
    it, with ``tokenizer`` (None: none, like the teacher), as the model folder ``out`` (atomically); the
    model."""
    attach_predictor(
        model,
        predictor,
        kind=kind,
        window=window,
        global_tokens=global_tokens,
        projections=layers,
        certified=certified,
    )
    spec = model.config.sparsefinder
    parent = read_manifest(teacher)
    # the task card of an mqar teacher goes with it, so the configured model can be scored the same way
    card = Path(teacher) / MQAR_CARD
    save_checkpoint(
        out,
        model,
        tokenizer,
        {"stage": "configure", "teacher": teacher, "teacher_manifest": parent, SPARSEFINDER: spec},
        {MQAR_CARD: card.read_text()} if card.is_file() else None,
    )
    return model
