"""Extraction from decoder-only (GPT-2, Llama with rotary positions and grouped keys) and encoder-only
(RoBERTa) models: what is stored is what the attention function computed with, so the stored q and k
reproduce the stored graph exactly."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from entmax import entmax15
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    RobertaConfig,
    RobertaForMaskedLM,
)

from pipeline.attention import ENTMAX
from pipeline.attention.recording import model_layout
from pipeline.graphs import GraphStore
from pipeline.graphs.extract import extract_graphs
from tests.tiny import word_tokenizer

VOCAB, LAYERS, HEADS, HIDDEN = 40, 2, 4, 32


def gpt2() -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_positions=64,
        initializer_range=0.5,
        bos_token_id=1,
        eos_token_id=1,
    )
    return GPT2LMHeadModel._from_config(config, attn_implementation=ENTMAX)


def llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,  # grouped: every key head serves two query heads
        max_position_embeddings=64,
        initializer_range=0.5,
        pad_token_id=0,
    )
    return LlamaForCausalLM._from_config(config, attn_implementation=ENTMAX)


def roberta() -> RobertaForMaskedLM:
    config = RobertaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=70,
        initializer_range=0.5,
        pad_token_id=0,
    )
    return RobertaForMaskedLM._from_config(config, attn_implementation=ENTMAX)


MODELS = {
    "gpt2": (gpt2, "decoder_self"),
    "llama": (llama, "decoder_self"),
    "roberta": (roberta, "encoder_self"),
}


def token_rows(seed: int, count: int) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    rows = [rng.integers(3, VOCAB, rng.integers(4, 40)).tolist() for _ in range(count)]
    return datasets.Dataset.from_dict({"input_ids": rows})


@pytest.fixture(scope="module", params=list(MODELS))
def extracted(request, tmp_path_factory: pytest.TempPathFactory):
    """(model, kind, dataset, store) for one architecture, q/k stored in float32, batches padded."""
    make, kind = MODELS[request.param]
    torch.manual_seed(0)
    model = make().eval()
    dataset = token_rows(seed=1, count=6)
    out = tmp_path_factory.mktemp(request.param) / "graphs"
    extract_graphs(
        model,
        word_tokenizer(VOCAB),
        dataset,
        out,
        fingerprint={},
        split="train",
        kinds=(kind,),
        batch_size=3,
        dtype="float32",
        seed=None,
    )
    return model, kind, dataset, GraphStore(out)


def recomputed(store: GraphStore, sentence: int, layer: int, head: int, kind: str) -> np.ndarray:
    """entmax15 of the stored q and k, masked to the kind's valid pairs: (n, m) probabilities."""
    record = store.get(sentence, layer, head, kind)
    scores = store.scaling * torch.from_numpy(record.q) @ torch.from_numpy(record.k).T
    scores = scores.masked_fill(~torch.from_numpy(record.valid_mask()), float("-inf"))
    return entmax15(scores, dim=-1).numpy()


def test_stored_qk_reproduce_the_stored_graph(extracted) -> None:
    model, kind, dataset, store = extracted
    assert store.manifest["attention_kinds"] == [kind] and len(store) == len(dataset)
    assert (store.layers, store.heads, store.head_dim) == (LAYERS, HEADS, HIDDEN // HEADS)
    sparsity = []
    for sentence in range(len(store)):
        side = store.sides_of(kind)[0]
        assert len(store.tokens(sentence, side)) == len(dataset[sentence]["input_ids"])
        for layer in range(LAYERS):
            for head in range(HEADS):
                record = store.get(sentence, layer, head, kind)
                probs = recomputed(store, sentence, layer, head, kind)
                np.testing.assert_array_equal(record.gold_mask(), probs > 0)
                np.testing.assert_allclose(record.gold_probs(), probs, atol=1e-5)
                sparsity.append(1 - record.gold_mask().sum() / record.valid_mask().sum())
    assert np.mean(sparsity) > 0.2  # visibly sparse, so the check is not vacuous
    assert store.causal(kind) == (model_layout(model) == "decoder_only")


def test_llama_keys_are_stored_after_rotary_embedding(tmp_path: Path) -> None:
    """The projections' outputs (what hooks on q_proj/k_proj would store) do not reproduce the graph."""
    torch.manual_seed(0)
    model = llama().eval()
    dataset = token_rows(seed=2, count=1)
    before_rope = {}
    attention = model.model.layers[0].self_attn
    hooks = [
        getattr(attention, f"{name}_proj").register_forward_hook(
            lambda _m, _i, out, name=name: before_rope.__setitem__(name, out.detach())
        )
        for name in ("q", "k")
    ]
    out = tmp_path / "graphs"
    extract_graphs(model, word_tokenizer(VOCAB), dataset, out, fingerprint={}, split="test", dtype="float32")
    for hook in hooks:
        hook.remove()
    store = GraphStore(out)
    record = store.get(0, 0, 0)
    n = record.n
    q = before_rope["q"].view(1, n, HEADS, -1)[0, :, 0].numpy()
    assert not np.allclose(q, record.q, atol=1e-3)  # position 0 is unrotated; the others are rotated
    np.testing.assert_allclose(q[0], record.q[0], atol=1e-5)


def test_a_kind_the_model_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match="decoder-only model has no encoder_self attention; allowed: decoder_self"
    ):
        extract_graphs(
            gpt2(),
            word_tokenizer(VOCAB),
            token_rows(0, 2),
            tmp_path / "g",
            fingerprint={},
            split="test",
            kinds=("encoder_self",),
        )
    assert not (tmp_path / "g").exists()
