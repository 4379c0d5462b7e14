"""Marian encoder–decoder built from scratch, or loaded from a Hugging Face checkpoint."""

from __future__ import annotations

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
    PreTrainedModel,
)

from pipeline.params import Evaluation, ModelShape


def build_marian(shape: ModelShape, vocab_size: int, pad_id: int, eos_id: int, seed: int) -> MarianMTModel:
    """A fresh Marian model with tied embeddings (shared source/target vocabulary and output layer), its
    weights initialised from ``seed`` (the Trainer seeds only what happens after the model exists).

    The weights draw from a stream of their own, derived from ``seed``: the Trainer restarts the global
    generator from ``seed`` itself for dropout and data order, and weights drawn from that very stream
    would be correlated with them.
    """
    config = MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=shape.d_model,
        encoder_layers=shape.encoder_layers,
        decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn_dim,
        decoder_ffn_dim=shape.ffn_dim,
        dropout=shape.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=shape.max_positions,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        decoder_start_token_id=pad_id,
        forced_eos_token_id=eos_id,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        scale_embedding=True,
    )
    init_seed = int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        return MarianMTModel(config)


def load_seq2seq(source: str, attn_implementation: str | None = None, **config_overrides) -> PreTrainedModel:
    """Load an encoder–decoder from a folder or hub id; ``config_overrides`` land on its config."""
    config = AutoConfig.from_pretrained(source)
    for name, value in config_overrides.items():
        setattr(config, name, value)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return AutoModelForSeq2SeqLM.from_pretrained(source, config=config, **kwargs)


def set_generation(model: PreTrainedModel, evaluation: Evaluation) -> None:
    """Beam search settings saved with the model (generation_config.json)."""
    config = model.config
    model.generation_config = GenerationConfig(
        num_beams=evaluation.beams,
        max_new_tokens=evaluation.max_new_tokens,
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        bad_words_ids=[[config.pad_token_id]],
        early_stopping=True,
    )
