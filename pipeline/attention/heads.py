"""Heads attached to a model's self-attention modules from a settings mapping recorded in its config.

An attention implementation named ``name`` (SSA, SBM, SAMSA) keeps its settings in ``config.<name>`` and
gives every self-attention module of the configured kinds a head, the submodule ``module.<name>``, which
its attention function consults. This module holds what they share: the one-line checks of the settings
(:class:`~pipeline.errors.UserError` messages starting with ``name``), the attach loop, the finder, the
state attacher that rebuilds the heads of a loaded model, and the head lookup of the attention function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from torch import Tensor, nn
from transformers import PreTrainedModel

from pipeline.attention.entmax import attention_inputs, entmax_attention_forward
from pipeline.attention.interface import (
    AttentionFunction,
    StateAttacher,
    mark_stateless,
    module_head_dim,
    module_heads,
    refuse_missing_state,
)
from pipeline.attention.recording import attention_layers, layout_kinds, model_layout
from pipeline.attention_kinds import attention_kind
from pipeline.errors import UserError

SELF_KINDS = ("encoder_self", "decoder_self")

Head = TypeVar("Head", bound=nn.Module)


class HeadAttention(Protocol):
    """An attention computed by a module's head: inputs as ``attention_inputs`` returns them."""

    def __call__(
        self,
        head: Any,
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        position_bias: Tensor | None,
        *,
        scaling: float,
        dropout: float,
    ) -> tuple[Tensor, Tensor | None]: ...


def check_setting_names(name: str, spec: Any, allowed: Sequence[str], *, required: bool) -> Mapping[str, Any]:
    """``spec`` itself once it is a mapping whose keys are all in ``allowed`` (and, when ``required``, hold
    every one of them); otherwise a one-line :class:`UserError` naming the first offending setting."""
    if not isinstance(spec, Mapping):
        raise UserError(f"{name} settings must be a mapping of {', '.join(allowed)}; got {spec!r}")
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise UserError(f"{name} has no setting {unknown[0]!r}; allowed: {', '.join(allowed)}")
    missing = [setting for setting in allowed if setting not in spec] if required else []
    if missing:
        raise UserError(f"{name} setting {missing[0]!r} is missing; needed: {', '.join(allowed)}")
    return spec


def check_kinds(name: str, kinds: Any, layers: Mapping[str, int] | None = None) -> list[str]:
    """``kinds`` as a list once it is a non-empty list of distinct :data:`SELF_KINDS`; with ``layers`` (the
    number of layers of each kind) also once the model has layers of every one; otherwise a one-line
    :class:`UserError`."""
    if (
        not isinstance(kinds, list | tuple)
        or not kinds
        or any(kind not in SELF_KINDS for kind in kinds)
        or len(set(kinds)) != len(kinds)
    ):
        raise UserError(
            f"{name} kinds must be a non-empty list of distinct {', '.join(SELF_KINDS)} "
            f"(cross-attention stays dense); got {kinds!r}"
        )
    for kind in kinds:
        if layers is not None and not layers.get(kind):
            raise UserError(f"{name} kinds include {kind} but the model has no {kind} layers")
    return list(kinds)


