"""Language models of the block tasks, built from scratch: a Llama decoder (``lm``: causal, rotary
positions, grouped keys off) or a RoBERTa encoder (``mlm``: bidirectional, learned positions, masked
tokens).

Both take their sizes from the pretrain section's model shape: the decoder-only LM has
``decoder_layers`` layers, the encoder-only MLM ``encoder_layers``; ``max_positions`` must cover the
corpus's ``context``. Input and output embeddings are tied, as in the translation models.
"""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, RobertaConfig, RobertaForMaskedLM

from pipeline.models.seeding import built_with_seed
from pipeline.params.training import ModelShape


def build_language_model(
    task: str, shape: ModelShape, vocab_size: int, *, pad_id: int, eos_id: int, seed: int
) -> PreTrainedModel:
    """A fresh model of ``task`` ("lm" or "mlm"), its weights drawn from ``seed``."""
    if task == "lm":
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
        config = RobertaConfig(
            vocab_size=vocab_size,
            hidden_size=shape.d_model,
            intermediate_size=shape.ffn_dim,
            num_hidden_layers=shape.encoder_layers,
            num_attention_heads=shape.heads,
            hidden_dropout_prob=shape.dropout,
            attention_probs_dropout_prob=0.0,
            # RoBERTa numbers positions from pad_id + 1
            max_position_embeddings=shape.max_positions + pad_id + 1,
            type_vocab_size=1,
            pad_token_id=pad_id,
            bos_token_id=eos_id,
            eos_token_id=eos_id,
            tie_word_embeddings=True,
        )
        return built_with_seed(seed, lambda: RobertaForMaskedLM(config))
    raise ValueError(f"task {task!r} has no language model; allowed: lm, mlm")


def max_context(model: PreTrainedModel) -> int | None:
    """The longest sequence ``model`` can read: its table of learned positions (RoBERTa's counts the pad
    offset too), or None for rotary positions, which any length can take."""
    if any(type(module).__name__.endswith("RotaryEmbedding") for module in model.modules()):
        return None
    positions = model.config.max_position_embeddings
    if model.config.model_type in ("roberta", "xlm-roberta"):
        positions -= model.config.pad_token_id + 1
    return positions
