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

from transformers import AutoTokenizer, PreTrainedModel

from pipeline.attention.loading import load_model
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_predictor
from pipeline.checkpoint import loading, read_manifest, resolve_checkpoint, save_checkpoint
from pipeline.errors import UserError
from pipeline.fingerprint import file_sha256
from pipeline.graphs.extract import attention_layers
from pipeline.graphs.kinds import attention_kind
from pipeline.predictors.base import Predictor, make_predictor
from pipeline.predictors.state import read_header, select_state
from pipeline.projection.model import HeadProjections, load_projections


def _check_fitted_on(teacher: str, what: str, path: str | os.PathLike, graphs: Mapping[str, Any]) -> None:
    """One-line error unless ``graphs`` (a store's teacher fingerprint) names the teacher's weights."""
    weights = Path(teacher) / "model.safetensors"
    stored = graphs.get("model_sha256")
    if weights.is_file() and stored is not None and stored != file_sha256(weights):
        raise UserError(
            f"{what} {path} was fitted on the graphs of another teacher ({graphs.get('checkpoint')}); "
            f"re-run project and cluster on {teacher}'s graphs"
        )


def _check_projections(
    model: PreTrainedModel, kind: str, layers: Mapping[int, HeadProjections], path: str | os.PathLike
) -> None:
    """One-line error unless the projections cover every layer of ``kind`` with its heads and head size."""
    modules = attention_layers(model, attention_kind(kind))
    if sorted(layers) != list(range(len(modules))):
        raise UserError(
            f"projections {path} cover layers {sorted(layers)} but the teacher's {kind} attention has "
            f"{len(modules)} layers"
        )
    for layer, module in enumerate(modules):
        config = layers[layer].config()
        if (config["n_heads"], config["head_dim"]) != (module.num_heads, module.head_dim):
            raise UserError(
                f"projections {path} layer {layer} are for {config['n_heads']} heads × {config['head_dim']} "
                f"dims; the teacher's {kind} attention has {module.num_heads} × {module.head_dim}"
            )


def _check_state(model: PreTrainedModel, kind: str, predictor: Predictor, path: str | os.PathLike) -> None:
    """One-line error unless the fitted state covers every layer of ``kind`` with its number of heads
    (every fitted tensor is per head: centroids, rotations, the indexer's maps)."""
    for layer, module in enumerate(attention_layers(model, attention_kind(kind))):
        for name, tensor in predictor.layer_state(layer).items():
            if tensor.shape[0] != module.num_heads:
                raise UserError(
                    f"predictor state {path} layer {layer} holds {name} for {tensor.shape[0]} heads; "
                    f"the teacher's {kind} attention has {module.num_heads}"
                )


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
) -> PreTrainedModel:
    """Write the sparsefinder model folder ``out`` (atomically) and return the model.

    ``method`` and ``knobs`` name the predictor (``make_predictor``); ``projections`` is the project stage's
    file (its attention kind is the one configured; ``kind`` only matters without projections), ``state``
    the cluster stage's file for fitted predictors (k-means centroids, ...). Every mismatch is a one-line
    :class:`UserError`.
    """
    resolve_checkpoint(teacher, "teacher", local=True)
    with loading(teacher, "teacher"):
        model = load_model(teacher, attn_implementation=SPARSEFINDER)
        tokenizer = AutoTokenizer.from_pretrained(teacher)
    layers = None
    if projections is not None:
        layers, extra = load_projections(projections)
        kind = extra["kind"]
        _check_projections(model, kind, layers, projections)
        _check_fitted_on(teacher, "projections", projections, extra.get("graphs", {}))
    predictor = make_predictor(method, **(knobs or {}))
    if predictor.fitted:
        if state is None:
            raise UserError(f"predictor {predictor.name} is fitted; give its state file (--centroids)")
        _check_fitted_on(teacher, "predictor state", state, read_header(state)["extra"].get("graphs", {}))
        predictor = select_state(state, predictor)
        _check_state(model, kind, predictor, state)
    if predictor.needs_projections and layers is None:
        raise UserError(f"predictor {predictor.name} works on projected queries and keys; give --projections")
    attach_predictor(
        model, predictor, kind=kind, window=window, global_tokens=global_tokens, projections=layers
    )
    spec = model.config.sparsefinder
    parent = read_manifest(teacher)
    save_checkpoint(
        out,
        model,
        tokenizer,
        {"stage": "configure", "teacher": teacher, "teacher_manifest": parent, SPARSEFINDER: spec},
    )
    return model
