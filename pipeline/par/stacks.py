"""PAR stacks: a model's layers rebuilt as a sequence of single sublayers, one per pattern letter.

Each sublayer is the residual block the teacher's layers are made of, in the teacher's own convention and
with its parameter names, so a teacher layer's part loads into it as it is. A Marian encoder and decoder
(post-LayerNorm):

    s:  x ← LN(x + SelfAttention(x))            self_attn, self_attn_layer_norm
    c:  x ← LN(x + CrossAttention(x, h_enc))    encoder_attn, encoder_attn_layer_norm
    f:  x ← LN(x + W₂ act(W₁ x))                fc1, fc2, final_layer_norm

A Llama decoder-only LM, one stack "decoder" (pre-RMSNorm, rotary positions inside the attention):

    s:  x ← x + SelfAttention(RMSNorm(x))       input_layernorm, self_attn
    f:  x ← x + MLP(RMSNorm(x))                 post_attention_layernorm, mlp

The stacks' own loops call each sublayer as they call one of their layers (a Llama's loop runs the first
``config.num_hidden_layers`` of them, which a rebuild sets to the pattern's length). The patterns live in
the config (``config.par = {stack: flat letters}``), so a saved PAR model loads from its folder alone:
:func:`~pipeline.attention.loading.load_model` calls :func:`build_configured_stacks` before loading the
weights.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple

from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicLayer, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm
from transformers.models.marian.modeling_marian import MarianAttention

from pipeline.attention.interface import mark_stateless, register_structure
from pipeline.errors import UserError
from pipeline.par.pattern import CROSS, FEED_FORWARD, SELF, Stack

PAR = "par"  # the config attribute holding the patterns
register_structure(PAR)  # a model built without its stacks (plain from_pretrained) refuses to run
# the model types PAR rebuilds, and whether their decoder reads an encoder
READS_ENCODER = {"marian": True, "llama": False}


def reads_encoder(model: PreTrainedModel) -> bool:
    """Whether ``model``'s decoder reads an encoder (Marian) or the model is decoder-only (Llama); a one-line
    :class:`UserError` for any other model type."""
    model_type = model.config.model_type
    if model_type not in READS_ENCODER:
        raise UserError(
            f"PAR rebuilds a model's stacks sublayer by sublayer, for {' and '.join(READS_ENCODER)} models; "
            f"this one is a {model_type}"
        )
    return READS_ENCODER[model_type]


def stack_modules(model: PreTrainedModel) -> dict[Stack, nn.Module]:
    """The stacks whose ``layers`` a pattern replaces: an encoder–decoder's encoder and decoder, a
    decoder-only LM's decoder."""
    if reads_encoder(model):
        return {"encoder": model.get_encoder(), "decoder": model.get_decoder()}
    return {"decoder": model.model}


def teacher_layers(model: PreTrainedModel) -> dict[Stack, int]:
    """The layers per stack a teacher's config declares (a PAR model's config keeps its teacher's for an
    encoder–decoder; a Llama's counts its sublayers)."""
    config = model.config
    if reads_encoder(model):
        return {"encoder": config.encoder_layers, "decoder": config.decoder_layers}
    return {"decoder": config.num_hidden_layers}


def _reserve_cache_layer(cache: Cache | None, layer_idx: int, *, cross: bool) -> None:
    """Give ``cache`` a slot for ``layer_idx``: a cache built from the config holds one per configured
    layer, and a pattern may hold more attention sublayers than that."""
    if cache is None:
        return
    if isinstance(cache, EncoderDecoderCache):
        cache = cache.cross_attention_cache if cross else cache.self_attention_cache
    while len(cache.layers) <= layer_idx:
        cache.layers.append(DynamicLayer())


class Context(NamedTuple):
    """What a stack's loop hands each layer besides the hidden states."""

    attention_mask: Tensor | None  # the stack's self-attention mask
    source: Tensor | None  # the encoder's output (decoder only)
    source_mask: Tensor | None  # the cross-attention mask
    cache: Cache | None
    kwargs: dict  # the attention interface's own arguments, passed through


