"""Attention self-ensembles of an SSA model: one sample is one sampled pass, S samples average
probabilities, beam search agrees across replicas, the translation metrics run through it."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from transformers import MarianMTModel

from pipeline.attention.ssa import SSA, attach_ssa, sampling, ssa_heads
from pipeline.errors import UserError
from pipeline.metrics.translation import perplexity, translate
from pipeline.students.ensemble import ensemble_perplexity, ensemble_translate, self_ensemble
from pipeline.training.batches import padded_batches
from tests.tiny import tiny_marian, word_tokenizer

VOCAB = 40
LOCAL = {"mode": "local", "windows": 2, "sigma": [1.0, 3.0], "kinds": ["encoder_self", "decoder_self"]}


def student(attn_implementation: str = SSA) -> MarianMTModel:
    """A tiny SSA Marian whose generation config asks for beam search with two beams."""
    model = tiny_marian(
        vocab=VOCAB,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_heads=2,
        decoder_heads=2,
        attn_implementation=attn_implementation,
    )
    if attn_implementation == SSA:
        attach_ssa(model, LOCAL)
    model.generation_config.num_beams = 2
    model.generation_config.max_new_tokens = 8
    return model


def dataset() -> Dataset:
    """Five sentence pairs of 4–9 source and 3–7 target tokens (targets end with </s>)."""
    g = torch.Generator().manual_seed(0)
    rows = {"input_ids": [], "labels": [], "tgt": []}
    for source_length, target_length in [(4, 3), (9, 7), (6, 5), (5, 6), (8, 4)]:
        rows["input_ids"].append([*torch.randint(3, VOCAB, (source_length - 1,), generator=g).tolist(), 1])
        target = torch.randint(3, VOCAB, (target_length - 1,), generator=g).tolist()
        rows["labels"].append([*target, 1])
        rows["tgt"].append(" ".join(f"w{t}" for t in target))
    return Dataset.from_dict(rows)


def one_batch(data: Dataset) -> dict[str, torch.Tensor]:
    """The whole dataset as the single padded batch the metrics see with batch_size = len(data)."""
    ((tensors, _),) = padded_batches(data, len(data), 0)
    return tensors


def one_batch_references(data: Dataset) -> list[str]:
    """The reference texts of :func:`one_batch`, in its (length-sorted) order."""
    ((_, rows),) = padded_batches(data, len(data), 0)
    return rows["tgt"]


def test_one_sample_is_one_sampled_pass():
    model, data, tokenizer = student(), dataset(), word_tokenizer(VOCAB)
    inputs = one_batch(data)
    with torch.no_grad():
        with sampling(model, seed=3):
            single = torch.log_softmax(model(**inputs).logits, dim=-1)
        with self_ensemble(model, samples=1, seed=3) as ensemble:
            ensembled = ensemble(**inputs).logits
    torch.testing.assert_close(ensembled, single)
    with sampling(model, seed=3):
        expected_perplexity = perplexity(model, data, batch_size=2)
    with sampling(model, seed=3):
        expected_translations = translate(model, tokenizer, data, batch_size=2)
    assert ensemble_perplexity(model, data, batch_size=2, samples=1, seed=3) == expected_perplexity
    assert (
        ensemble_translate(model, tokenizer, data, batch_size=2, samples=1, seed=3) == expected_translations
    )


def test_several_samples_average_the_replicas_probabilities():
    model, data = student(), dataset()
    inputs = one_batch(data)
    rows = len(data)
    with torch.no_grad():
        with self_ensemble(model, samples=4, seed=3) as ensemble:
            ensembled = ensemble(**inputs).logits  # (N, t, V) log-probabilities
        with sampling(model, seed=3, replicas=4):  # the same four sub-models, without the averaging hook
            replicas = model(**{name: t.repeat(4, 1) for name, t in inputs.items()}).logits  # (4N, t, V)
        with sampling(model, seed=3):
            single = torch.log_softmax(model(**inputs).logits, dim=-1)
    per_replica = torch.log_softmax(replicas, dim=-1).unflatten(0, (4, rows))  # (4, N, t, V)
    assert not torch.allclose(per_replica[0], per_replica[1], atol=1e-3)  # different sub-models
    torch.testing.assert_close(ensembled, torch.logsumexp(per_replica, dim=0) - math.log(4))
    torch.testing.assert_close(ensembled.exp().sum(-1), torch.ones(ensembled.shape[:-1]))
    assert not torch.allclose(ensembled, single, atol=1e-3)
    heads = ssa_heads(model)
    assert all(h.generator is None and h.replicas == 1 for h in heads) and not model._forward_hooks


def test_beam_search_makes_the_same_choices_in_every_replica():
    model, data, tokenizer = student(), dataset(), word_tokenizer(VOCAB)
    inputs = one_batch(data)
    rows = len(data)
    with torch.no_grad(), self_ensemble(model, samples=3, seed=5):
        sequences = model.generate(
            input_ids=inputs["input_ids"].repeat(3, 1), attention_mask=inputs["attention_mask"].repeat(3, 1)
        )
    assert sequences.shape[0] == 3 * rows
    assert torch.equal(sequences[:rows], sequences[rows : 2 * rows])
    assert torch.equal(sequences[:rows], sequences[2 * rows :])
    hypotheses, references = ensemble_translate(model, tokenizer, data, batch_size=rows, samples=3, seed=5)
    assert hypotheses == tokenizer.batch_decode(sequences[:rows], skip_special_tokens=True)
    assert references == one_batch_references(data)
    assert ensemble_translate(model, tokenizer, data, batch_size=2, samples=3, seed=5) == ensemble_translate(
        model, tokenizer, data, batch_size=2, samples=3, seed=5
    )
    metrics = ensemble_perplexity(model, data, batch_size=2, samples=3, seed=5)
    assert math.isfinite(metrics["perplexity"]) and metrics["perplexity"] > 1


def test_bad_ensembles_fail_in_one_line():
    too_few = pytest.raises(UserError, match="self-ensemble samples must be an integer >= 1; got 0")
    with too_few, self_ensemble(student(), samples=0, seed=1):
        pass
    no_heads = pytest.raises(UserError, match="MarianMTModel has no SSA heads")
    with no_heads, self_ensemble(student("entmax"), samples=2, seed=1):
        pass
