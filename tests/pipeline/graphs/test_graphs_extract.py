"""Extraction from a tiny entmax Marian: counts, tokens, and gold graphs equal to entmax of the stored q/k."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from entmax import entmax15
from transformers import MarianMTModel

from pipeline.attention_kinds import KINDS
from pipeline.fingerprint import file_sha256
from pipeline.graphs import GraphStore, epoch_batches, iter_batches
from pipeline.graphs.extract import extract_graphs, select_rows, teacher_fingerprint
from pipeline.predictors import DistancePredictor
from pipeline.predictors.scoring import Setting, score_settings
from pipeline.projection import held_out_loss, train_layer_projections

KINDS_ALL = ("decoder_self", "encoder_self", "cross")


def entmax_support(store: GraphStore, sentence: int, layer: int, head: int, kind: str) -> tuple:
    """(stored gold mask, entmax15 probabilities recomputed from the stored q and k)."""
    record = store.get(sentence, layer, head, kind)
    scores = store.scaling * torch.from_numpy(record.q) @ torch.from_numpy(record.k).T  # (n, m)
    scores = scores.masked_fill(~torch.from_numpy(record.valid_mask()), float("-inf"))
    return record.gold_mask(), entmax15(scores, dim=-1).numpy()


def test_counts_tokens_and_fingerprint(micro_store: Path, teacher, dataset) -> None:
    model, tokenizer, folder = teacher
    store = GraphStore(micro_store)
    rows = [i for i, r in enumerate(dataset) if len(r["labels"]) >= 4 and len(r["input_ids"]) >= 4]
    assert 0 < len(rows) < len(dataset)  # the length filter did drop something
    assert store.sentence_ids().tolist() == rows
    counts = store.manifest["counts"]
    assert counts["sentences"] == len(rows) and len(store.manifest["shards"]) == -(-len(rows) // 4)
    assert counts["tokens"] == {
        "source": sum(len(dataset[r]["input_ids"]) for r in rows),
        "target": sum(len(dataset[r]["labels"]) for r in rows),
    }
    for kind in KINDS_ALL:
        assert counts["edges"][kind] == int(store.edge_counts(kind).sum())
    assert (store.layers, store.heads, store.head_dim) == (2, 2, 8)
    assert store.scaling == pytest.approx(8**-0.5)
    assert store.split == store.manifest["split"] == "train"
    assert store.manifest["teacher"] == {
        "checkpoint": str(folder),
        "model_sha256": file_sha256(folder / "model.safetensors"),
        "attn_implementation": "entmax",
        "entmax_alpha": 1.5,
        "entmax_learn_alpha": False,
    }
    # decoder positions read the shifted labels: the start token, then every label but the last
    labels = dataset[rows[0]]["labels"]
    expected = tokenizer.convert_ids_to_tokens([model.config.decoder_start_token_id, *labels[:-1]])
    assert store.tokens(0, "target") == expected
    assert store.tokens(0, "source") == tokenizer.convert_ids_to_tokens(dataset[rows[0]]["input_ids"])


def test_gold_graphs_are_the_entmax_support_of_stored_qk(micro_store: Path) -> None:
    store = GraphStore(micro_store)
    sparsity = []
    for kind in KINDS_ALL:
        for sentence in range(len(store)):
            for layer in range(store.layers):
                for head in range(store.heads):
                    gold, recomputed = entmax_support(store, sentence, layer, head, kind)
                    np.testing.assert_array_equal(
                        gold, recomputed > 0, err_msg=f"{kind} {sentence} {layer} {head}"
                    )
                    record = store.get(sentence, layer, head, kind)
                    np.testing.assert_allclose(record.gold_probs(), recomputed, atol=1e-5)
                    sparsity.append(1 - gold.sum() / record.valid_mask().sum())
    assert np.mean(sparsity) > 0.2  # the teacher is visibly sparse, so the check is not vacuous


def test_half_precision_support_differs_only_at_the_boundary(teacher, dataset, tmp_path: Path) -> None:
    """With q/k stored in fp16, only pairs whose probability is near zero may change sides."""
    model, tokenizer, _ = teacher
    out = tmp_path / "graphs"
    extract_graphs(
        model,
        tokenizer,
        dataset,
        out,
        fingerprint={},
        split="valid",
        min_length=4,
        max_sentences=5,
        batch_size=5,
    )
    store = GraphStore(out)
    assert store.manifest["dtype"] == "float16" and len(store) == 5 and store.split == "valid"
    flips, edges = 0, 0
    for sentence in range(len(store)):
        for layer in range(store.layers):
            for head in range(store.heads):
                gold, recomputed = entmax_support(store, sentence, layer, head, "decoder_self")
                flipped = gold != (recomputed > 0)
                gold_probs = store.get(sentence, layer, head).gold_probs()
                assert (np.maximum(recomputed, gold_probs)[flipped] < 5e-3).all()
                flips, edges = flips + flipped.sum(), edges + gold.sum()
    assert flips <= 0.02 * edges


def test_padding_is_stripped(teacher, dataset, tmp_path: Path) -> None:
    """A sentence batched with longer ones is stored exactly as when it runs alone."""
    model, tokenizer, _ = teacher
    stores = {}
    for batch_size in (1, 6):
        out = tmp_path / f"batch{batch_size}"
        extract_graphs(
            model,
            tokenizer,
            dataset,
            out,
            fingerprint={},
            split="test",
            kinds=KINDS_ALL,
            batch_size=batch_size,
            dtype="float32",
            max_sentences=6,
            seed=None,
        )
        stores[batch_size] = GraphStore(out)
    alone, batched = stores[1], stores[6]
    assert alone.sentence_ids().tolist() == list(range(6))
    for kind in KINDS_ALL:
        for sentence in range(6):
            for layer in range(2):
                for head in range(2):
                    a, b = alone.get(sentence, layer, head, kind), batched.get(sentence, layer, head, kind)
                    assert (a.n, a.m) == (b.n, b.m)
                    np.testing.assert_allclose(a.q, b.q, atol=1e-5)
                    np.testing.assert_allclose(a.k, b.k, atol=1e-5)
                    np.testing.assert_allclose(a.gold_probs(), b.gold_probs(), atol=1e-5)


def test_select_rows(dataset) -> None:
    kinds = [KINDS["decoder_self"]]
    long_enough = [i for i, r in enumerate(dataset) if len(r["labels"]) >= 6]
    assert (
        select_rows(dataset, kinds, layout="encoder_decoder", min_length=6, max_sentences=None, seed=0)
        == long_enough
    )
    assert (
        select_rows(dataset, kinds, layout="encoder_decoder", min_length=6, max_sentences=3, seed=None)
        == long_enough[:3]
    )
    sampled = select_rows(dataset, kinds, layout="encoder_decoder", min_length=6, max_sentences=3, seed=1)
    assert len(sampled) == 3 and set(sampled) <= set(long_enough) and sampled == sorted(sampled)
    assert sampled == select_rows(
        dataset, kinds, layout="encoder_decoder", min_length=6, max_sentences=3, seed=1
    )


def test_rejects_teachers_without_probabilities(teacher, dataset, tmp_path: Path) -> None:
    model, tokenizer, _ = teacher
    sdpa = MarianMTModel._from_config(copy.deepcopy(model.config), attn_implementation="sdpa")
    with pytest.raises(ValueError, match="cannot be recorded"):
        extract_graphs(sdpa, tokenizer, dataset, tmp_path / "graphs", fingerprint={}, split="train")
    with pytest.raises(ValueError, match="no dataset row"):
        extract_graphs(
            model, tokenizer, dataset, tmp_path / "graphs", fingerprint={}, split="train", min_length=100
        )
    with pytest.raises(ValueError, match="split must be one of"):
        extract_graphs(model, tokenizer, dataset, tmp_path / "graphs", fingerprint={}, split="dev")
    assert list(tmp_path.iterdir()) == []
    assert teacher_fingerprint(model, tmp_path)["model_sha256"] is None


def test_store_feeds_projection_training(micro_store: Path) -> None:
    """A train/validation split is two index lists; batches go straight into the projection trainer."""
    store = GraphStore(micro_store)
    order = np.random.default_rng(0).permutation(len(store))
    train, valid = order[:-3], order[-3:]
    module, losses = train_layer_projections(
        epoch_batches(store, kind="decoder_self", layer=1, indices=train),
        n_heads=store.heads,
        head_dim=store.head_dim,
        causal=store.causal("decoder_self"),
        epochs=2,
        batch_size=4,
        progress=False,
    )
    assert len(losses) == 2 * -(-len(train) // 4) and np.isfinite(losses).all()
    held_out = iter_batches(store, kind="decoder_self", layer=1, indices=valid, batch_size=2)
    assert np.isfinite(held_out_loss(module, held_out, causal=True))
    [distance] = score_settings(
        store, "decoder_self", 1, [Setting(DistancePredictor())], valid, projections=module, batch_size=2
    )
    assert (distance.counts["recall"] == len(valid)).all()  # every held-out sentence scored in every head
