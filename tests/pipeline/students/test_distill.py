"""Distillation from the teacher (``pipeline.students.distill``): the loss, and training with it."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset, DatasetDict

from pipeline.params.training import Distillation, Training
from pipeline.students.distill import distillation_loss_sum
from pipeline.training.trainer import train_model
from tests.tiny import tiny_marian, word_tokenizer

VOCAB = 24


def logits_and_labels(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    student = torch.randn(2, 5, VOCAB, generator=generator)
    teacher = torch.randn(2, 5, VOCAB, generator=generator)
    labels = torch.randint(3, VOCAB, (2, 5), generator=generator)
    labels[1, 3:] = -100  # padding
    return student, teacher, labels


def test_weight_zero_is_the_trainers_label_smoothed_cross_entropy():
    student, teacher, labels = logits_and_labels(0)
    keep = labels.ne(-100)
    log_p = torch.log_softmax(student[keep], -1)
    nll = -log_p.gather(1, labels[keep][:, None]).squeeze(1)
    smooth = -log_p.mean(-1)
    expected = (0.9 * nll + 0.1 * smooth).sum()  # the Trainer's LabelSmoother with ε = 0.1, summed
    got = distillation_loss_sum(student, teacher, labels, Distillation(weight=0.0), smoothing=0.1)
    torch.testing.assert_close(got, expected)


def test_weight_one_is_the_tempered_kl_and_vanishes_when_the_student_is_the_teacher():
    student, teacher, labels = logits_and_labels(1)
    keep = labels.ne(-100)
    t = 3.0
    p = torch.softmax(teacher[keep] / t, -1)
    q = torch.softmax(student[keep] / t, -1)
    expected = t**2 * (p * (p.log() - q.log())).sum()
    settings = Distillation(weight=1.0, temperature=t)
    torch.testing.assert_close(distillation_loss_sum(student, teacher, labels, settings, 0.0), expected)
    assert float(distillation_loss_sum(teacher, teacher, labels, settings, 0.0)) == pytest.approx(
        0.0, abs=1e-5
    )
    # padding positions never count
    changed = student.clone()
    changed[1, 3:] += 100.0
    torch.testing.assert_close(distillation_loss_sum(changed, teacher, labels, settings, 0.0), expected)


def tiny_corpus(rows: int = 24) -> DatasetDict:
    generator = torch.Generator().manual_seed(0)

    def split(n: int) -> Dataset:
        source = torch.randint(3, VOCAB, (n, 6), generator=generator).tolist()
        return Dataset.from_dict(
            {"input_ids": [[*s, 1] for s in source], "labels": [[*s[::-1], 1] for s in source]}
        )

    return DatasetDict(train=split(rows), valid=split(8))


def mean_kl(student, teacher, data: Dataset) -> float:
    """Mean KL(teacher ‖ student) per target token over ``data`` (one batch, teacher forcing)."""
    labels = torch.tensor(data["labels"])
    inputs = {"input_ids": torch.tensor(data["input_ids"]), "labels": labels}
    with torch.no_grad():
        s, t = student(**inputs).logits, teacher(**inputs).logits
    settings = Distillation(weight=1.0, temperature=1.0)
    return float(distillation_loss_sum(s, t, labels, settings, 0.0)) / labels.numel()


def test_distilling_moves_the_student_towards_the_teacher(tmp_path):
    shape = dict(
        vocab=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_heads=2, decoder_heads=2
    )
    teacher = tiny_marian(**shape, init_std=0.3, seed=1)
    student = tiny_marian(**shape, init_std=0.3, seed=2).train()
    data = tiny_corpus()
    before = mean_kl(student, teacher, data["valid"])
    settings = Training(
        max_steps=12, batch_size=8, lr=3e-3, warmup_steps=0, schedule="constant_with_warmup",
        label_smoothing=0.0, eval_steps=6, save_steps=6, logging_steps=3,
    )  # fmt: skip
    trained = train_model(
        student,
        word_tokenizer(VOCAB),
        data,
        tmp_path / "run",
        settings,
        "fingerprint",
        teacher=teacher,
        distillation=Distillation(weight=1.0, temperature=1.0),
    )
    after = mean_kl(trained.eval(), teacher, data["valid"])
    assert math.isfinite(after) and after < 0.7 * before
    assert all(not p.requires_grad for p in teacher.parameters())  # the teacher stays frozen
