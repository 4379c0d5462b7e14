"""Speed inside the model at long context: the seconds of a forward, of the attention inside it, and of a
forward + backward, for several models of one set of weights measured side by side (tokens per second and
the attention's share follow from them and the context).

The input is one sequence of ``n`` tokens, the held-out blocks laid end to end. Every model runs one
warm-up pass, then ``repeats`` timed passes per measure; the median is reported, so one slow pass (the
allocator growing, another process) does not decide the figure. Models take turns at each length, so the
ratios between them compare passes run minutes apart at most.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from pipeline.attention.recording import synchronize, time_attention
from pipeline.timer import median_seconds, seconds_each


def long_sequence(dataset: Dataset, n: int) -> torch.Tensor:
    """(1, n) int64: the first ``n`` tokens of ``dataset``'s blocks laid end to end; ValueError when they
    hold fewer."""
    ids: list[int] = []
    for block in dataset["input_ids"]:
        ids += block
        if len(ids) >= n:
            return torch.tensor([ids[:n]], dtype=torch.long)
    raise ValueError(f"the blocks hold {len(ids)} tokens, fewer than the {n} asked for")


def model_speed(model: PreTrainedModel, ids: torch.Tensor, *, repeats: int, backward: bool) -> dict[str, Any]:
    """Seconds of a forward without gradients and (when ``backward``) of forward + backward of the model's
    own loss (labels = inputs), medians over ``repeats`` passes each; and the mean seconds inside the
    attention function per forward, with the mean seconds of those forwards: the attention is timed on
    passes of its own, so that its timer never slows the passes the speeds come from."""
    model.eval()
    ids = ids.to(next(model.parameters()).device)

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    forward_seconds = median_seconds(forward, repeats=repeats, warmup=1, synchronize=synchronize)
    with time_attention(model) as spent:
        # the attention's time accrues over the same passes
        passes = sum(seconds_each(forward, repeats=repeats, synchronize=synchronize))
    times = {
        "forward_seconds": forward_seconds,
        # per pass, on the passes the attention was timed in (its share is their ratio)
        "attention_seconds": spent[0] / repeats,
        "attention_pass_seconds": passes / repeats,
    }
    if backward:
        times["forward_backward_seconds"] = median_seconds(
            forward_backward, repeats=repeats, warmup=1, synchronize=synchronize
        )
        model.zero_grad(set_to_none=True)
    return {key: round(value, 6) for key, value in times.items()}


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
    """One row per (context, model): :func:`model_speed` of every model in ``models`` (name → model) on the
    first ``n`` test tokens, for every ``n`` in ``contexts``, the models moved to ``device`` first
    (:func:`inference_device` by default). A model that runs out of memory at some n (dense attention's
    n × n scores, at tens of thousands of tokens) gets the row ``{"status": "out of memory"}`` there and at
    every longer context, and the others go on."""
    device = inference_device() if device is None else device
    for model in models.values():
        model.to(device)
    rows, too_long = [], {}  # too_long: model → the shortest context it could not hold
    for n in contexts:
        ids = long_sequence(test, n)
        for name, model in tqdm(models.items(), desc=f"speed at n = {n}", unit="model", leave=False):
            row: dict[str, Any] = {"context": n, "model": name}
            if name in too_long and n >= too_long[name]:
                rows.append({**row, "status": "out of memory"})
                continue
            try:
                row.update(model_speed(model, ids, repeats=repeats, backward=backward))
            except (RuntimeError, MemoryError) as err:
                if not out_of_memory(err):
                    raise
                model.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                too_long[name] = n
                row["status"] = "out of memory"
            rows.append(row)
    return rows
