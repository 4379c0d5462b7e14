"""α-entmax attention for every model that dispatches through Hugging Face's attention interface.

    α-entmax(z) = [(α − 1) z − τ 1]₊^{1/(α−1)},   τ such that the result sums to 1.

The normaliser is :func:`attention_kernels.entmax.dense.entmax_normalize` (softmax at α = 1, exact sorting at
1.5 and 2, bisection otherwise and for a learned per-head α). For α > 1 the attention probabilities are
exactly sparse, which is what the teacher's attention graphs are made of.

Importing :mod:`pipeline.attention` registers the name ``entmax`` (see :mod:`pipeline.attention.interface`),
so ``attn_implementation="entmax"`` works with every such model (Marian, BART, T5, BERT, RoBERTa, GPT-2,
Llama, ...).

Config attributes read: ``entmax_alpha`` (float ≥ 1, default 1.5) and ``entmax_learn_alpha`` (bool,
default False; then every attention module carries a :class:`LearnedAlpha`, see :func:`attach_learned_alpha`).
Each attention module reads them from its own ``module.config``, which is the model's config in most
families but a copy in T5's stacks: set α in the config before the model is built, or with
:func:`set_entmax_alpha`, which reaches every copy.

In eval mode, scores that are not finite (NaN or infinite weights: a corrupt or diverged checkpoint) stop
the forward pass with one :class:`~pipeline.errors.UserError` line naming the layer and kind
(:func:`label_attention_modules` names the modules when a model is loaded), instead of an index error deep
inside the normalizer.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from attention_kernels.entmax.dense import compute_dtype, entmax_normalize
from pipeline.attention.interface import (
    RIGHT_LOAD,
    attach_to_modules,
    attention_modules,
    mask_scores,
    module_heads,
    refuse_unbuilt,
    register_attention,
    register_state_attacher,
)
from pipeline.attention.recording import UnsupportedLayoutError, attention_layers, layout_kinds, model_layout
from pipeline.attention_kinds import KINDS
from pipeline.errors import UserError

ENTMAX = "entmax"
DEFAULT_ALPHA = 1.5
KIND_NAMES = {
    "decoder_self": "decoder self-attention",
    "encoder_self": "encoder self-attention",
    "cross": "cross-attention",
}


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
        theta = self.theta.to(compute_dtype(self.theta.dtype))  # a bf16 model's α still in float32
        return (1.0 + nn.functional.softplus(theta)).view(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return f"num_heads={self.theta.numel()}"


def checked_alpha(alpha: float) -> float:
    """``alpha`` as a float once it is ≥ 1 (1 is softmax); a ValueError otherwise."""
    alpha = float(alpha)
    if not alpha >= 1.0:
        raise ValueError(f"entmax_alpha must be a number >= 1 (1 is softmax), got {alpha}")
    return alpha


def config_alpha(config: Any) -> float:
    """The fixed α a config asks for: ``config.entmax_alpha``, 1.5 when absent; α < 1 is rejected."""
    return checked_alpha(getattr(config, "entmax_alpha", DEFAULT_ALPHA))


def set_entmax_alpha(model: nn.Module, alpha: float) -> None:
    """Make every attention module of ``model`` compute with the fixed α ``alpha`` (≥ 1; 1 is softmax).

    ``model.config.entmax_alpha = alpha`` alone is not enough where a model's parts hold copies of its
    config (T5's encoder and decoder stacks): this sets it on the model's config and on every config its
    modules read. A module with a :class:`LearnedAlpha` keeps computing with that.
    """
    alpha = checked_alpha(alpha)
    for module in model.modules():  # the model itself first
        if (config := getattr(module, "config", None)) is not None:
            config.entmax_alpha = alpha


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
            f"entmax_learn_alpha (plain from_pretrained leaves it out); {RIGHT_LOAD}, or call "
            "attach_learned_alpha first"
        )
    return config_alpha(config)


def attention_inputs(
    name: str,
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scaling: float | None,
    kwargs: dict[str, Any],
) -> tuple[Tensor, Tensor, float]:
    """(key, value, scaling) as every attention of this project computes with them: keys and values
    repeated to the query heads when the module groups queries (``num_key_value_groups``), and the
    default scaling d^−½; options no α-entmax attention supports are refused, naming attention ``name``."""
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"{name} attention does not support `{unsupported}`")
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    return key, value, query.shape[-1] ** -0.5 if scaling is None else scaling


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
    Scores and the normalizer are computed in :func:`~attention_kernels.entmax.dense.compute_dtype` (float32,
    or float64 for float64 inputs); the output is cast back to the value dtype. Returns the output (batch,
    q_len, heads, d) and the probabilities in that compute dtype (batch, heads, q_len, k_len), after dropout
    exactly like eager attention.
    """
    refuse_unbuilt(module)
    key, value, scaling = attention_inputs("entmax", module, query, key, value, scaling, kwargs)
    compute = compute_dtype(query.dtype)
    scores = torch.matmul(query.to(compute), key.to(compute).transpose(-1, -2)) * scaling  # (b, h, q, k)
    if not module.training:  # training has its own guard: a non-finite loss stops it (pipeline.finite)
        require_finite_scores(scores, module)
    if position_bias is not None:
        scores = scores + position_bias.to(compute)
    scores = mask_scores(scores, attention_mask)
    probs = entmax_normalize(scores, attention_alpha(module))
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)

    output = torch.matmul(probs.to(value.dtype), value)  # (b, h, q, d)
    return output.transpose(1, 2).contiguous(), probs


