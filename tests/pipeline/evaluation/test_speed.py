"""The speed table's parts: the long input, and one row of times per (context, model)."""

from __future__ import annotations

import datasets
import pytest
import torch

from pipeline.attention import ENTMAX
from pipeline.evaluation import speed
from pipeline.evaluation.speed import long_sequence, model_pass, speed_table
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
def test_model_pass_times_every_measure_and_leaves_no_gradients(attention: str) -> None:
    model = build_language_model("lm", SHAPE, 50, pad_id=0, eos_id=1, seed=0)
    model.config._attn_implementation = attention
    times = model_pass(model, torch.randint(3, 50, (1, 32)), backward=True, warmup=False)
    assert set(times) == {
        "forward_seconds",
        "attention_seconds",
        "attention_pass_seconds",
        "forward_backward_seconds",
    }
    assert 0 < times["attention_seconds"] < times["attention_pass_seconds"]  # a part of the same pass
    assert all(p.grad is None for p in model.parameters())
    warm = model_pass(model, torch.randint(3, 50, (1, 8)), backward=False, warmup=True)
    assert set(warm) == {"forward_seconds"}  # a warm-up times no attention and no backward


def test_speed_table_has_a_row_per_context_and_model_from_passes_taken_in_turn(monkeypatch) -> None:
    """A warm-up round, then every model once per round: the k-th passes of the models ran one after the
    other; a row's figures are the medians of its timed passes, which it keeps."""
    models = {name: build_language_model("lm", SHAPE, 50, pad_id=0, eos_id=1, seed=0) for name in ("a", "b")}
    names = {id(model): name for name, model in models.items()}
    order, clock = [], iter(range(1, 1000))

    def fake_pass(model, ids, *, backward, warmup):
        order.append((names[id(model)], ids.shape[1], warmup))
        tick = float(next(clock))
        return {"forward_seconds": tick, "forward_backward_seconds": 2 * tick}

    monkeypatch.setattr(speed, "model_pass", fake_pass)
    rows = speed_table(models, blocks(4, 16), [16, 48], repeats=3, backward=True)
    assert [(row["context"], row["model"]) for row in rows] == [(16, "a"), (16, "b"), (48, "a"), (48, "b")]
    assert order[:8] == [("a", 16, True), ("b", 16, True)] + [("a", 16, False), ("b", 16, False)] * 3
    assert rows[0]["pass_seconds"] == {
        "forward_seconds": [3.0, 5.0, 7.0],
        "forward_backward_seconds": [6.0, 10.0, 14.0],
    }
    assert rows[1]["forward_seconds"] == 6.0 and rows[1]["forward_backward_seconds"] == 12.0  # medians


def test_a_model_out_of_memory_gets_a_row_saying_so_and_the_others_go_on(monkeypatch) -> None:
    models = {name: build_language_model("lm", SHAPE, 50, pad_id=0, eos_id=1, seed=0) for name in ("a", "b")}
    original = model_pass
    seen = []

    def dense_at_48(model, ids, **kwargs):  # "b" holds 16 tokens, not 48
        seen.append(ids.shape[1])
        if model is models["b"] and ids.shape[1] >= 48:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")
        return original(model, ids, **kwargs)

    monkeypatch.setattr(speed, "model_pass", dense_at_48)
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
    # two rounds (warm-up, one timed) per length; no attempt at 64 tokens, nor a second at 48, for "b"
    assert seen == [16, 16, 16, 16, 48, 48, 48, 64, 64]
    assert all("forward_seconds" in row for row in rows if row.get("status") is None)

    def broken(model, ids, **kwargs):
        raise RuntimeError("not about memory")

    monkeypatch.setattr(speed, "model_pass", broken)
    with pytest.raises(RuntimeError, match="not about memory"):  # other errors are not swallowed
        speed_table(models, blocks(4, 16), [16], repeats=1, backward=False)


def test_out_of_memory_is_told_apart_from_other_errors() -> None:
    assert speed.out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert speed.out_of_memory(MemoryError())
    assert speed.out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"))
    assert not speed.out_of_memory(RuntimeError("Expected all tensors to be on the same device"))
