"""What a model's attention functions compute with, recorded where it happens, and where those
functions sit in each model layout.

Three layouts, told apart by the model itself (:func:`model_layout`):

- ``encoder_decoder`` (Marian, BART): kinds ``encoder_self``, ``decoder_self``, ``cross``;
- ``decoder_only`` (GPT-2, Llama): ``decoder_self``;
- ``encoder_only`` (BERT, RoBERTa): ``encoder_self``.

:func:`capture_attention` wraps the model's registered attention function for the duration of a block and
records, per (kind, layer), the queries and keys the scores were computed from — after rotary embeddings in
a Llama, after GPT-2's fused projection, keys repeated to grouped query heads — and the probabilities the
function returned; :func:`time_attention` sums the time spent in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from pipeline.attention.interface import AttentionFunction, attention_modules
from pipeline.attention_kinds import KINDS, AttentionKind

Layout = Literal["encoder_decoder", "decoder_only", "encoder_only"]
# the sides (source, target) of a row each layout reads
LAYOUT_SIDES: dict[Layout, tuple[str, ...]] = {
    "encoder_decoder": ("source", "target"),
    "decoder_only": ("target",),
    "encoder_only": ("source",),
}
# implementations that return no probabilities
_UNRECORDABLE = (
    "sdpa",
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
    "flex_attention",
)
# (kind, layer) → (q, k, probs) the attention function computed with: (b, h, n, d), (b, h, m, d), (b, h, n, m)
Captured = dict[tuple[str, int], tuple[Tensor, Tensor, Tensor]]


def model_layout(model: PreTrainedModel) -> Layout:
    """The layout of ``model``: encoder–decoder, decoder-only (it generates) or encoder-only."""
    if model.config.is_encoder_decoder:
        return "encoder_decoder"
    return "decoder_only" if model.can_generate() else "encoder_only"


def layout_kinds(layout: Layout) -> list[str]:
    """The attention kinds a model of ``layout`` has."""
    return [name for name in KINDS if _has_kind(layout, name)]


def _has_kind(layout: Layout, name: str) -> bool:
    kind = KINDS[name]
    return {kind.query_side, kind.key_side} <= set(LAYOUT_SIDES[layout])


class UnsupportedLayoutError(ValueError):
    """An encoder–decoder whose stacks are not laid out like Marian's or BART's (T5's ``block`` lists, or a
    PAR stack of single sublayers): its attention modules cannot be told apart by kind and layer."""


def attention_layers(model: PreTrainedModel, kind: AttentionKind) -> list[nn.Module]:
    """The attention module of every layer for ``kind``, bottom up.

    Encoder–decoders must have the Marian/BART layout (``layers[i].self_attn``, ``layers[i].encoder_attn``;
    else :class:`UnsupportedLayoutError`, one line naming what is supported); a decoder- or encoder-only
    model has one kind, whose modules are those dispatching through the attention interface. A kind the
    model lacks is a ValueError naming the kinds it has.
    """
    layout = model_layout(model)
    if not _has_kind(layout, kind.name):
        raise ValueError(
            f"a {layout.replace('_', '-')} model has no {kind.name} attention; allowed: "
            f"{', '.join(layout_kinds(layout))}"
        )
    if layout != "encoder_decoder":
        return [module for _, module in attention_modules(model)]
    stacks = (model.get_encoder(), model.get_decoder())
    # T5 keeps ``block`` lists; a PAR stack mixes sublayers that are not whole layers
    if not all(
        hasattr(stack, "layers") and all(hasattr(x, "self_attn") for x in stack.layers) for stack in stacks
    ):
        raise UnsupportedLayoutError(
            f"{type(model).__name__}: its encoder and decoder are not laid out like Marian's or BART's "
            "(layers[i].self_attn, layers[i].encoder_attn), so its attention cannot be split by kind and "
            "layer; allowed: a Marian- or BART-style encoder–decoder, or any decoder-only or encoder-only "
            "model"
        )
    if kind.name == "encoder_self":
        return [layer.self_attn for layer in model.get_encoder().layers]
    if kind.name == "decoder_self":
        return [layer.self_attn for layer in model.get_decoder().layers]
    return [layer.encoder_attn for layer in model.get_decoder().layers]


@contextmanager
def wrapped_attention(
    model: PreTrainedModel, wrap: Callable[[AttentionFunction], AttentionFunction]
) -> Iterator[None]:
    """Run ``model``'s attention through ``wrap(registered function)`` while the block runs.

    The wrapper is an item set on the interface instance, a local override of the registered function,
    which deleting it uncovers again. ``eager`` is called without the registry, so it cannot be wrapped.
    """
    name = model.config._attn_implementation
    if name not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(
            f"attention implementation {name!r} is not looked up in the attention registry; load the model "
            "with attn_implementation='entmax' (or 'sdpa')"
        )
    ALL_ATTENTION_FUNCTIONS[name] = wrap(ALL_ATTENTION_FUNCTIONS[name])
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS[name]


@contextmanager
def capture_attention(
    model: PreTrainedModel, modules: Mapping[tuple[str, int], nn.Module]
) -> Iterator[Captured]:
    """Record what the attention function computes with in ``modules`` (keyed (kind, layer)) while the block
    runs (:func:`wrapped_attention`); yields a :data:`Captured` filled on every forward, keys repeated to
    the query heads, everything detached.

    Needs an implementation that returns its probabilities (this project's, or any registered one that
    does): ``sdpa`` and the flash kernels return none.
    """
    name = model.config._attn_implementation
    if name in _UNRECORDABLE:
        raise ValueError(
            f"attention implementation {name!r} cannot be recorded (it returns no attention probabilities); "
            "load the teacher with attn_implementation='entmax'"
        )
    where = {id(module): key for key, module in modules.items()}
    captured: Captured = {}

    def recording(original: AttentionFunction) -> AttentionFunction:
        def record(module: nn.Module, query: Tensor, key: Tensor, *args: Any, **kwargs: Any):
            output, probs = original(module, query, key, *args, **kwargs)
            if id(module) in where:
                if probs is None:
                    raise RuntimeError(f"attention implementation {name!r} returned no probabilities")
                groups = query.shape[1] // key.shape[1]  # grouped-query attention shares keys between heads
                captured[where[id(module)]] = (
                    query.detach(),
                    key.detach().repeat_interleave(groups, dim=1),
                    probs.detach(),
                )
            return output, probs

        return record

    with wrapped_attention(model, recording):
        yield captured


@contextmanager
def time_attention(model: PreTrainedModel) -> Iterator[list[float]]:
    """Sum the wall time spent inside ``model``'s attention function while the block runs; yields a
    one-item list holding the seconds so far (synchronising CUDA around every call, so that the time is
    the attention's own)."""
    spent = [0.0]

    def timing(original: AttentionFunction) -> AttentionFunction:
        def timed(*args: Any, **kwargs: Any):
            synchronize()
            started = time.perf_counter()
            result = original(*args, **kwargs)
            synchronize()
            spent[0] += time.perf_counter() - started
            return result

        return timed

    with wrapped_attention(model, timing):
        yield spent


def synchronize() -> None:
    """Wait for queued CUDA work (a no-op on CPU), so that a wall time covers what was launched."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
