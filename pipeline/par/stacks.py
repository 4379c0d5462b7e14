"""PAR stacks: a Marian encoder and decoder rebuilt as a sequence of single sublayers, one per pattern letter.

Each sublayer is the post-LayerNorm residual block the teacher's layers are made of (Marian is post-LN,
and a student keeps its teacher's convention), with the teacher's parameter names, so a teacher layer's
part loads into it as it is:

    s:  x ← LN(x + SelfAttention(x))            self_attn, self_attn_layer_norm
    c:  x ← LN(x + CrossAttention(x, h_enc))    encoder_attn, encoder_attn_layer_norm
    f:  x ← LN(x + W₂ act(W₁ x))                fc1, fc2, final_layer_norm

The stacks' own loops call each sublayer as they call a Marian layer. The patterns live in the config
(``config.par = {"encoder": ..., "decoder": ...}``, flat letters), so a saved PAR model loads from its folder
alone: :func:`~pipeline.attention.loading.load_model` calls :func:`build_configured_stacks` before loading
the weights.
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
from transformers.models.marian.modeling_marian import MarianAttention

from pipeline.par.pattern import CROSS, FEED_FORWARD, SELF, Stack

PAR = "par"  # the config attribute holding the patterns
STACKS: tuple[Stack, ...] = ("encoder", "decoder")


def stack_modules(model: PreTrainedModel) -> dict[Stack, nn.Module]:
    """The encoder and decoder of an encoder–decoder, whose ``layers`` a pattern replaces."""
    return {"encoder": model.get_encoder(), "decoder": model.get_decoder()}


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


SUBLAYERS: dict[str, type[Sublayer]] = {
    cls.LETTER: cls for cls in (SelfAttention, CrossAttention, FeedForward)
}


def build_sublayers(model: PreTrainedModel, pattern: str, stack: Stack) -> list[Sublayer]:
    """Fresh sublayers for a flat ``pattern``, initialised as the model initialises its own weights (from
    torch's global RNG); the k-th sublayer of a kind gets index k."""
    counts: Counter[str] = Counter()
    sublayers = []
    for letter in pattern:
        sublayer = SUBLAYERS[letter](model.config, stack, counts[letter])
        counts[letter] += 1
        for module in sublayer.modules():
            model._init_weights(module)
        sublayers.append(sublayer)
    return sublayers


def build_stacks(model: PreTrainedModel, patterns: Mapping[Stack, str]) -> None:
    """Replace the encoder's and decoder's layers by fresh sublayers of the flat ``patterns`` and record
    them in the config (what :func:`build_configured_stacks` rebuilds from)."""
    for stack, module in stack_modules(model).items():
        module.layers = nn.ModuleList(build_sublayers(model, patterns[stack], stack)).train(module.training)
    setattr(model.config, PAR, {stack: patterns[stack] for stack in STACKS})


def build_configured_stacks(model: PreTrainedModel) -> None:
    """Rebuild the stacks a saved PAR model's config records; nothing for any other model."""
    patterns = getattr(model.config, PAR, None)
    if patterns is not None:
        build_stacks(model, patterns)
