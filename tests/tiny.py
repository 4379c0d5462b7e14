"""Tiny models, tokenizers and corpora the tests build: a Marian teacher, a Llama with grouped key/value
heads, a word-level tokenizer, a dataset in WikiText's layout."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import torch
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, MarianConfig, MarianMTModel, PreTrainedTokenizerFast

from pipeline.attention import ENTMAX


def tiny_marian(
    *,
    vocab: int,
    d_model: int,
    encoder_layers: int,
    decoder_layers: int,
    encoder_heads: int,
    decoder_heads: int,
    alpha: float = 1.5,
    init_std: float = 0.5,
    attn_implementation: str = ENTMAX,
    seed: int = 0,
    **overrides,
) -> MarianMTModel:
    """A random α-entmax Marian in eval mode (pad 0, eos 1); a large ``init_std`` gives peaked scores, hence
    visibly sparse attention."""
    config = MarianConfig(
        vocab_size=vocab,
        d_model=d_model,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        encoder_attention_heads=encoder_heads,
        decoder_attention_heads=decoder_heads,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        init_std=init_std,
        **overrides,
    )
    config.entmax_alpha = alpha
    torch.manual_seed(seed)
    return MarianMTModel._from_config(config, attn_implementation=attn_implementation).eval()


def tiny_llama(
    *, vocab: int, attn_implementation: str = ENTMAX, seed: int = 0, **overrides
) -> LlamaForCausalLM:
    """A random Llama in eval mode: hidden size 32, 2 layers, 4 query heads sharing 2 key/value heads, large
    initial weights (peaked scores: visibly sparse α-entmax); ``overrides`` set other config fields."""
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    config = LlamaConfig(
        vocab_size=vocab,
        **sizes,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.5,
        **overrides,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()


def standard_marian(*, vocab: int, **overrides) -> MarianMTModel:
    """:func:`tiny_marian` of d_model 16, 2 encoder and 2 decoder layers, 2 encoder and 4 decoder heads;
    ``overrides`` (sizes included) win."""
    sizes = dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_heads=2, decoder_heads=4)
    return tiny_marian(vocab=vocab, **(sizes | overrides))


def dropout_free_marian(
    *, vocab: int, attn_implementation: str, alpha: float = 1.5, **sizes
) -> MarianMTModel:
    """:func:`standard_marian` without any dropout, so train mode differs from eval only by what the
    attention itself draws."""
    return standard_marian(
        vocab=vocab,
        alpha=alpha,
        attn_implementation=attn_implementation,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        **sizes,
    )


def teacher_and_student(
    *, vocab: int, attn_implementation: str, alpha: float = 1.5
) -> tuple[MarianMTModel, MarianMTModel]:
    """(a dense α-entmax :func:`dropout_free_marian` teacher, the same weights running
    ``attn_implementation``), no heads attached yet."""
    teacher = dropout_free_marian(vocab=vocab, attn_implementation=ENTMAX, alpha=alpha)
    student = dropout_free_marian(vocab=vocab, attn_implementation=attn_implementation, alpha=alpha)
    student.load_state_dict(teacher.state_dict())
    return teacher, student


def padded_batch(vocab: int) -> dict[str, torch.Tensor]:
    """Two source sentences and two targets of ``vocab`` ids, the second of each right-padded (pad 0)."""
    g = torch.Generator().manual_seed(2)
    input_ids = torch.randint(2, vocab, (2, 9), generator=g)
    input_ids[1, 6:] = 0
    labels = torch.randint(2, vocab, (2, 12), generator=g)
    labels[1, 8:] = 0
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != 0).long(),
        "decoder_input_ids": labels,
        "decoder_attention_mask": (labels != 0).long(),
    }


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over ``<pad>``, ``</s>``, ``<unk>`` and w3 … w{vocab − 1} (ids = their number)."""
    words = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="<unk>")),
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
    )


def wikitext_folder(folder: Path, articles: dict[str, dict[str, int]], seed: int = 0) -> Path:
    """Save a DatasetDict in WikiText-103's layout to ``folder``: per split, rows are lines, and every article
    (title → words) is a " = Title = " line, a section line and a body of words drawn from a small
    vocabulary with ``seed``."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(30)]

    def article(title: str, size: int) -> list[str]:
        body = " ".join(rng.choice(words, size))
        return [f" = {title} = \n", "\n", " = = Section = = \n", f" {body} \n", "\n"]

    splits = {
        split: datasets.Dataset.from_dict(
            {"text": [line for t, n in found.items() for line in article(t, n)]}
        )
        for split, found in articles.items()
    }
    datasets.DatasetDict(splits).save_to_disk(folder)
    return folder
