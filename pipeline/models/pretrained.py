"""A model of a task loaded from a Hugging Face checkpoint (folder or hub id)."""

from __future__ import annotations

from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    PreTrainedModel,
)

from pipeline.checkpoint import load_config
from pipeline.corpus_card import Task

AUTO_CLASSES = {
    "translation": AutoModelForSeq2SeqLM,
    "lm": AutoModelForCausalLM,
    "mlm": AutoModelForMaskedLM,
    "mqar": AutoModelForCausalLM,
}


def load_pretrained(
    source: str, task: Task = "translation", attn_implementation: str | None = None, **config_overrides
) -> PreTrainedModel:
    """Load ``task``'s model (encoder–decoder, causal LM, masked LM) from a folder or hub id;
    ``config_overrides`` land on its config. No code shipped with the model runs
    (:func:`~pipeline.checkpoint.refuse_foreign_code`)."""
    config = load_config(source)
    for name, value in config_overrides.items():
        setattr(config, name, value)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return AUTO_CLASSES[task].from_pretrained(source, config=config, trust_remote_code=False, **kwargs)
