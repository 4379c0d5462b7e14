"""Attention implementations registered with Hugging Face ``transformers`` on import.

After ``import pipeline.attention`` any model that dispatches through ``AttentionInterface`` accepts
``attn_implementation="entmax"``.
"""

from pipeline.attention.entmax_attention import (
    DEFAULT_ALPHA,
    ENTMAX,
    LearnedAlpha,
    attach_learned_alpha,
    attention_alpha,
    attention_modules,
    boolean_attention_mask,
    config_alpha,
    entmax_attention_forward,
    entmax_normalize,
    load_model,
    mask_scores,
    register_attention,
    register_entmax,
)
from pipeline.attention.sparsity import attention_sparsity, collect_marian_sparsity, valid_pairs

register_entmax()

__all__ = [
    "DEFAULT_ALPHA",
    "ENTMAX",
    "LearnedAlpha",
    "attach_learned_alpha",
    "attention_alpha",
    "attention_modules",
    "attention_sparsity",
    "boolean_attention_mask",
    "collect_marian_sparsity",
    "config_alpha",
    "entmax_attention_forward",
    "entmax_normalize",
    "load_model",
    "mask_scores",
    "register_attention",
    "register_entmax",
    "valid_pairs",
]
