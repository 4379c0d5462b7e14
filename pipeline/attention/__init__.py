"""Attention implementations registered with Hugging Face ``transformers`` on import.

After ``import pipeline.attention`` any model that dispatches through ``AttentionInterface`` accepts
``attn_implementation="entmax"``.

- :mod:`~pipeline.attention.interface`: registration with both interfaces, module discovery, state attachers.
- :mod:`~pipeline.attention.entmax`: the α-entmax normalizer and attention function, learned α.
- :mod:`~pipeline.attention.loading`: strict checkpoint loading with the attention state.
- :mod:`~pipeline.attention.sparsity`: measured sparsity of a model's attention.
"""

from pipeline.attention.entmax import (
    DEFAULT_ALPHA,
    ENTMAX,
    LearnedAlpha,
    attach_learned_alpha,
    attention_alpha,
    config_alpha,
    entmax_attention_forward,
    entmax_normalize,
    register_entmax,
    set_entmax_alpha,
)
from pipeline.attention.interface import (
    attention_modules,
    boolean_attention_mask,
    mask_scores,
    register_attention,
    register_state_attacher,
)
from pipeline.attention.loading import load_model, model_skeleton
from pipeline.attention.sparsity import attention_sparsity, collect_marian_sparsity

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
    "model_skeleton",
    "register_attention",
    "register_entmax",
    "register_state_attacher",
    "set_entmax_alpha",
]
