"""α-entmax attention for every model that dispatches through Hugging Face's attention interface.

    α-entmax(z) = [(α − 1) z − τ 1]₊^{1/(α−1)},   τ such that the result sums to 1.

α = 1 is softmax, α = 1.5 is computed exactly by sorting (``entmax.entmax15``), α = 2 is sparsemax (also
exact), any other α > 1 — and a learned per-head α — by bisection (``entmax.entmax_bisect``). For α > 1
the attention probabilities are exactly sparse, which is what the teacher's attention graphs are made of.

Registering the name ``entmax`` (:func:`register_entmax`) with both ``transformers.AttentionInterface`` and
``transformers.AttentionMaskInterface`` makes ``attn_implementation="entmax"`` work with every such model
(Marian, BART, T5, BERT, RoBERTa, GPT-2, Llama, ...). The mask function always materializes a boolean mask,
so the attention function never has to guess whether a missing mask means "causal".

Config attributes read: ``entmax_alpha`` (float ≥ 1, default 1.5) and ``entmax_learn_alpha`` (bool,
default False; then every attention module carries a :class:`LearnedAlpha`, see :func:`attach_learned_alpha`).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from entmax import entmax15, entmax_bisect, sparsemax
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import AttentionInterface, AutoConfig, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ENTMAX = "entmax"
DEFAULT_ALPHA = 1.5


class LearnedAlpha(nn.Module):
    """One α per head, parametrised as α_h = 1 + softplus(θ_h) so that α_h > 1 for every real θ_h.

    Calling the module returns α with shape (1, heads, 1, 1), ready to broadcast against attention scores
    of shape (batch, heads, queries, keys).
    """

    def __init__(self, num_heads: int, init: float = DEFAULT_ALPHA) -> None:
        super().__init__()
        if not init > 1.0:
            raise ValueError(f"a learned entmax alpha must start above 1, got {init}")
        # softplus⁻¹(y) = log(eˣ − 1) with y = α − 1, so that forward() returns exactly `init`.
        theta = math.log(math.expm1(init - 1.0))
        self.theta = nn.Parameter(torch.full((num_heads,), theta, dtype=torch.float32))

    def forward(self) -> Tensor:
        return (1.0 + nn.functional.softplus(self.theta.float())).view(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return f"num_heads={self.theta.numel()}"


def config_alpha(config: Any) -> float:
    """The fixed α a config asks for: ``config.entmax_alpha``, 1.5 when absent; α < 1 is rejected."""
    alpha = float(getattr(config, "entmax_alpha", DEFAULT_ALPHA))
    if not alpha >= 1.0:
        raise ValueError(f"entmax_alpha must be a number >= 1 (1 is softmax), got {alpha}")
    return alpha


def attention_alpha(module: nn.Module) -> float | Tensor:
    """α for one attention module: its :class:`LearnedAlpha` when it has one, else the config's fixed α."""
    learned = getattr(module, "entmax_alpha", None)
    if isinstance(learned, LearnedAlpha):
        return learned()
    config = getattr(module, "config", None)
    if getattr(config, "entmax_learn_alpha", False):
        # from_pretrained drops the learned α silently; computing with the fixed α instead would be wrong.
        raise RuntimeError(
            f"{type(module).__name__} has no learned entmax alpha although the config sets "
            "entmax_learn_alpha; load the model with pipeline.attention.load_model "
            "or call attach_learned_alpha first"
        )
    return config_alpha(config)


def entmax_normalize(scores: Tensor, alpha: float | Tensor) -> Tensor:
    """α-entmax over the last dimension of float32 ``scores`` in which −inf marks excluded keys.

    Rows with no finite score (a padding query that may attend to nothing) give all zeros instead of NaN.
    ``alpha`` is a float ≥ 1 or a tensor broadcastable to ``scores`` with size 1 in the last dimension
    (gradients flow into it). Excluded keys always get exactly zero probability and zero gradient.
    """
    has_key = (scores != float("-inf")).any(dim=-1, keepdim=True)
    # Neutral finite scores keep the normalizers away from all −inf rows (entmax15 indexes out of range and
    # softmax returns NaN there); those rows are zeroed afterwards.
    scores = scores.masked_fill(~has_key, 0.0)
    if isinstance(alpha, Tensor):
        probs = entmax_bisect(scores, alpha.to(scores.dtype), dim=-1)
    elif alpha == 1.0:
        probs = torch.softmax(scores, dim=-1)
    elif alpha == 1.5:
        probs = entmax15(scores, dim=-1)
    elif alpha == 2.0:
        probs = sparsemax(scores, dim=-1)
    else:
        probs = entmax_bisect(scores, alpha, dim=-1)
    return probs.masked_fill(~has_key, 0.0)


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


