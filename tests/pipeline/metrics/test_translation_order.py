"""Hypotheses line for line with the split: the batches run sorted by length, but ``translate_in_order``
puts every translation back at its sentence's index, as the saved evidence files need."""

from __future__ import annotations

import torch
from datasets import Dataset

from pipeline.metrics.translation import translate, translate_in_order
from tests.tiny import tiny_marian, word_tokenizer

VOCAB = 30


def sentences() -> Dataset:
    """Seven pairs whose sources grow and shrink in length, so the sorted batches reorder them."""
    g = torch.Generator().manual_seed(0)
    rows = {"input_ids": [], "labels": [], "tgt": []}
    for length in (9, 3, 7, 2, 8, 4, 6):
        source = [*torch.randint(3, VOCAB, (length,), generator=g).tolist(), 1]
        rows["input_ids"].append(source)
        rows["labels"].append([5, 1])
        rows["tgt"].append(f"reference {len(rows['tgt'])}")
    return Dataset.from_dict(rows)


def test_translations_come_back_in_the_splits_order():
    model = tiny_marian(
        vocab=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_heads=2, decoder_heads=2
    )
    model.generation_config.num_beams, model.generation_config.max_new_tokens = 1, 6
    data, tokenizer = sentences(), word_tokenizer(VOCAB)
    hypotheses, references = translate_in_order(model, tokenizer, data, batch_size=3)
    assert references == data["tgt"]
    sorted_hypotheses, sorted_references = translate(model, tokenizer, data, batch_size=3)
    assert sorted_references != references  # the batches did reorder the sentences
    by_reference = dict(zip(sorted_references, sorted_hypotheses, strict=True))
    assert hypotheses == [by_reference[reference] for reference in references]
    # each sentence alone gives the translation found for it
    for at in (0, 3):
        alone, _ = translate(model, tokenizer, data.select([at]), batch_size=1)
        assert alone == [hypotheses[at]]
