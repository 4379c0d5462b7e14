"""The generation cache that keeps the τ-indexer's low-rank keys: same results as re-projecting every key
at every step, with one projection per new key; kept in step through beam search; never used stale."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset

import pipeline.attention.sparsefinder as sparsefinder
import pipeline.metrics.translation as translation
from benchmarks import indexer_cache as indexer_cache_bench
from pipeline.attention.indexer_cache import IndexedKeysLayer
from pipeline.attention.interface import generation_cache
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_sparsefinder
from pipeline.predictors.indexer import IndexerPredictor
from pipeline.training.batches import padded_batches
from tests.pipeline.attention.test_sparsefinder_attention import (
    HEAD_DIM,
    HEADS,
    LAYERS,
    VOCAB,
    batch,
    sparsefinder_model,
    spec,
    teacher,
)
from tests.pipeline.attention.test_sparsefinder_indexed import indexed_llama, tokens
from tests.tiny import word_tokenizer

RANK = 2


def indexer_marian(kind: str):
    """A Marian whose ``kind`` attention has τ-indexer heads with random rank-2 maps (margin 0.05)."""
    if kind == "decoder_self":
        return sparsefinder_model("indexer", {"rank": RANK, "margin": 0.05})[1]
    model = teacher(SPARSEFINDER)
    model.load_state_dict(teacher().state_dict())
    generator = torch.Generator().manual_seed(4)
    states = {
        layer: {name: torch.randn(HEADS, RANK, HEAD_DIM, generator=generator) for name in ("q_map", "k_map")}
        for layer in range(LAYERS)
    }
    shapes = {name: [HEADS, RANK, HEAD_DIM] for name in ("q_map", "k_map")}
    attach_sparsefinder(
        model, {**spec("indexer", {"rank": RANK, "margin": 0.05}, shapes=shapes), "kind": kind}, None, states
    )
    return model.eval()


@pytest.fixture
def projected_lengths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of keys of every τ-indexer key projection made while the test runs."""
    lengths = []
    project = IndexerPredictor.index_keys

    def counting(self, layer, k):
        lengths.append(k.shape[-2])
        return project(self, layer, k)

    monkeypatch.setattr(IndexerPredictor, "index_keys", counting)
    return lengths


def generated(model, cache, **options):
    """Sequences and per-step scores of ``generate`` with ``cache`` (None: generate's own)."""
    extra = {} if cache is None else {"cache": cache}
    out = model.generate(**options, **extra, output_scores=True, return_dict_in_generate=True)
    return out.sequences, out.scores


def assert_same_generation(first, second) -> None:
    assert torch.equal(first[0], second[0])
    for step_first, step_second in zip(first[1], second[1], strict=True):
        torch.testing.assert_close(step_first, step_second, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["decoder_self", "cross"])
@pytest.mark.parametrize("beams", [1, 3])
def test_marian_generation_with_cached_projections_equals_reprojecting(kind, beams):
    """Greedy and beam search (beams reorder the cache) over a right-padded batch."""
    model = indexer_marian(kind)
    inputs = batch()
    options = dict(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        max_new_tokens=10,
        num_beams=beams,
        do_sample=False,
    )
    assert_same_generation(
        generated(model, generation_cache(model), **options), generated(model, None, **options)
    )


def test_llama_generation_with_cached_projections_equals_reprojecting(projected_lengths):
    """The prompt runs on the indexed kernel with the cache's projections, later steps on the masked path;
    with the cache each step projects its one new key, without it every key again."""
    _, model = indexed_llama(margin=0.05)
    n = sparsefinder.INDEXED_MIN_KEYS + 3
    steps = 6
    options = dict(inputs=tokens(n, batch=1, seed=2), max_new_tokens=steps, do_sample=False)
    with_cache = generated(model, generation_cache(model), **options)
    assert projected_lengths == [n] * 2 + [1] * 2 * (steps - 1)  # two layers: the prompt, then one key a step
    projected_lengths.clear()
    assert_same_generation(with_cache, generated(model, None, **options))
    assert projected_lengths == [n + step for step in range(steps) for _ in range(2)]


