"""Marian encoder–decoder built from scratch, and its beam-search settings."""

from __future__ import annotations

from transformers import GenerationConfig, MarianConfig, MarianMTModel, PreTrainedModel

from pipeline.models.seeding import built_with_seed
from pipeline.params.training import Evaluation, ModelShape


def build_marian(shape: ModelShape, vocab_size: int, pad_id: int, eos_id: int, seed: int) -> MarianMTModel:
    """A fresh Marian model with tied embeddings (shared source/target vocabulary and output layer), its
    weights initialised from ``seed`` (:func:`~pipeline.models.seeding.built_with_seed`)."""
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
    return built_with_seed(seed, lambda: MarianMTModel(config))


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
