"""Held-out measures of the block tasks: per-token loss and perplexity, MLM accuracy, attention sparsity.

    lm:   loss = mean over blocks and positions t ≥ 1 of −log p(x_t | x_<t)
    mlm:  loss = mean over the chosen positions of −log p(x_t | the block with those positions masked)
    mqar: loss = mean over the answers (labels y_t ≠ −100) of −log p(y_t | x_<t), accuracy the share of
          answers whose most likely token is the value

The mlm positions are 15 % of each block's tokens, drawn from a generator seeded with ``seed`` alone and
all replaced by ``<mask>``, so every model evaluated with one seed is scored on the same positions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.attention.recording import attention_layers, capture_attention, layout_kinds, model_layout
from pipeline.attention.sparsity import attention_sparsity
from pipeline.attention_kinds import attention_kind
from pipeline.corpus_card import ACCURACY_TASKS, Task
from pipeline.training.trainer import MASKED_FRACTION


def block_batches(dataset: Dataset, batch_size: int, column: str = "input_ids") -> Iterator[torch.Tensor]:
    """(B, n) int64 token ids (or, with ``column`` "labels", an mqar corpus's labels) of consecutive blocks
    (all of one length: no padding)."""
    for start in range(0, len(dataset), batch_size):
        yield torch.tensor(dataset[start : start + batch_size][column], dtype=torch.long)


def labelled_batches(dataset: Dataset, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """((B, n) inputs, (B, n) labels in the causal-LM convention) of consecutive blocks: an mqar corpus's
    own labels, else the inputs themselves (lm)."""
    if "labels" not in dataset.column_names:
        yield from ((ids, ids) for ids in block_batches(dataset, batch_size))
        return
    yield from zip(
        block_batches(dataset, batch_size), block_batches(dataset, batch_size, "labels"), strict=True
    )


def masked_positions(ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(B, n) bool: the positions an mlm evaluation predicts, at least one per block."""
    chosen = torch.rand(ids.shape, generator=generator) < MASKED_FRACTION
    chosen[~chosen.any(dim=1), 0] = True
    return chosen


@torch.no_grad()
def token_loss(
    model: PreTrainedModel,
    task: Task,
    dataset: Dataset,
    batch_size: int,
    *,
    mask_id: int | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Mean per-token loss, perplexity and tokens scored over ``dataset`` (+ ``accuracy`` for mlm, whose
    chosen positions read ``mask_id``, and for mqar)."""
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    total_nll, total_tokens, correct = 0.0, 0, 0
    batches = labelled_batches(dataset, batch_size)
    for ids, labels in tqdm(batches, total=-(-len(dataset) // batch_size), desc="perplexity", leave=False):
        if task == "lm":
            logits = model(input_ids=ids.to(device)).logits[
                :, :-1
            ]  # (B, n − 1, V): position t predicts t + 1
            targets = ids[:, 1:]
        elif task == "mqar":
            logits = model(input_ids=ids.to(device)).logits[:, :-1]  # (B, n − 1, V)
            answered = labels[:, 1:] != -100  # (B, n − 1): the answers, P per example
            logits, targets = logits[answered.to(device)], labels[:, 1:][answered]
        else:
            chosen = masked_positions(ids, generator)
            logits = model(input_ids=ids.masked_fill(chosen, mask_id).to(device)).logits
            logits, targets = logits[chosen.to(device)], ids[chosen]
        targets = targets.reshape(-1).to(device)
        logits = logits.reshape(targets.numel(), -1).float()
        total_nll += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
        total_tokens += targets.numel()
        correct += int((logits.argmax(-1) == targets).sum())
    loss = total_nll / max(total_tokens, 1)
    measures = {"loss": round(loss, 4), "perplexity": round(math.exp(loss), 4), "tokens": total_tokens}
    if task in ACCURACY_TASKS:
        measures["accuracy"] = round(correct / max(total_tokens, 1), 4)
    return measures


@torch.no_grad()
def layer_sparsity(model: PreTrainedModel, dataset: Dataset, batch_size: int) -> dict[str, list[float]]:
    """Per-layer sparsity (1 − nonzero / valid pairs, causal for a decoder) of the model's attention kind
    over ``dataset``, recorded inside the attention function."""
    (kind_name,) = layout_kinds(model_layout(model))
    kind = attention_kind(kind_name)
    modules = {(kind_name, i): m for i, m in enumerate(attention_layers(model, kind))}
    counts = [[0, 0] for _ in modules]
    model.eval()
    device = next(model.parameters()).device
    with capture_attention(model, modules) as captured:
        for ids in block_batches(dataset, batch_size):
            model(input_ids=ids.to(device))
            real = torch.ones_like(ids, dtype=torch.bool, device=device)
            for (_, layer), (_, _, probs) in captured.items():
                nonzero, valid = attention_sparsity(probs, real, real, kind.causal)
                counts[layer][0] += nonzero
                counts[layer][1] += valid
            captured.clear()
    return {kind_name: [1.0 - nonzero / valid for nonzero, valid in counts]}


def evaluate_language_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    data: Any,
    *,
    batch_size: int,
    test_examples: int | None,
    sparsity_examples: int,
) -> dict[str, Any]:
    """Valid and test loss/perplexity (mlm: accuracy too; no test with ``test_examples`` 0) and, for a
    model whose attention function returns its probabilities (α-entmax), the per-layer attention sparsity on
    the valid blocks."""
    started = time.perf_counter()
    metrics: dict[str, Any] = {
        "valid": token_loss(model, task, data["valid"], batch_size, mask_id=tokenizer.mask_token_id)
    }
    test = data["test"]
    if test_examples is not None:
        test = test.select(range(min(test_examples, len(test))))
    if len(test):
        metrics["test"] = {
            "blocks": len(test),
            **token_loss(model, task, test, batch_size, mask_id=tokenizer.mask_token_id),
        }
    if model.config._attn_implementation == "entmax":
        sample = data["valid"].select(range(min(sparsity_examples, len(data["valid"]))))
        metrics["attention_sparsity"] = layer_sparsity(model, sample, batch_size)
    metrics["eval_seconds"] = round(time.perf_counter() - started, 1)
    return metrics
