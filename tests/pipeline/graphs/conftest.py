"""Shared fixtures: synthetic attention graphs, a tiny entmax Marian teacher and a micro graph store."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
from transformers import MarianMTModel, PreTrainedTokenizerFast

from pipeline.attention import load_model
from pipeline.checkpoint import save_checkpoint
from pipeline.graphs.extract import extract_graphs, teacher_fingerprint
from pipeline.graphs.store import AttentionGraph
from tests.tiny import tiny_marian, word_tokenizer

VOCAB = 40
LAYERS, HEADS, D_MODEL = 2, 2, 16


def _random_graph(
    rng: np.random.Generator, n: int, m: int, *, causal: bool, layers: int, heads: int, dim: int
) -> AttentionGraph:
    """Random q, k and sparse row-stochastic probabilities (every row has at least one edge)."""
    probs = rng.random((layers, heads, n, m)) * (rng.random((layers, heads, n, m)) < 0.4)
    probs[..., np.arange(n), np.minimum(np.arange(n), m - 1)] += 0.5
    if causal:
        probs = np.tril(probs)
    probs /= probs.sum(-1, keepdims=True)
    return AttentionGraph(
        q=rng.normal(size=(layers, heads, n, dim)).astype(np.float32),
        k=rng.normal(size=(layers, heads, m, dim)).astype(np.float32),
        probs=probs.astype(np.float32),
    )


@pytest.fixture(scope="session")
def random_graph():
    """``random_graph(rng, n, m, causal=, layers=, heads=, dim=)`` → a random :class:`AttentionGraph`."""
    return _random_graph


def token_rows(seed: int, count: int, low: int, high: int) -> dict[str, list[list[int]]]:
    """``count`` unpadded (input_ids, labels) rows of random lengths in [low, high], each ending in </s>."""
    rng = np.random.default_rng(seed)

    def row() -> list[int]:
        return [*rng.integers(3, VOCAB, rng.integers(low - 1, high)).tolist(), 1]

    return {"input_ids": [row() for _ in range(count)], "labels": [row() for _ in range(count)]}


@pytest.fixture(scope="session")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> tuple[MarianMTModel, PreTrainedTokenizerFast, Path]:
    """A tiny random entmax-1.5 Marian saved as a checkpoint folder (with its manifest) and loaded back."""
    folder = tmp_path_factory.mktemp("teacher")
    tokenizer = word_tokenizer(VOCAB)
    model = tiny_marian(
        vocab=VOCAB,
        d_model=D_MODEL,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_heads=HEADS,
        decoder_heads=HEADS,
    )
    save_checkpoint(folder, model, tokenizer, {"stage": "teacher"})
    return load_model(folder), tokenizer, folder


@pytest.fixture(scope="session")
def dataset() -> datasets.Dataset:
    return datasets.Dataset.from_dict(token_rows(seed=0, count=12, low=3, high=16))


@pytest.fixture(scope="session")
def micro_store(teacher, dataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of every kind over the sentences with at least 4 tokens, q/k in float32, 4 per shard."""
    model, tokenizer, folder = teacher
    out = tmp_path_factory.mktemp("store") / "graphs"
    extract_graphs(
        model,
        tokenizer,
        dataset,
        out,
        fingerprint=teacher_fingerprint(model, folder),
        split="train",
        kinds=("decoder_self", "encoder_self", "cross"),
        min_length=4,
        batch_size=4,
        dtype="float32",
        shard_sentences=4,
    )
    return out
