"""Teacher-forced sums per unit: they add up to the corpus perplexity (and mlm accuracy) each task's own
loss gives, a model against itself has KL 0 and full agreement, each sentence's sums land at its own index,
and KL is the textbook sum."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, RobertaConfig, RobertaForMaskedLM

from pipeline.metrics.language_model import token_loss
from pipeline.metrics.teacher_forced import Scoring, teacher_targets, unit_sums
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


def scored(model, teacher, data: Dataset, *, batch_size: int) -> dict[str, np.ndarray]:
    """``model``'s sums on translation pairs against ``teacher``'s targets."""
    scoring = Scoring("translation", batch_size)
    return unit_sums(model, data, scoring, teacher_targets(teacher, data, scoring))


def test_the_sums_give_the_corpus_perplexity():
    data, student = dataset(), model(1)
    sums = scored(student, model(0), data, batch_size=4)
    assert sums["tokens"].tolist() == [3, 7, 5, 6, 4, 2]
    expected = perplexity(student, data, batch_size=4)["perplexity"]
    # the two sum float32 losses in another order: a few units of float32 round-off apart, relatively
    assert math.exp(sums["nll"].sum() / sums["tokens"].sum()) == pytest.approx(expected, rel=1e-6)


def test_a_model_against_itself_has_no_divergence_and_full_agreement():
    data, teacher = dataset(), model(0)
    sums = scored(teacher, teacher, data, batch_size=4)
    np.testing.assert_allclose(sums["kl"], 0.0, atol=1e-5)
    assert sums["agree"].tolist() == sums["tokens"].tolist()


def test_each_sentence_keeps_its_index_whatever_the_batching():
    data, teacher, student = dataset(), model(0), model(1)
    whole = scored(student, teacher, data, batch_size=6)
    reversed_data = data.select(range(len(data) - 1, -1, -1))
    flipped = scored(student, teacher, reversed_data, batch_size=2)
    for name in ("nll", "tokens", "kl", "agree"):
        np.testing.assert_allclose(flipped[name][::-1], whole[name], rtol=1e-5, atol=1e-6)


def test_kl_is_the_sum_over_tokens_of_the_full_distributions():
    data, teacher, student = dataset(), model(0), model(1)
    sums = scored(student, teacher, data, batch_size=3)
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


def test_without_a_teacher_only_the_models_own_sums_are_kept():
    data, student = dataset(), model(1)
    sums = unit_sums(student, data, Scoring("translation", 4))
    assert set(sums) == {"nll", "tokens", "correct"}
    with_teacher = scored(student, model(0), data, batch_size=4)
    for name in ("nll", "tokens", "correct"):
        np.testing.assert_allclose(sums[name], with_teacher[name])


def test_targets_scored_another_way_are_refused():
    data, teacher = dataset(), model(0)
    with pytest.raises(ValueError, match="scored as"):
        unit_sums(
            teacher,
            data,
            Scoring("translation", 3),
            teacher_targets(teacher, data, Scoring("translation", 4)),
        )


CONTEXT = 12


def block_model(task: str, seed: int):
    torch.manual_seed(seed)
    shape = {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    if task == "lm":
        config = LlamaConfig(**shape, intermediate_size=32, max_position_embeddings=CONTEXT)
        return LlamaForCausalLM(config).eval()
    config = RobertaConfig(**shape, intermediate_size=32, max_position_embeddings=CONTEXT + 2)
    return RobertaForMaskedLM(config).eval()


def blocks() -> Dataset:
    ids = torch.randint(3, VOCAB, (7, CONTEXT), generator=torch.Generator().manual_seed(1))
    return Dataset.from_dict({"input_ids": ids.tolist()})


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_block_sums_give_the_tasks_own_loss_and_accuracy(task):
    """Blocks are the units: their sums add up to what token_loss reports on the same positions (mlm: the
    same seeded draw), and a block's token count is n − 1 (lm) or its drawn positions (mlm)."""
    data, student, teacher = blocks(), block_model(task, 1), block_model(task, 0)
    mask_id = 2
    scoring = Scoring(task, 3, mask_id=mask_id, seed=5)
    sums = unit_sums(student, data, scoring, teacher_targets(teacher, data, scoring))
    expected = token_loss(student, task, data, 3, mask_id=mask_id, seed=5)
    assert sums["tokens"].sum() == expected["tokens"]
    assert math.exp(sums["nll"].sum() / sums["tokens"].sum()) == pytest.approx(
        expected["perplexity"], rel=1e-4
    )
    if task == "lm":
        assert sums["tokens"].tolist() == [CONTEXT - 1] * len(data)
    else:
        assert sums["correct"].sum() / sums["tokens"].sum() == pytest.approx(expected["accuracy"], abs=1e-4)
        assert sums["tokens"].min() > 0 and sums["tokens"].max() < CONTEXT
    assert sums["kl"].min() > 0  # two different random models disagree on every block
    itself = unit_sums(teacher, data, scoring, teacher_targets(teacher, data, scoring))
    np.testing.assert_allclose(itself["kl"], 0.0, atol=1e-5)
    assert itself["agree"].tolist() == itself["tokens"].tolist()
