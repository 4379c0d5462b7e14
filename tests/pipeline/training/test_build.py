"""A model trained from scratch starts from weights its seed fixes (the Trainer seeds only what follows)."""

from __future__ import annotations

import pytest
import torch

from pipeline.models.language_model import build_language_model
from pipeline.models.marian import build_marian
from pipeline.params.training import ModelShape
from pipeline.training.trainer import batching
from tests.tiny import word_tokenizer

SHAPE = ModelShape(d_model=16, encoder_layers=1, decoder_layers=1, heads=2, ffn_dim=32, max_positions=32)
BUILDERS = {
    "translation": lambda seed: build_marian(SHAPE, 50, 0, 1, seed),
    "lm": lambda seed: build_language_model("lm", SHAPE, 50, pad_id=0, eos_id=1, seed=seed),
    "mlm": lambda seed: build_language_model("mlm", SHAPE, 50, pad_id=0, eos_id=1, seed=seed),
}


def weights(task: str, seed: int, *, before: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(before)  # whatever the global generator held before must not matter
    return BUILDERS[task](seed).state_dict()


@pytest.mark.parametrize("task", list(BUILDERS))
def test_the_seed_alone_fixes_the_initial_weights(task: str):
    first, again, other = weights(task, 3, before=0), weights(task, 3, before=1), weights(task, 4, before=0)
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)


def test_language_models_have_the_shapes_asked_for():
    lm = build_language_model("lm", SHAPE, 50, pad_id=0, eos_id=1, seed=0)
    mlm = build_language_model("mlm", SHAPE, 50, pad_id=0, eos_id=1, seed=0)
    assert type(lm).__name__ == "LlamaForCausalLM" and lm.config.num_hidden_layers == SHAPE.decoder_layers
    assert type(mlm).__name__ == "ModernBertForMaskedLM"
    assert mlm.config.num_hidden_layers == SHAPE.encoder_layers
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # tied
    ids = torch.randint(3, 50, (2, SHAPE.max_positions))  # a whole context fits
    assert mlm(input_ids=ids).logits.shape == lm(input_ids=ids).logits.shape == (2, SHAPE.max_positions, 50)
    with pytest.raises(ValueError, match="allowed: lm, mlm"):
        build_language_model("translation", SHAPE, 50, pad_id=0, eos_id=1, seed=0)


@pytest.mark.parametrize("fraction", [0.15, 0.4])
def test_mlm_training_masks_the_fraction_asked_for(fraction: float):
    """``train.mask_fraction`` of an mlm block's tokens are chosen for prediction (labels there only)."""
    tokenizer = word_tokenizer(50)
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    model = BUILDERS["mlm"](0)
    columns, collator = batching("mlm", tokenizer, model, fraction)
    assert columns == ["input_ids"]
    torch.manual_seed(0)
    ids = torch.randint(3, 50, (64, 64))
    labels = collator([{"input_ids": row} for row in ids.tolist()])["labels"]
    chosen = (labels != -100).float().mean().item()
    assert abs(chosen - fraction) < 0.02  # 4,096 tokens: a binomial share within ±0.02 of p