class Sublayer(GradientCheckpointingLayer, ABC):
    """One residual sublayer, x ← LN(x + dropout(F(x))); called with a Marian layer's arguments.

    ``PARTS`` names the submodules a teacher layer's part of the same name loads into.
    """

    PARTS: tuple[str, ...] = ()
    LETTER: str = ""

    def __init__(self, config, stack: Stack, index: int) -> None:
        super().__init__()
        self.dropout = config.dropout
        self.heads = config.encoder_attention_heads if stack == "encoder" else config.decoder_attention_heads
        self.causal = stack == "decoder"
        self.index = index  # among the stack's sublayers of this kind: the attention's cache slot

    def build_attention(self, config, *, causal: bool) -> MarianAttention:
        """A Marian attention module with this sublayer's heads, caching in slot ``index``."""
        return MarianAttention(
            config.d_model,
            self.heads,
            dropout=config.attention_dropout,
            is_decoder=self.causal,
            is_causal=causal,
            config=config,
            layer_idx=self.index,
        )

    @abstractmethod
    def update(self, hidden_states: Tensor, context: Context) -> Tensor | None:
        """F(x), or None for no change (cross-attention without an encoder output)."""

    def forward(
        self,
        hidden_states: Tensor,  # (b, t, d)
        attention_mask: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Tensor:  # (b, t, d)
        context = Context(attention_mask, encoder_hidden_states, encoder_attention_mask, cache, kwargs)
        update = self.update(hidden_states, context)
        if update is None:
            return hidden_states
        update = nn.functional.dropout(update, p=self.dropout, training=self.training)
        return getattr(self, self.PARTS[-1])(hidden_states + update)


class SelfAttention(Sublayer):
    PARTS = ("self_attn", "self_attn_layer_norm")
    LETTER = SELF

    def __init__(self, config, stack: Stack, index: int) -> None:
        super().__init__(config, stack, index)
        self.self_attn = self.build_attention(config, causal=self.causal)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)

    def update(self, hidden_states: Tensor, context: Context) -> Tensor:
        _reserve_cache_layer(context.cache, self.index, cross=False)
        output, _ = self.self_attn(
            hidden_states, cache=context.cache, attention_mask=context.attention_mask, **context.kwargs
        )
        return output


class CrossAttention(Sublayer):
    PARTS = ("encoder_attn", "encoder_attn_layer_norm")
    LETTER = CROSS

    def __init__(self, config, stack: Stack, index: int) -> None:
        super().__init__(config, stack, index)
        self.encoder_attn = self.build_attention(config, causal=False)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model)

    def update(self, hidden_states: Tensor, context: Context) -> Tensor | None:
        if context.source is None:  # as Marian's decoder layer: no source, no cross-attention
            return None
        _reserve_cache_layer(context.cache, self.index, cross=True)
        output, _ = self.encoder_attn(
            hidden_states,
            key_value_states=context.source,
            attention_mask=context.source_mask,
            cache=context.cache,
            **context.kwargs,
        )
        return output


class FeedForward(Sublayer):
    PARTS = ("fc1", "fc2", "final_layer_norm")
    LETTER = FEED_FORWARD

    def __init__(self, config, stack: Stack, index: int) -> None:
        super().__init__(config, stack, index)
        width = config.encoder_ffn_dim if stack == "encoder" else config.decoder_ffn_dim
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout
        self.fc1 = nn.Linear(config.d_model, width)
        self.fc2 = nn.Linear(width, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def update(self, hidden_states: Tensor, context: Context) -> Tensor:
        hidden = self.activation_fn(self.fc1(hidden_states))  # (b, t, ffn)
        hidden = nn.functional.dropout(hidden, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden)


class PreNormSublayer(GradientCheckpointingLayer, ABC):
    """One pre-norm residual sublayer of a Llama decoder, x ← x + F(RMSNorm(x)); called with a Llama decoder
    layer's arguments. ``PARTS`` = (its norm, its block), named as in the teacher's layer."""

    PARTS: tuple[str, ...] = ()
    LETTER: str = ""

    def __init__(self, config, stack: Stack, index: int) -> None:
        super().__init__()
        self.index = index  # among the stack's sublayers of this kind: the attention's cache slot
        setattr(self, self.PARTS[0], LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps))

    @abstractmethod
    def update(self, hidden_states: Tensor, context: Context) -> Tensor:
        """F of the normalised hidden states."""

    def forward(
        self,
        hidden_states: Tensor,  # (b, t, d)
        attention_mask: Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,  # position_ids, position_embeddings, use_cache and the attention interface's own
    ) -> Tensor:  # (b, t, d)
        context = Context(attention_mask, None, None, cache, kwargs)
        return hidden_states + self.update(getattr(self, self.PARTS[0])(hidden_states), context)


