"""One registration path for every attention implementation of this project, and where module state lives.

An implementation is an attention function in the ``transformers.AttentionInterface`` signature,
registered under a name with both ``AttentionInterface`` and ``AttentionMaskInterface``
(:func:`register_attention`); a model built with ``attn_implementation=NAME`` then calls it from every
attention module. Per-module state (a learned α, projections, centroids, ...) is a submodule of those
attention modules (:func:`attention_modules`), so ``save_pretrained`` writes it with the model; an
implementation whose state ``from_pretrained`` cannot rebuild registers a *state attacher*
(:func:`register_state_attacher`) that :func:`pipeline.attention.loading.load_model` runs before loading
the weights. An implementation whose training adds a term to the loss (a regulariser) registers a *loss
penalty* (:func:`register_loss_penalty`), which the student trainer adds to every training step's loss. An
implementation that keeps more than keys and values while generating registers a *generation cache*
(:func:`register_generation_cache`), which :func:`generation_cache` hands to ``generate``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

AttentionFunction = Callable[..., tuple[Tensor, Tensor | None]]
StateAttacher = Callable[[PreTrainedModel], None]
LossPenalty = Callable[[nn.Module], Tensor | None]
CacheMaker = Callable[[PreTrainedModel], Cache | None]

# the module whose import registers every attention implementation of this project
IMPLEMENTATIONS_MODULE = "pipeline.attention.implementations"
# the call that rebuilds a saved model with its attention state, for messages
RIGHT_LOAD = f"import {IMPLEMENTATIONS_MODULE} and load the folder with pipeline.attention.load_model(folder)"

_STATE_ATTACHERS: dict[str, StateAttacher] = {}
_STRUCTURES: list[str] = []
_LOSS_PENALTIES: dict[str, LossPenalty] = {}
_CACHE_MAKERS: dict[str, CacheMaker] = {}


def boolean_attention_mask(**kwargs: Any) -> Tensor:
    """Mask function for ``AttentionMaskInterface``: ``sdpa_mask`` with every skip disabled.

    ``sdpa_mask`` returns None for a plain causal mask (SDPA then uses ``is_causal``) or a full mask, so a
    None would be ambiguous; here the mask is always a boolean (batch, 1, q_len, k_len) tensor with
    True = attend, covering padding, causality and cache offsets.
    """
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return sdpa_mask(**kwargs)


def causal_skipping_mask(**kwargs: Any) -> Tensor | None:
    """Mask function for ``AttentionMaskInterface``: None where the mask is exactly causal over whole
    sequences, else :func:`boolean_attention_mask`'s tensor.

    None here means what it means to SDPA's integration (a causal module's queries see the keys up to their
    own position): as many queries as keys, none cached before them, no padding (all of the 2-D mask's first
    ``kv_length`` positions True), no local window, and the caller allowing the causal skip
    (``create_causal_mask`` does for a plain causal mask only, not for packed sequences or extra mask
    functions; ``create_bidirectional_mask`` never does). An attention function registered with it reads
    None through :func:`causal_or_given`. It spares building the n × n mask per forward (10 ms at 4k tokens)
    where a kernel takes causality as a flag.
    """
    n, m = kwargs["q_length"], kwargs["kv_length"]
    padding = kwargs.get("attention_mask")
    whole = (
        kwargs.get("allow_is_causal_skip", False)
        and n == m
        and all(
            isinstance(offset, int) and offset == 0
            for offset in (kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0))
        )
        and kwargs.get("local_size") is None
        and (padding is None or bool(padding[:, :m].all()))
    )
    return None if whole else boolean_attention_mask(**kwargs)


@functools.lru_cache(maxsize=1)  # one length at a time: n² bytes are held until the next
def _causal_pairs(n: int, device: torch.device) -> Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]


def causal_or_given(
    module: nn.Module, attention_mask: Tensor | None, n: int, m: int, device: torch.device
) -> Tensor | None:
    """The mask an attention function registered with :func:`causal_skipping_mask` was meant to get:
    ``attention_mask`` itself, or where it is None for a causal module's (``module.is_causal``, True when
    unset, as SDPA's integration reads it) n = m queries and keys, the causal (1, 1, n, n) boolean mask
    (built once per length and device and shared: never write into it)."""
    if attention_mask is None and getattr(module, "is_causal", True) and n == m:
        return _causal_pairs(n, device)
    return attention_mask


def register_attention(name: str, attention_fn: AttentionFunction, *, skip_causal: bool = False) -> None:
    """Register ``attention_fn`` as ``name`` with both interfaces, masks from :func:`boolean_attention_mask`
    (``skip_causal``: from :func:`causal_skipping_mask`, for a function that reads None through
    :func:`causal_or_given`).

    Registering only the attention function is not enough: masking_utils returns no mask at all for names
    the mask interface does not know, so padding and causality would be silently dropped.
    """
    AttentionInterface.register(name, attention_fn)
    AttentionMaskInterface.register(name, causal_skipping_mask if skip_causal else boolean_attention_mask)


def register_state_attacher(name: str, attacher: StateAttacher) -> None:
    """Run ``attacher(model)`` on every model :func:`~pipeline.attention.loading.load_model` builds.

    An attacher reads the model's config and, when the config asks for its state, gives the attention
    modules the (uninitialised) submodules the checkpoint's tensors are then loaded into.
    """
    _STATE_ATTACHERS[name] = attacher


def attach_state(model: PreTrainedModel) -> None:
    """Run every registered state attacher on ``model`` (in registration order)."""
    for attacher in _STATE_ATTACHERS.values():
        attacher(model)


def mark_stateless(model: nn.Module, name: str) -> None:
    """Say of every attention module of ``model`` that has no ``module.<name>`` that it is meant to have
    none (``module.<name> = None``): the attach functions call this once the modules of the configured
    kinds have theirs, so that :func:`refuse_missing_state` tells those from a model built without them."""
    for _, module in attention_modules(model):
        if not hasattr(module, name):
            setattr(module, name, None)


def refuse_missing_state(module: nn.Module, name: str) -> None:
    """Raise a one-line error when ``module``'s config records ``name`` settings (``config.<name>``) but
    the module was never told about its state (no ``module.<name>``, not even None).

    That is a model built by plain ``from_pretrained``, which cannot rebuild the state and drops its
    tensors: computing dense α-entmax in its place would silently be another model.
    """
    config = getattr(module, "config", None)
    if getattr(config, name, None) is not None and not hasattr(module, name):
        raise RuntimeError(
            f"{type(module).__name__} has no {name} state although its config records {name} settings "
            f"(plain from_pretrained leaves it out); {RIGHT_LOAD}"
        )


def register_structure(name: str) -> None:
    """Say that ``config.<name>`` records a structure the model is rebuilt into before its weights load
    (PAR's stacks), which the builder marks on every attention module (:func:`mark_stateless`), so that
    :func:`refuse_unbuilt` stops a model built without it (plain ``from_pretrained``) at its first forward."""
    if name not in _STRUCTURES:
        _STRUCTURES.append(name)


def refuse_unbuilt(module: nn.Module) -> None:
    """:func:`refuse_missing_state` for every registered structure; every attention function runs it."""
    for name in _STRUCTURES:
        refuse_missing_state(module, name)


def register_loss_penalty(name: str, penalty: LossPenalty) -> None:
    """Add ``penalty(model)`` to the training loss of every student (:func:`loss_penalty`).

    A penalty returns the term for the model's last training forward, already weighted, and forgets it
    (each forward's term is taken once), or None when that forward gave none.
    """
    _LOSS_PENALTIES[name] = penalty


def loss_penalty(model: nn.Module) -> Tensor | None:
    """The sum of every registered penalty's term for ``model``'s last training forward (None: no term)."""
    terms = [term for penalty in _LOSS_PENALTIES.values() if (term := penalty(model)) is not None]
    return sum(terms[1:], terms[0]) if terms else None


def register_generation_cache(name: str, maker: CacheMaker) -> None:
    """Let ``maker(model)`` give the cache ``generate`` runs ``model`` with (None: not one of its models)."""
    _CACHE_MAKERS[name] = maker


def generation_cache(model: PreTrainedModel) -> Cache | None:
    """The first registered maker's cache for ``model``; None when none has one (``generate`` then makes
    its own). A cache serves one ``generate`` call."""
    for maker in _CACHE_MAKERS.values():
        if (cache := maker(model)) is not None:
            return cache
    return None


def mask_scores(scores: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Exclude key positions from ``scores`` (batch, heads, queries, keys) by setting them to −inf.

    ``attention_mask`` is None (attend everywhere), boolean (True = attend) or additive float, where
    Hugging Face marks excluded pairs with the dtype's most negative finite value; those become −inf so
    that no finite constant ever stands in for "excluded" (an entmax with a finite stand-in could give it
    nonzero probability). Other additive values are added as a bias. Broadcasts over batch and heads;
    a mask longer than the keys (static caches) is cut to the key length.
    """
    if attention_mask is None:
        return scores
    mask = attention_mask[..., : scores.shape[-1]]
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    excluded = mask <= torch.finfo(mask.dtype).min
    return (scores + mask.to(scores.dtype)).masked_fill(excluded, float("-inf"))


@functools.cache
def _dispatches_through_interface(cls: type) -> bool:
    # The module handed to the attention function is the one whose forward looks the function up.
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) for every module of ``model`` whose forward dispatches through the attention interface.

    These are the ``module`` arguments the attention function receives, hence where per-module attention
    state (learned α, projections, ...) is attached.
    """
    return [
        (name, module)
        for name, module in model.named_modules()
        if _dispatches_through_interface(type(module))
    ]


def module_heads(module: nn.Module) -> int:
    """How many attention heads an attention module has (the attribute name varies by architecture)."""
    for attribute in ("num_heads", "num_attention_heads", "n_heads", "n_head"):
        value = getattr(module, attribute, None)
        if isinstance(value, int):
            return value
    value = getattr(getattr(module, "config", None), "num_attention_heads", None)
    if isinstance(value, int):
        return value
    raise ValueError(f"cannot tell how many attention heads {type(module).__name__} has")


def module_head_dim(module: nn.Module) -> int:
    """The size of one head of an attention module: ``head_dim`` (BERT-likes: ``attention_head_size``)."""
    for attribute in ("head_dim", "attention_head_size"):
        value = getattr(module, attribute, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"cannot tell the head size of {type(module).__name__}")


def module_scaling(module: nn.Module) -> float:
    """The factor an attention module's scores q·kᵀ are multiplied by: its ``scaling`` (Llama, Marian, BERT-
    likes), else d^−½ of its head size, which is what a module that hands its scaling over at call time
    passes (ModernBERT)."""
    scaling = getattr(module, "scaling", None)
    return float(module_head_dim(module) ** -0.5 if scaling is None else scaling)


def attach_to_modules(
    model: PreTrainedModel, attribute: str, make: Callable[[str, nn.Module], nn.Module]
) -> list[str]:
    """Give every attention module a submodule ``attribute`` = ``make(name, module)``, on its device.

    Modules that already have one keep it. Returns the names of the attention modules; a model with none
    is an error (its attention cannot be replaced through the interface).
    """
    names = []
    for name, module in attention_modules(model):
        if getattr(module, attribute, None) is None:
            device = next(module.parameters()).device
            setattr(module, attribute, make(name, module).to(device))
        names.append(name)
    if not names:
        raise ValueError(
            f"{type(model).__name__} has no module that dispatches through the attention interface"
        )
    return names
