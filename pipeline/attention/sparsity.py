"""Attention sparsity over valid pairs.

    sparsity = 1 − |{(i, j) valid : p_ij > 0}| / |valid pairs|

A pair is valid when query i and key j are both real tokens and, for causal attention, j ≤ i (so a causal
sentence of length L has L(L+1)/2 valid pairs per head): :func:`attention_kernels.attended.valid_pairs`.
Counts are returned rather than ratios so that callers can sum them over batches before dividing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from attention_kernels.attended import valid_pairs

# Attention kinds of an encoder–decoder model and the output field holding their per-layer probabilities.
SEQ2SEQ_ATTENTIONS = {
    "encoder_self": "encoder_attentions",
    "decoder_self": "decoder_attentions",
    "cross": "cross_attentions",
}
_MODEL_INPUTS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels")


def attention_sparsity(probs: Tensor, query_mask: Tensor, key_mask: Tensor, causal: bool) -> tuple[int, int]:
    """(nonzero, valid) counts of one layer's probabilities ``probs`` (batch, heads, q_len, k_len).

    nonzero counts valid pairs with p > 0 over all heads; valid counts valid pairs times heads.
    """
    pairs = valid_pairs(query_mask, key_mask, causal=causal)[:, None]  # (b, 1, q, k)
    nonzero = int(((probs > 0) & pairs).sum())
    valid = int(pairs.sum()) * probs.shape[1]
    return nonzero, valid


def _target_mask(batch: Mapping[str, Tensor]) -> Tensor:
    # Right-padded targets: the decoder query at position t predicts labels[t], so it is padding exactly
    # where the label is ignored (-100).
    if "decoder_attention_mask" in batch:
        return batch["decoder_attention_mask"]
    if "labels" in batch:
        return batch["labels"] != -100
    return torch.ones_like(batch["decoder_input_ids"])


@torch.no_grad()
def collect_marian_sparsity(
    model: nn.Module, batches: Iterable[Mapping[str, Tensor]]
) -> dict[str, list[float]]:
    """Per-layer attention sparsity of an encoder–decoder model (Marian, BART, T5, ...) over ``batches``.

    Each batch holds input_ids and attention_mask, plus labels (padding = -100) or decoder_input_ids
    (with decoder_attention_mask when padded). The model runs in eval mode with output_attentions=True;
    counts are summed over all batches before dividing. Returns {"encoder_self": [...], "decoder_self":
    [...], "cross": [...]}, one sparsity per layer.
    """
    device = next(model.parameters()).device
    counts: dict[str, list[list[int]]] = {}
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            inputs = {name: batch[name].to(device) for name in _MODEL_INPUTS if name in batch}
            outputs = model(**inputs, output_attentions=True)
            source = inputs.get("attention_mask", torch.ones_like(inputs["input_ids"]))
            target = _target_mask(inputs)
            masks = {
                "encoder_self": (source, source, False),
                "decoder_self": (target, target, True),
                "cross": (target, source, False),
            }
            for kind, field in SEQ2SEQ_ATTENTIONS.items():
                layers = getattr(outputs, field)
                totals = counts.setdefault(kind, [[0, 0] for _ in layers])
                for total, probs in zip(totals, layers, strict=True):
                    nonzero, valid = attention_sparsity(probs, *masks[kind])
                    total[0] += nonzero
                    total[1] += valid
    finally:
        model.train(was_training)
    if not counts:
        raise ValueError("no batches to measure attention sparsity on")
    return {kind: [1.0 - nonzero / valid for nonzero, valid in totals] for kind, totals in counts.items()}