def require_finite_scores(scores: Tensor, module: nn.Module) -> None:
    """Raise a one-line :class:`UserError` naming ``module``'s layer when q·kᵀ ``scores`` are not all
    finite. Checked before masking and biases, which bring −inf and the dtype's most negative value on
    purpose; one reduction per call, small next to the normalizer's sort, and only in eval mode (extract,
    evaluate, generation), so training on a GPU never waits on it."""
    # min and max carry any NaN or ±inf: two numbers reduced in one pass, not a boolean (b, h, q, k) tensor
    if scores.numel() and not torch.isfinite(torch.stack(torch.aminmax(scores))).all():
        raise UserError(
            f"the attention scores are not finite in {_label(module)}: the model's weights or inputs hold "
            "NaN or infinite values (a corrupt or diverged checkpoint)"
        )


def _label(module: nn.Module) -> str:
    """Where ``module`` is: its :func:`label_attention_modules` label, else its class and layer index."""
    label = getattr(module, "attention_label", None)
    if label is not None:
        return label
    layer = getattr(module, "layer_idx", None)
    return type(module).__name__ + ("" if layer is None else f" of layer {layer}")


def label_attention_modules(model: PreTrainedModel) -> None:
    """Give every attention module of ``model`` an ``attention_label`` saying where it is, ``layer 2
    (decoder self-attention)``, for messages raised inside the attention function, which sees the module
    alone. A layout :func:`~pipeline.attention.recording.attention_layers` cannot split into kinds
    (encoder–decoders that are not laid out like Marian) names the module by its path in the model."""
    for name, module in attention_modules(model):
        module.attention_label = f"the attention module {name}"
    try:
        kinds = {kind: attention_layers(model, KINDS[kind]) for kind in layout_kinds(model_layout(model))}
    except UnsupportedLayoutError:  # no ``layers`` list where the Marian/BART layout has one
        return
    for kind, modules in kinds.items():
        for layer, module in enumerate(modules):
            module.attention_label = f"layer {layer} ({KIND_NAMES[kind]})"


def attach_learned_alpha(model: PreTrainedModel) -> list[str]:
    """Give every attention module a :class:`LearnedAlpha` (as ``module.entmax_alpha``), starting at the
    config's α, and record ``entmax_learn_alpha = True`` in the config so that
    :func:`~pipeline.attention.loading.load_model` rebuilds it. Modules that already have one keep it.
    Returns the names of the attention modules.
    """
    init = config_alpha(model.config)
    names = attach_to_modules(
        model, "entmax_alpha", lambda _name, module: LearnedAlpha(module_heads(module), init)
    )
    model.config.entmax_learn_alpha = True
    return names


def _attach_entmax_state(model: PreTrainedModel) -> None:
    """What every loaded model gets: its attention modules' labels, and a learned α when configured."""
    label_attention_modules(model)
    if getattr(model.config, "entmax_learn_alpha", False):
        attach_learned_alpha(model)


def register_entmax() -> None:
    """Make ``attn_implementation="entmax"`` available to every model using the attention interface."""
    register_attention(ENTMAX, entmax_attention_forward)
    register_state_attacher(ENTMAX, _attach_entmax_state)
