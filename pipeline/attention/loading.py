"""Loading a checkpoint folder strictly, with the attention state ``from_pretrained`` cannot rebuild."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from torch import Tensor
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from pipeline.attention.entmax import ENTMAX
from pipeline.attention.interface import IMPLEMENTATIONS_MODULE, attach_state
from pipeline.checkpoint import WEIGHTS, load_config, refuse_foreign_code, verify_checkpoint
from pipeline.errors import UserError
from pipeline.finite import require_finite_tensors
from pipeline.par.stacks import build_configured_stacks


def _load_state_dict(folder: Path) -> dict[str, Tensor]:
    """The tensors of model.safetensors, or of the shards its index names (plain names of files the
    manifest lists: :func:`~pipeline.checkpoint.verify_checkpoint` checked them)."""
    index = folder / WEIGHTS[1]
    if not index.exists():
        return load_file(folder / WEIGHTS[0])
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    state: dict[str, Tensor] = {}
    for shard in shards:
        state.update(load_file(folder / shard))
    return state


def load_model(
    folder: str | os.PathLike,
    model_cls: type[PreTrainedModel] | None = None,
    *,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Load a ``save_pretrained`` folder strictly, with the attention state ``from_pretrained`` drops.

    The model is built from the folder's config (class from ``config.architectures`` unless ``model_cls``
    is given) with ``attn_implementation``: None is the one the folder was saved with (config.json's
    ``attn_implementation``; α-entmax for a folder that records none), another name computes that attention
    instead (e.g. ``"entmax"`` for a student evaluated densely). It gets the stacks its config
    asks for (a PAR pattern, :mod:`pipeline.par.stacks`), then the attention state its config asks for
    (every registered state attacher runs: learned α, predictors), and then loads model.safetensors (or
    its shards). Every stored tensor must find a parameter, and every parameter must be stored except
    those ``save_pretrained`` leaves out on purpose (tied weights, keys ignored on save).
    The folder is first checked against its manifest (:func:`~pipeline.checkpoint.verify_checkpoint`:
    a folder without one is refused) and its weights must be finite. Returns the model in eval mode.
    """
    folder = Path(folder)
    verify_checkpoint(folder)
    model = _build(folder, model_cls, attn_implementation)
    state = _load_state_dict(folder)
    # writers refuse non-finite weights, so these were edited in (with the manifest's hash rewritten)
    require_finite_tensors(state, str(folder))
    missing, unexpected = model.load_state_dict(state, strict=False)
    left_out = set(model.all_tied_weights_keys) | set(model._keys_to_ignore_on_save)
    missing = sorted(set(missing) - left_out)
    if missing or unexpected:
        raise UserError(
            f"checkpoint {folder} does not match {type(model).__name__}: "
            f"missing {missing}, unexpected {sorted(unexpected)}"
        )
    return model.eval()


def model_skeleton(
    folder: str | os.PathLike,
    model_cls: type[PreTrainedModel] | None = None,
    *,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """The model :func:`load_model` builds from ``folder``, on the meta device and without its weights:
    its config and modules, for checks that need no weights, at no cost whatever the checkpoint's size."""
    with torch.device("meta"):
        return _build(Path(folder), model_cls, attn_implementation)


def _build(
    folder: Path, model_cls: type[PreTrainedModel] | None, attn_implementation: str | None
) -> PreTrainedModel:
    """The model of ``folder``'s config (class from ``config.architectures`` unless ``model_cls`` is given)
    with its stacks and attention state, weights freshly initialised; no code of the folder's runs."""
    if model_cls is None:
        config = load_config(folder)
        if not config.architectures:
            raise UserError(f"{folder / 'config.json'}: no architectures entry naming the model's class")
        model_cls = getattr(transformers, config.architectures[0])
    else:
        refuse_foreign_code(folder)
        config = model_cls.config_class.from_pretrained(folder, trust_remote_code=False)
    implementation = attn_implementation or config._attn_implementation or ENTMAX
    if implementation != "eager" and implementation not in ALL_ATTENTION_FUNCTIONS:
        raise UserError(
            f"{folder}: attention {implementation!r} is not registered in this process; allowed: the "
            f"implementations transformers ships, and this project's after import {IMPLEMENTATIONS_MODULE}"
        )
    model = model_cls._from_config(config, attn_implementation=implementation)
    build_configured_stacks(model)
    attach_state(model)
    return model