def test_projections_follow_the_keys_through_reorder_selection_and_crop():
    model = indexer_marian("decoder_self")
    module = model.get_decoder().layers[1].self_attn
    head = module.sparsefinder
    layer = IndexedKeysLayer(head)
    g = torch.Generator().manual_seed(0)
    for new in (5, 1, 1):
        layer.update(*(torch.randn(3, HEADS, new, HEAD_DIM, generator=g) for _ in range(2)))

    def check() -> None:
        expected = head.predictor.index_keys(head.layer, layer.keys)  # (b, h, m, r), one head per key head
        torch.testing.assert_close(layer.key_index(), expected)

    check()
    layer.reorder_cache(torch.tensor([2, 0, 0]))
    check()
    layer.batch_select_indices(torch.tensor([1, 2]))
    check()
    layer.crop(-2)
    assert layer.keys.shape[-2] == 5
    check()
    layer.batch_repeat_interleave(2)
    assert layer.keys.shape[0] == 4
    check()


def test_a_head_uses_cached_projections_only_for_the_cache_layers_own_keys():
    model = indexer_marian("decoder_self")
    head = model.get_decoder().layers[0].self_attn.sparsefinder
    layer = IndexedKeysLayer(head)
    keys = torch.randn(2, HEADS, 4, HEAD_DIM)
    layer.update(keys, keys.clone())
    assert torch.equal(head.cached_key_index(layer.keys), layer.key_index())
    assert head.cached_key_index(layer.keys.clone()) is None  # equal values, another tensor
    del layer
    assert head.cached_key_index(keys) is None  # the layer is gone


def test_a_model_without_indexer_heads_gets_generates_own_cache():
    assert generation_cache(teacher()) is None
    assert generation_cache(sparsefinder_model("kmeans", {"buckets": 4})[1]) is None
    assert generation_cache(indexer_marian("encoder_self")) is None  # an encoder runs once


@pytest.mark.parametrize("decoder_kind", ["cross", "decoder_self"])
def test_translate_decodes_with_the_cache_even_when_a_trained_model_turned_it_off(decoder_kind, monkeypatch):
    """A trained model's config says use_cache=False; translate caches anyway (a cache handed to a
    decoding that re-reads every prefix would hold each key twice), with the uncached hypotheses."""
    model = indexer_marian(decoder_kind)
    model.config.use_cache = model.generation_config.use_cache = False
    tokenizer, data = word_tokenizer(VOCAB), translation_data()
    model.generation_config.update(num_beams=2, max_new_tokens=12)
    cached = translation.translate(model, tokenizer, data, batch_size=2)
    uncached = []
    for tensors, _ in padded_batches(data, 2, model.config.pad_token_id):
        output = model.generate(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"])
        uncached += tokenizer.batch_decode(output, skip_special_tokens=True)
    assert cached[0] == uncached


def translation_data() -> Dataset:
    """Three source sentences of 4, 9 and 6 tokens (targets unused by decoding)."""
    g = torch.Generator().manual_seed(0)
    rows = {"input_ids": [], "labels": [], "tgt": []}
    for length in (4, 9, 6):
        rows["input_ids"].append([*torch.randint(3, VOCAB, (length - 1,), generator=g).tolist(), 1])
        rows["labels"].append([3, 1])
        rows["tgt"].append("w3")
    return Dataset.from_dict(rows)


def test_translate_projects_cross_attention_keys_once_per_batch(projected_lengths, monkeypatch):
    model = indexer_marian("cross")
    tokenizer, data = word_tokenizer(VOCAB), translation_data()
    model.generation_config.update(num_beams=2, max_new_tokens=6)
    cached = translation.translate(model, tokenizer, data, batch_size=2)
    assert len(projected_lengths) == LAYERS * 2  # two batches: each layer's encoder keys once
    monkeypatch.setattr(translation, "generation_cache", lambda model: None)
    projected_lengths.clear()
    assert translation.translate(model, tokenizer, data, batch_size=2) == cached
    assert len(projected_lengths) > LAYERS * 2 * 2  # generate's own cache: every step again


def test_decoding_benchmark_writes_one_row_per_method(tmp_path, capsys):
    out = tmp_path / "decoding.json"
    indexer_cache_bench.main(
        ["--contexts", "40", "--ranks", "2", "--new", "2", "--repeats", "1", "--out", str(out)]
    )
    rows = json.loads(out.read_text())["rows"]
    assert [row["method"] for row in rows] == [
        "indexer r2 cached",
        "indexer r2 re-projected",
        "dense entmax",
        "softmax sdpa",
    ]
    assert all(row["context"] == 40 and row["tokens_per_second"] > 0 for row in rows)
    assert "indexer r2 cached" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--contexts", "0"], ["--ranks", "8,x"], ["--new", ""]])
def test_decoding_benchmark_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        indexer_cache_bench.main(argv)
    assert exit_info.value.code == 2
    assert "expected comma-separated integers >= 1" in capsys.readouterr().err
