"""The speed table's parts: the long input, and one row of times per (context, model)."""

from __future__ import annotations

import datasets
import pytest
import torch

from pipeline.attention import ENTMAX
from pipeline.evaluation import speed
from pipeline.evaluation.speed import long_sequence, model_speed, speed_table
from pipeline.models.language_model import build_language_model
from pipeline.params.training import ModelShape

SHAPE = ModelShape(d_model=16, encoder_layers=1, decoder_layers=2, heads=2, ffn_dim=32, max_positions=64)


def blocks(count: int, length: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {"input_ids": [[3 + (i * length + t) % 40 for t in range(length)] for i in range(count)]}
    )


def test_long_sequence_lays_blocks_end_to_end() -> None:
    test = blocks(3, 10)
    ids = long_sequence(test, 25)
    assert ids.shape == (1, 25)
    assert ids[0].tolist() == (test[0]["input_ids"] + test[1]["input_ids"] + test[2]["input_ids"])[:25]
    with pytest.raises(ValueError, match="fewer than the 31 asked for"):
        long_sequence(test, 31)


@pytest.mark.parametrize("attention", ["sdpa", ENTMAX])
def test_model_speed_times_every_pass_and_leaves_no_gradients(attention: str) -> None:
    model = build_language_model("lm", SHAPE, 50, pad_id=0, eos_id=1, seed=0)
    model.config._attn_implementation = attention
    times = model_speed(model, torch.randint(3, 50, (1, 32)), repeats=2, backward=True)
    assert set(times) == {
        "forward_seconds",
        "attention_seconds",
        "attention_pass_seconds",
        "forward_backward_seconds",
    }
    assert times["attention_seconds"] <= times["attention_pass_seconds"]  # a part of the same passes
    assert times["forward_seconds"] > 0 and times["forward_backward_seconds"] > 0
    assert times["attention_seconds"] >= 0
    assert all(p.grad is None for p in model.parameters())
    assert "forward_backward_seconds" not in model_speed(
        model, torch.randint(3, 50, (1, 8)), repeats=1, backward=False
    )


def test_speed_table_has_a_row_per_context_and_model() -> None:
    models = {name: build_language_model("lm", SHAPE, 50, pad_id=0, eos_id=1, seed=0) for name in ("a", "b")}
    rows = speed_table(models, blocks(4, 16), [16, 48], repeats=1, backward=False)
    assert [(row["context"], row["model"]) for row in rows] == [(16, "a"), (16, "b"), (48, "a"), (48, "b")]


def test_a_model_out_of_memory_gets_a_row_saying_so_and_the_others_go_on(monkeypatch) -> None:
    models = {name: build_language_model("lm", SHAPE, 50, pad_id=0, eos_id=1, seed=0) for name in ("a", "b")}
    original = model_speed
    seen = []

    def dense_at_48(model, ids, **kwargs):  # "b" holds 16 tokens, not 48
        seen.append(ids.shape[1])
        if model is models["b"] and ids.shape[1] >= 48:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")
        return original(model, ids, **kwargs)

    monkeypatch.setattr(speed, "model_speed", dense_at_48)
    rows = speed_table(models, blocks(8, 16), [16, 48, 64], repeats=1, backward=False)
    status = {(row["context"], row["model"]): row.get("status") for row in rows}
    short = "out of memory"
    assert status == {
        (16, "a"): None,
        (16, "b"): None,
        (48, "a"): None,
        (48, "b"): short,
        (64, "a"): None,
        (64, "b"): short,
    }
    assert seen == [16, 16, 48, 48, 64]  # no attempt at 64 tokens for the model that could not hold 48
    assert all("forward_seconds" in row for row in rows if row.get("status") is None)

    def broken(model, ids, **kwargs):
        raise RuntimeError("not about memory")

    monkeypatch.setattr(speed, "model_speed", broken)
    with pytest.raises(RuntimeError, match="not about memory"):  # other errors are not swallowed
        speed_table(models, blocks(4, 16), [16], repeats=1, backward=False)


def test_out_of_memory_is_told_apart_from_other_errors() -> None:
    assert speed.out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert speed.out_of_memory(MemoryError())
    assert speed.out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"))
    assert not speed.out_of_memory(RuntimeError("Expected all tensors to be on the same device"))
