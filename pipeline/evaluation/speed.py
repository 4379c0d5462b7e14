"""Speed inside the model at long context: the seconds of a forward, of the attention inside it, and of a
forward + backward, for several models of one set of weights measured side by side (tokens per second and
the attention's share follow from them and the context).

The input is one sequence of ``n`` tokens, the held-out blocks laid end to end. At each length the models
take turns pass by pass: a warm-up round (untimed), then ``repeats`` rounds in each of which every model runs
each measure once. So the k-th passes of two models ran seconds apart, a slower spell of the machine (another
process, frequency scaling) falls on every model alike, and the k-th passes pair up: the ratio of two models'
k-th passes is one paired measurement of their speed ratio. The median over the rounds is reported, so one
slow pass does not decide the figure, and each row keeps its passes for the spread of those ratios.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from pipeline.attention.recording import synchronize, time_attention
from pipeline.timer import timed


def long_sequence(dataset: Dataset, n: int) -> torch.Tensor:
    """(1, n) int64: the first ``n`` tokens of ``dataset``'s blocks laid end to end; ValueError when they
    hold fewer."""
    ids: list[int] = []
    for block in dataset["input_ids"]:
        ids += block
        if len(ids) >= n:
            return torch.tensor([ids[:n]], dtype=torch.long)
    raise ValueError(f"the blocks hold {len(ids)} tokens, fewer than the {n} asked for")


PASSES = ("forward_seconds", "forward_backward_seconds")
"""The measures whose every timed pass a row keeps (under ``pass_seconds``), for the paired ratios' spread."""


def model_pass(
    model: PreTrainedModel, ids: torch.Tensor, *, backward: bool, warmup: bool
) -> dict[str, float]:
    """Seconds of one pass of each measure: a forward without gradients (``forward_seconds``); unless
    ``warmup``, a second forward timed as a whole (``attention_pass_seconds``) and inside the attention
    function (``attention_seconds``), on a pass of its own so that its timer never slows the first; and
    when ``backward``, forward + backward of the model's own loss (labels = inputs,
    ``forward_backward_seconds``; the gradients are dropped after). ``ids`` on the model's device."""

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    times = {"forward_seconds": timed(forward, synchronize)[1]}
    if not warmup:
        with time_attention(model) as spent:
            times["attention_pass_seconds"] = timed(forward, synchronize)[1]
        times["attention_seconds"] = spent[0]
    if backward:
        times["forward_backward_seconds"] = timed(forward_backward, synchronize)[1]
        model.zero_grad(set_to_none=True)
    return times


def inference_device() -> torch.device:
    """Where models are timed: the process's GPU where there is one (its ``LOCAL_RANK`` under ``torchrun``),
    else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says memory ran out: on a GPU, or in the CPU allocator."""
    return isinstance(err, torch.OutOfMemoryError | MemoryError) or "can't allocate memory" in str(err)


def speed_table(
    models: Mapping[str, PreTrainedModel],
    test: Dataset,
    contexts: Sequence[int],
    *,
    repeats: int,
    backward: bool,
    device: torch.device | None = None,
) -> list[dict[str, Any]]:
    """One row per (context, model): the medians over ``repeats`` rounds of :func:`model_pass` (the models
    taking turns pass by pass, after a warm-up round; the module docstring) of every model in ``models``
    (name → model) on the first ``n`` test tokens, for every ``n`` in ``contexts``, with each timed pass of
    the :data:`PASSES` measures under ``pass_seconds``; the models are moved to ``device`` first
    (:func:`inference_device` by default). A model that runs out of memory at some n (dense attention's
    n × n scores, at tens of thousands of tokens) gets the row ``{"status": "out of memory"}`` there and at
    every longer context, and the others go on."""
    device = inference_device() if device is None else device
    for model in models.values():
        model.eval().to(device)
    rows, too_long = [], {}  # too_long: model → the shortest context it could not hold
    for n in contexts:
        ids = long_sequence(test, n).to(device)
        passes: dict[str, list[dict[str, float]]] = {name: [] for name in models if name not in too_long}
        rounds = tqdm(range(repeats + 1), desc=f"speed at n = {n}", unit="round", leave=False)
        for round_ in rounds:
            for name in [name for name in passes if name not in too_long]:
                try:
                    times = model_pass(models[name], ids, backward=backward, warmup=round_ == 0)
                except (RuntimeError, MemoryError) as err:
                    if not out_of_memory(err):
                        raise
                    models[name].zero_grad(set_to_none=True)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    too_long[name] = n
                    continue
                if round_ > 0:
                    passes[name].append(times)
        for name in models:
            row: dict[str, Any] = {"context": n, "model": name}
            if name in too_long and n >= too_long[name]:
                rows.append({**row, "status": "out of memory"})
                continue
            timed_passes = passes[name]
            for key in timed_passes[0]:
                row[key] = round(statistics.median(p[key] for p in timed_passes), 6)
            row["pass_seconds"] = {
                key: [round(p[key], 6) for p in timed_passes] for key in PASSES if key in row
            }
            rows.append(row)
    return rows
