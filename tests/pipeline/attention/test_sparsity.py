"""Attention sparsity counted over valid (padding- and causality-aware) pairs."""

from __future__ import annotations

import torch
from transformers import MarianConfig, MarianMTModel

from attention_kernels.attended import valid_pairs
from pipeline.attention import ENTMAX, attention_sparsity, collect_marian_sparsity


def test_valid_pairs_respect_padding_and_causality():
    query_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    pairs = valid_pairs(query_mask, query_mask, causal=True)
    assert pairs[0].sum() == 6  # L(L+1)/2 for L = 3
    assert torch.equal(pairs[1].int(), torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 0]]))


def test_sparsity_counts_on_a_hand_made_example():
    # One sentence of 3 tokens whose last token is padding, two heads, causal.
    probs = torch.tensor(
        [
            [[1.0, 0.0, 0.0], [0.3, 0.7, 0.0], [0.2, 0.2, 0.6]],  # last row: a padding query
            [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]],
        ]
    )[None]
    mask = torch.tensor([[1, 1, 0]])
    # Valid pairs per head: (0,0), (1,0), (1,1) → 3, so 6 over two heads; nonzero: 3 + 2.
    assert attention_sparsity(probs, mask, mask, causal=True) == (5, 6)
    # Without causality (0,1) becomes valid too, and stays zero in both heads.
    assert attention_sparsity(probs, mask, mask, causal=False) == (5, 8)


def test_collect_sums_counts_over_batches_and_restores_mode():
    config = MarianConfig(
        vocab_size=30,
        d_model=16,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        init_std=0.5,
    )
    torch.manual_seed(0)
    model = MarianMTModel._from_config(config, attn_implementation=ENTMAX).train()
    generator = torch.Generator().manual_seed(0)
    batches = []
    for length in (5, 7):
        input_ids = torch.randint(2, 30, (2, length), generator=generator)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[1, length - 2 :] = 0
        labels = torch.randint(2, 30, (2, 4), generator=generator)
        labels[0, 3:] = -100
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})

    result = collect_marian_sparsity(model, batches)
    assert model.training
    assert {kind: len(values) for kind, values in result.items()} == {
        "encoder_self": 2,
        "decoder_self": 1,
        "cross": 1,
    }

    model.eval()
    totals = {"encoder_self": [0, 0], "decoder_self": [0, 0], "cross": [0, 0]}
    with torch.no_grad():
        for batch in batches:
            out = model(**batch, output_attentions=True)
            target = batch["labels"] != -100
            source = batch["attention_mask"]
            for kind, probs, masks in (
                ("encoder_self", out.encoder_attentions[1], (source, source, False)),
                ("decoder_self", out.decoder_attentions[0], (target, target, True)),
                ("cross", out.cross_attentions[0], (target, source, False)),
            ):
                nonzero, valid = attention_sparsity(probs, *masks)
                totals[kind][0] += nonzero
                totals[kind][1] += valid
    assert result["encoder_self"][1] == 1 - totals["encoder_self"][0] / totals["encoder_self"][1]
    assert result["decoder_self"][0] == 1 - totals["decoder_self"][0] / totals["decoder_self"][1]
    assert result["cross"][0] == 1 - totals["cross"][0] / totals["cross"][1]
    assert all(0.0 < value < 1.0 for values in result.values() for value in values)