class PreNormSelfAttention(PreNormSublayer):
    PARTS = ("input_layernorm", "self_attn")
    LETTER = SELF

    def __init__(self, config, stack: Stack, index: int) -> None:
        super().__init__(config, stack, index)
        self.self_attn = LlamaAttention(config, layer_idx=index)

    update = SelfAttention.update  # the same call: reserve the cache slot, attend (rotary inside kwargs)


class PreNormFeedForward(PreNormSublayer):
    PARTS = ("post_attention_layernorm", "mlp")
    LETTER = FEED_FORWARD

    def __init__(self, config, stack: Stack, index: int) -> None:
        super().__init__(config, stack, index)
        self.mlp = LlamaMLP(config)

    def update(self, hidden_states: Tensor, context: Context) -> Tensor:
        return self.mlp(hidden_states)


# per "reads an encoder": the sublayer of each letter
SUBLAYERS: dict[bool, dict[str, type[Sublayer] | type[PreNormSublayer]]] = {
    True: {cls.LETTER: cls for cls in (SelfAttention, CrossAttention, FeedForward)},
    False: {cls.LETTER: cls for cls in (PreNormSelfAttention, PreNormFeedForward)},
}


def sublayer_class(model: PreTrainedModel, letter: str) -> type[Sublayer] | type[PreNormSublayer]:
    """The sublayer ``model``'s stacks build for ``letter``."""
    return SUBLAYERS[reads_encoder(model)][letter]


def build_sublayers(model: PreTrainedModel, pattern: str, stack: Stack) -> list[Sublayer | PreNormSublayer]:
    """Fresh sublayers for a flat ``pattern``, initialised as the model initialises its own weights (from
    torch's global RNG); the k-th sublayer of a kind gets index k."""
    counts: Counter[str] = Counter()
    sublayers = []
    for letter in pattern:
        sublayer = sublayer_class(model, letter)(model.config, stack, counts[letter])
        counts[letter] += 1
        for module in sublayer.modules():
            model._init_weights(module)
        sublayers.append(sublayer)
    return sublayers


def replace_layers(model: PreTrainedModel, built: Mapping[Stack, list[nn.Module]]) -> None:
    """Put ``built`` in place of each stack's layers, in the stack's training mode."""
    for stack, module in stack_modules(model).items():
        module.layers = nn.ModuleList(built[stack]).train(module.training)
    if not reads_encoder(model):  # a Llama's loop runs the first num_hidden_layers layers
        model.config.num_hidden_layers = len(built["decoder"])
    mark_stateless(model, PAR)  # these attention modules sit in the stacks config.par records


def build_stacks(model: PreTrainedModel, patterns: Mapping[Stack, str]) -> None:
    """Replace every stack's layers by fresh sublayers of the flat ``patterns`` (one per stack of the
    model) and record them in the config (what :func:`build_configured_stacks` rebuilds from)."""
    stacks = list(stack_modules(model))
    replace_layers(model, {stack: build_sublayers(model, patterns[stack], stack) for stack in stacks})
    setattr(model.config, PAR, {stack: patterns[stack] for stack in stacks})


def build_configured_stacks(model: PreTrainedModel) -> None:
    """Rebuild the stacks a saved PAR model's config records; nothing for any other model."""
    patterns = getattr(model.config, PAR, None)
    if patterns is not None:
        build_stacks(model, patterns)