def check_integer(name: str, setting: str, value: Any, least: int = 1) -> int:
    """``value`` once it is an integer (not a bool) ≥ ``least``; otherwise a one-line :class:`UserError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UserError(f"{name} {setting} must be an integer >= {least}; got {value!r}")
    return value


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (a bool is not a number here)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def head_shape(module: nn.Module) -> tuple[int, int]:
    """(query heads, head dimension) of an attention module."""
    return module_heads(module), module_head_dim(module)


def attach_heads(
    model: PreTrainedModel,
    name: str,
    spec: Any,
    check: Callable[[Any, Mapping[str, int]], dict[str, Any]],
    make: Callable[[dict[str, Any], str, int, nn.Module], Head],
) -> list[Head]:
    """Give every self-attention module of the checked kinds its head ``module.<name>`` and record the
    checked settings as ``config.<name>``; returns the heads attached, in kind then layer order.

    The model must run ``attn_implementation=name`` (else ValueError: the heads would never be
    consulted). ``check(spec, layers per kind)`` returns the settings to record, holding ``"kinds"``;
    ``make(checked, kind, layer, module)`` builds one head, which is moved to the module's device.
    """
    implementation = model.config._attn_implementation
    if implementation != name:
        raise ValueError(
            f"{name.upper()} heads need attn_implementation={name!r}; this model runs {implementation!r}"
        )
    present = layout_kinds(model_layout(model))  # a decoder-only model has no encoder_self, ...
    modules = {kind: attention_layers(model, attention_kind(kind)) for kind in SELF_KINDS if kind in present}
    checked = check(spec, {kind: len(found) for kind, found in modules.items()})
    heads = []
    for kind in checked["kinds"]:
        for layer, module in enumerate(modules[kind]):
            head = make(checked, kind, layer, module)
            setattr(module, name, head.to(next(module.parameters()).device))
            heads.append(head)
    mark_stateless(model, name)
    setattr(model.config, name, checked)
    return heads


def heads_of_type(model: nn.Module, head_type: type[Head]) -> list[Head]:
    """Every submodule of ``model`` of ``head_type``, in module order (encoder layers, then decoder)."""
    return [module for module in model.modules() if isinstance(module, head_type)]


def state_attacher(
    name: str,
    find: Callable[[nn.Module], list[Any]],
    attach: Callable[[PreTrainedModel, Any], list[Any]],
) -> StateAttacher:
    """The state attacher that gives a loaded model the heads ``config.<name>`` records, with ``attach``.

    It attaches only to a model that runs ``attn_implementation=name`` (one loaded with another
    implementation, e.g. for a dense evaluation, consults no heads) and has no heads yet (``find``).
    """

    def attach_if_configured(model: PreTrainedModel) -> None:
        spec = getattr(model.config, name, None)
        if spec is not None and model.config._attn_implementation == name and not find(model):
            attach(model, spec)

    return attach_if_configured


def head_attention(
    name: str, active: Callable[[Any, bool], bool] | None = None
) -> Callable[[HeadAttention], AttentionFunction]:
    """Decorator: the attention function, in the ``transformers.AttentionInterface`` signature, that hands
    a module's head ``module.<name>`` and its inputs to the decorated function.

    A module without a head, or whose head is not ``active(head, module.training)`` (always active when
    ``active`` is None), gets :func:`~pipeline.attention.entmax.entmax_attention_forward` exactly.
    Otherwise keys, values and scaling are first resolved by
    :func:`~pipeline.attention.entmax.attention_inputs` (grouped heads repeated, scaling d^−½ by default,
    unsupported options refused). The result keeps the decorated function's name and docstring.
    """

    def decorate(attend: HeadAttention) -> AttentionFunction:
        def attention(
            module: nn.Module,
            query: Tensor,
            key: Tensor,
            value: Tensor,
            attention_mask: Tensor | None,
            scaling: float | None = None,
            dropout: float = 0.0,
            position_bias: Tensor | None = None,
            **kwargs: Any,
        ) -> tuple[Tensor, Tensor | None]:
            refuse_missing_state(module, name)
            head = getattr(module, name, None)
            if head is None or (active is not None and not active(head, module.training)):
                return entmax_attention_forward(
                    module, query, key, value, attention_mask, scaling, dropout, position_bias, **kwargs
                )
            key, value, scaling = attention_inputs(name, module, query, key, value, scaling, kwargs)
            return attend(
                head,
                module,
                query,
                key,
                value,
                attention_mask,
                position_bias,
                scaling=scaling,
                dropout=dropout,
            )

        attention.__name__, attention.__qualname__ = attend.__name__, attend.__qualname__
        attention.__module__, attention.__doc__ = attend.__module__, attend.__doc__
        return attention

    return decorate
