"""Length-sorted, padded evaluation batches of a tokenized split."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from datasets import Dataset


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def padded_batches(
    dataset: Dataset, batch_size: int, pad_id: int
) -> Iterator[tuple[dict[str, torch.Tensor], Dataset]]:
    """Yield ``({input_ids, attention_mask, labels}, rows)`` with labels padded by −100.

    Rows are sorted by source length first, because padding dominates evaluation time on CPU; ``rows`` is
    the slice of ``dataset`` each batch came from (for its text columns).
    """
    lengths = [len(ids) for ids in dataset["input_ids"]]
    order = sorted(range(len(dataset)), key=lengths.__getitem__)
    for start in range(0, len(order), batch_size):
        rows = dataset.select(order[start : start + batch_size])
        input_ids = _pad(rows["input_ids"], pad_id)
        tensors = {
            "input_ids": input_ids,
            "attention_mask": input_ids.ne(pad_id),
            "labels": _pad(rows["labels"], -100),
        }
        yield tensors, rows
