"""Teacher-forced sums per sentence: they add up to the corpus perplexity, a model against itself has KL 0
and full agreement, each sentence's sums land at its own index, and KL is the textbook sum."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from datasets import Dataset

from pipeline.metrics.teacher_forced import sentence_sums, teacher_targets
from pipeline.metrics.translation import perplexity
from tests.tiny import tiny_marian

VOCAB = 40


def model(seed: int):
    return tiny_marian(
        vocab=VOCAB,
        d_model=16,
        encoder_layers=1,
        decoder_layers=2,
        encoder_heads=2,
        decoder_heads=2,
        seed=seed,
    )


def dataset() -> Dataset:
    """Six pairs of 3–9 source and 2–7 target tokens (both end with </s> = 1)."""
    g = torch.Generator().manual_seed(0)
    rows = {"input_ids": [], "labels": []}
    for source_length, target_length in [(4, 3), (9, 7), (6, 5), (5, 6), (8, 4), (3, 2)]:
        rows["input_ids"].append([*torch.randint(3, VOCAB, (source_length - 1,), generator=g).tolist(), 1])
        rows["labels"].append([*torch.randint(3, VOCAB, (target_length - 1,), generator=g).tolist(), 1])
    return Dataset.from_dict(rows)


def test_the_sums_give_the_corpus_perplexity():
    data, student = dataset(), model(1)
    sums = sentence_sums(student, data, teacher_targets(model(0), data, batch_size=4))
    assert sums["tokens"].tolist() == [3, 7, 5, 6, 4, 2]
    expected = perplexity(student, data, batch_size=4)["perplexity"]
    assert math.exp(sums["nll"].sum() / sums["tokens"].sum()) == pytest.approx(expected, abs=1e-4)


def test_a_model_against_itself_has_no_divergence_and_full_agreement():
    data, teacher = dataset(), model(0)
    sums = sentence_sums(teacher, data, teacher_targets(teacher, data, batch_size=4))
    np.testing.assert_allclose(sums["kl"], 0.0, atol=1e-5)
    assert sums["agree"].tolist() == sums["tokens"].tolist()


def test_each_sentence_keeps_its_index_whatever_the_batching():
    data, teacher, student = dataset(), model(0), model(1)
    whole = sentence_sums(student, data, teacher_targets(teacher, data, batch_size=6))
    reversed_data = data.select(range(len(data) - 1, -1, -1))
    flipped = sentence_sums(student, reversed_data, teacher_targets(teacher, reversed_data, batch_size=2))
    for name in ("nll", "tokens", "kl", "agree"):
        np.testing.assert_allclose(flipped[name][::-1], whole[name], rtol=1e-5, atol=1e-6)


def test_kl_is_the_sum_over_tokens_of_the_full_distributions():
    data, teacher, student = dataset(), model(0), model(1)
    sums = sentence_sums(student, data, teacher_targets(teacher, data, batch_size=3))
    pair = data.select([1])  # seven target tokens, alone in its batch: no padding
    batch = {"input_ids": torch.tensor(pair["input_ids"]), "labels": torch.tensor(pair["labels"])}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"], dtype=torch.bool)
    with torch.no_grad():
        p = torch.softmax(teacher(**batch).logits.double(), -1)[0]  # (7, V)
        q = torch.softmax(student(**batch).logits.double(), -1)[0]
    expected = float((p * (p.log() - q.log())).sum())
    assert expected > 0.01  # two different random models do disagree
    assert sums["kl"][1] == pytest.approx(expected, rel=1e-4)
    assert sums["agree"][1] == float((p.argmax(-1) == q.argmax(-1)).sum())


def test_without_a_teacher_only_nll_and_tokens_are_summed():
    sums = sentence_sums(model(1), dataset())
    assert set(sums) == {"nll", "tokens"}
    assert sums["nll"].min() > 0
