"""Translation quality: beam-search BLEU on detokenized text, and token-level perplexity.

BLEU is sacreBLEU's corpus BLEU of detokenized hypotheses against the untouched reference text, reported
with its signature so numbers are comparable across papers. Perplexity is exp of the mean negative
log-likelihood per target token (no label smoothing), summed over the whole split rather than averaged
over batches, so batch composition cannot move it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from datasets import Dataset
from sacrebleu.metrics import BLEU
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.attention.interface import generation_cache
from pipeline.training.batches import padded_batches

ROW = "row"
"""The column that carries each sentence's index in the split through the length-sorted batches."""


@torch.no_grad()
def translate(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dataset: Dataset, batch_size: int
) -> tuple[list[str], list[str]]:
    """Beam-search translations of ``dataset`` (settings from the model's generation config), decoded with a
    key/value cache: a trained model's saved config says ``use_cache=False`` (the Trainer turns it off),
    which would recompute every prefix at every step; cached decoding gives the uncached result for every
    attention here (tested per attention).

    Returns (hypotheses, references), both detokenized, in the order of the length-sorted batches (see
    :func:`translate_in_order` for the split's own order).
    """
    hypotheses, references = [], []
    for decoded, rows in _translated_batches(model, tokenizer, dataset, batch_size):
        hypotheses += decoded
        references += rows["tgt"]
    return hypotheses, references


def translate_in_order(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dataset: Dataset, batch_size: int
) -> tuple[list[str], list[str]]:
    """:func:`translate`, with hypotheses and references in ``dataset``'s own order, line for line with any
    per-sentence measure of the same split."""
    numbered = dataset.add_column(ROW, list(range(len(dataset))))
    hypotheses: list[str | None] = [None] * len(dataset)
    references: list[str | None] = [None] * len(dataset)
    for decoded, rows in _translated_batches(model, tokenizer, numbered, batch_size):
        for at, hypothesis, reference in zip(rows[ROW], decoded, rows["tgt"], strict=True):
            hypotheses[at], references[at] = hypothesis, reference
    missing = [at for at, hypothesis in enumerate(hypotheses) if hypothesis is None]
    if missing:
        raise RuntimeError(f"sentences {missing[:5]} of {len(dataset)} were never translated")
    return hypotheses, references


@torch.no_grad()
def _translated_batches(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dataset: Dataset, batch_size: int
) -> Iterator[tuple[list[str], Dataset]]:
    """(detokenized hypotheses, the rows of ``dataset`` they translate) per length-sorted batch."""
    model.eval()
    batches = padded_batches(dataset, batch_size, model.config.pad_token_id)
    for batch, rows in tqdm(batches, total=-(-len(dataset) // batch_size), desc="translate", leave=False):
        cache = generation_cache(model)  # e.g. τ-indexer heads keep their keys' projections
        output = model.generate(
            input_ids=batch["input_ids"].to(model.device),
            attention_mask=batch["attention_mask"].to(model.device),
            use_cache=True,
            **({} if cache is None else {"cache": cache}),
        )
        yield tokenizer.batch_decode(output, skip_special_tokens=True), rows


def corpus_bleu(hypotheses: list[str], references: list[str]) -> dict[str, object]:
    """sacreBLEU corpus score with its signature."""
    metric = BLEU()
    score = metric.corpus_score(hypotheses, [references])
    return {"bleu": round(score.score, 2), "signature": str(metric.get_signature())}


@torch.no_grad()
def perplexity(model: PreTrainedModel, dataset: Dataset, batch_size: int) -> dict[str, float]:
    """Mean NLL per target token and its exponential over all of ``dataset``."""
    model.eval()
    total_nll, total_tokens = 0.0, 0
    batches = padded_batches(dataset, batch_size, model.config.pad_token_id)
    for batch, _ in tqdm(batches, total=-(-len(dataset) // batch_size), desc="perplexity", leave=False):
        batch = {name: tensor.to(model.device) for name, tensor in batch.items()}
        labels = batch["labels"]
        logits = model(**batch).logits
        nll = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"
        )
        total_nll += nll.item()
        total_tokens += int(labels.ne(-100).sum())
    loss = total_nll / max(total_tokens, 1)
    return {"loss": round(loss, 4), "perplexity": round(math.exp(loss), 4)}
