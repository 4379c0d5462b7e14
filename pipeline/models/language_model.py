"""Language models of the block tasks, built from scratch: a Llama decoder (``lm`` and ``mqar``: causal,
rotary positions, grouped keys off) or a ModernBERT encoder (``mlm``: bidirectional, rotary positions,
pre-LayerNorm, masked tokens).

Both take their sizes from the pretrain section's model shape: the decoder-only LM has
``decoder_layers`` layers, the encoder-only MLM ``encoder_layers``; ``max_positions`` must cover the
corpus's ``context``. Input and output embeddings are tied, as in the translation models.

Why ModernBERT and not RoBERTa for the MLM: a RoBERTa of the mlm profile's size (d 128, 4 layers, 512-token
blocks, batch 8) stays on the unigram plateau on a CPU budget: after 300 steps its validation loss is the
entropy of the token frequencies (6.65 against 6.62) at learning rates 5e-4 and 2e-3, and after 600 steps
with 30 % of the tokens masked it is still at 6.35, where a ModernBERT of the same size is at 4.8 and, after
1,000 steps, at 3.93 with 31 % of the masked tokens right. RoBERTa's positions are a table learned from
scratch, and a masked token can only be predicted from its neighbours once that table says who they are;
rotary positions give every layer relative positions from the first step, and the pre-LayerNorm residual
stream trains stably at a high learning rate. Through the pipeline (configs/mlm.yaml: 2,000 steps without
dropout, then 200 α-entmax steps) the teacher predicts 0.333 [0.320, 0.348] of the validation split's masked
tokens (6,079 tokens in 80 blocks, 95 % bootstrap over blocks).
"""

from __future__ import annotations

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    ModernBertConfig,
    ModernBertForMaskedLM,
    PreTrainedModel,
)

from pipeline.corpus_card import CAUSAL_TASKS
from pipeline.models.seeding import built_with_seed
from pipeline.params.training import ModelShape


def build_language_model(
    task: str, shape: ModelShape, vocab_size: int, *, pad_id: int, eos_id: int, seed: int
) -> PreTrainedModel:
    """A fresh model of ``task`` ("lm" or "mqar": a decoder; "mlm": an encoder), its weights drawn from
    ``seed``."""
    if task in CAUSAL_TASKS:
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=shape.d_model,
            intermediate_size=shape.ffn_dim,
            num_hidden_layers=shape.decoder_layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.heads,
            max_position_embeddings=shape.max_positions,
            attention_dropout=0.0,
            pad_token_id=pad_id,
            bos_token_id=eos_id,  # a block may start anywhere in a document: no start token of its own
            eos_token_id=eos_id,
            tie_word_embeddings=True,
        )
        return built_with_seed(seed, lambda: LlamaForCausalLM(config))
    if task == "mlm":
        config = ModernBertConfig(
            vocab_size=vocab_size,
            hidden_size=shape.d_model,
            intermediate_size=shape.ffn_dim,
            num_hidden_layers=shape.encoder_layers,
            num_attention_heads=shape.heads,
            # every layer attends to the whole block (ModernBERT's default alternates with local windows):
            # the graphs extracted are of full attention
            layer_types=["full_attention"] * shape.encoder_layers,
            max_position_embeddings=shape.max_positions,
            mlp_dropout=shape.dropout,
            attention_dropout=0.0,
            pad_token_id=pad_id,
            bos_token_id=eos_id,
            eos_token_id=eos_id,
            cls_token_id=eos_id,
            sep_token_id=eos_id,
            tie_word_embeddings=True,
        )
        return built_with_seed(seed, lambda: ModernBertForMaskedLM(config))
    raise ValueError(f"task {task!r} has no language model; allowed: lm, mlm, mqar")


def max_context(model: PreTrainedModel) -> int | None:
    """The longest sequence ``model`` can read: its table of learned positions (RoBERTa's counts the pad
    offset too), or None for rotary positions, which any length can take."""
    if any(type(module).__name__.endswith("RotaryEmbedding") for module in model.modules()):
        return None
    positions = model.config.max_position_embeddings
    if model.config.model_type in ("roberta", "xlm-roberta"):
        positions -= model.config.pad_token_id + 1
    return positions