def entmax_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_bias: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """Attention with α-entmax in place of softmax, in the ``transformers.AttentionInterface`` signature.

        P = α-entmax(scaling · Q Kᵀ + bias, masked by −inf),   out = P V

    Shapes: query (batch, heads, q_len, d); key and value (batch, kv_heads, k_len, d), repeated to ``heads``
    when the module groups queries (``num_key_value_groups``); attention_mask (batch, 1 | heads, q_len,
    ≥ k_len), see :func:`mask_scores`; position_bias (T5) is an additive (·, heads, q_len, k_len) tensor.
    Scores and the normalizer are computed in float32 (entmax is unstable in fp16/bf16); the output is cast
    back to the value dtype. Returns the output (batch, q_len, heads, d) and the float32 probabilities
    (batch, heads, q_len, k_len), after dropout exactly like eager attention.
    """
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"entmax attention does not support `{unsupported}`")
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5

    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling  # (b, h, q, k)
    if position_bias is not None:
        scores = scores + position_bias.float()
    scores = mask_scores(scores, attention_mask)
    probs = entmax_normalize(scores, attention_alpha(module))
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)

    output = torch.matmul(probs.to(value.dtype), value)  # (b, h, q, d)
    return output.transpose(1, 2).contiguous(), probs


def boolean_attention_mask(**kwargs: Any) -> Tensor:
    """Mask function for ``AttentionMaskInterface``: ``sdpa_mask`` with every skip disabled.

    ``sdpa_mask`` returns None for a plain causal mask (SDPA then uses ``is_causal``) or a full mask, so a
    None would be ambiguous; here the mask is always a boolean (batch, 1, q_len, k_len) tensor with
    True = attend, covering padding, causality and cache offsets.
    """
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return sdpa_mask(**kwargs)


def register_attention(name: str, attention_fn: Callable[..., tuple[Tensor, Tensor | None]]) -> None:
    """Register ``attention_fn`` as ``name`` with both interfaces, masks from :func:`boolean_attention_mask`.

    Registering only the attention function is not enough: masking_utils returns no mask at all for names
    the mask interface does not know, so padding and causality would be silently dropped.
    """
    AttentionInterface.register(name, attention_fn)
    AttentionMaskInterface.register(name, boolean_attention_mask)


def register_entmax() -> None:
    """Make ``attn_implementation="entmax"`` available to every model using the attention interface."""
    register_attention(ENTMAX, entmax_attention_forward)


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


def _num_heads(module: nn.Module) -> int:
    for attribute in ("num_heads", "num_attention_heads", "n_heads", "n_head"):
        value = getattr(module, attribute, None)
        if isinstance(value, int):
            return value
    value = getattr(getattr(module, "config", None), "num_attention_heads", None)
    if isinstance(value, int):
        return value
    raise ValueError(f"cannot tell how many attention heads {type(module).__name__} has")


def attach_learned_alpha(model: PreTrainedModel) -> list[str]:
    """Give every attention module a :class:`LearnedAlpha` (as ``module.entmax_alpha``), starting at the
    config's α, and record ``entmax_learn_alpha = True`` in the config so that :func:`load_model` rebuilds
    it. Modules that already have one keep it. Returns the names of the attention modules.
    """
    init = config_alpha(model.config)
    names = []
    for name, module in attention_modules(model):
        if not isinstance(getattr(module, "entmax_alpha", None), LearnedAlpha):
            device = next(module.parameters()).device
            module.entmax_alpha = LearnedAlpha(_num_heads(module), init).to(device)
        names.append(name)
    if not names:
        raise ValueError(
            f"{type(model).__name__} has no module that dispatches through the attention interface"
        )
    model.config.entmax_learn_alpha = True
    return names


def _load_state_dict(folder: Path) -> dict[str, Tensor]:
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return load_file(folder / "model.safetensors")
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    state: dict[str, Tensor] = {}
    for shard in shards:
        state.update(load_file(folder / shard))
    return state


def load_model(
    folder: str | os.PathLike,
    model_cls: type[PreTrainedModel] | None = None,
    *,
    attn_implementation: str = ENTMAX,
) -> PreTrainedModel:
    """Load a ``save_pretrained`` folder strictly, including learned α (which ``from_pretrained`` drops).

    The model is built from the folder's config (class from ``config.architectures`` unless ``model_cls``
    is given) with ``attn_implementation`` — it is not stored in config.json — gets its learned α attached
    when the config says so, and then loads model.safetensors (or its shards). Every stored tensor must
    find a parameter, and every parameter must be stored except those ``save_pretrained`` leaves out on
    purpose (tied weights, keys ignored on save). Returns the model in eval mode.
    """
    folder = Path(folder)
    if model_cls is None:
        config = AutoConfig.from_pretrained(folder)
        model_cls = getattr(transformers, config.architectures[0])
    else:
        config = model_cls.config_class.from_pretrained(folder)
    model = model_cls._from_config(config, attn_implementation=attn_implementation)
    if getattr(config, "entmax_learn_alpha", False):
        attach_learned_alpha(model)

    missing, unexpected = model.load_state_dict(_load_state_dict(folder), strict=False)
    left_out = set(model.all_tied_weights_keys) | set(model._keys_to_ignore_on_save)
    missing = sorted(set(missing) - left_out)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {folder} does not match {model_cls.__name__}: "
            f"missing {missing}, unexpected {sorted(unexpected)}"
        )
    return model.eval()
