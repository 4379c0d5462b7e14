"""Build the language-modelling corpus: read long documents, split them, train the tokenizer, cut blocks,
save.

The result on disk is a ``datasets.DatasetDict`` (``train``/``valid``/``test``; columns ``id`` and
``input_ids``, every row exactly ``context`` tokens) saved with ``save_to_disk``, plus the tokenizer in
``<out>/tokenizer`` and ``<out>/corpus.json`` naming the task. The folder is written under a temporary name
and renamed, so it is either whole or absent.

A document's split comes from the source (a hub dataset's own splits) or from the hash of its unit (a
SWORD chapter id, the same in every translation); blocks are then cut per stream and split
(:mod:`pipeline.data.blocks`), so adding a book or a translation never moves a block across splits.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import datasets

from pipeline.atomic import atomic_path
from pipeline.corpus_card import write_corpus_card
from pipeline.data.blocks import Block, cut_blocks
from pipeline.data.corpus import TOKENIZER_DIR
from pipeline.data.documents import Document, read_hf_documents, read_sword_chapters
from pipeline.data.split import SPLITS, assign_split, cap_examples, check_cap, check_fractions
from pipeline.data.tokenizer import check_vocab_size, train_tokenizer
from pipeline.errors import UserError

LM_FEATURES = datasets.Features(
    {"id": datasets.Value("string"), "input_ids": datasets.List(datasets.Value("int64"))}
)
LM_TASKS = ("lm", "mlm")


def split_documents(
    documents: list[Document], *, valid_fraction: float, test_fraction: float, seed: int
) -> dict[str, list[Document]]:
    """Group ``documents`` by split: the source's own, else by the hash of the document's unit."""
    splits: dict[str, list[Document]] = {name: [] for name in SPLITS}
    for document in documents:
        split = document.split or assign_split(
            document.unit, valid_fraction=valid_fraction, test_fraction=test_fraction, seed=seed
        )
        splits[split].append(document)
    return splits


def _fingerprint(corpus: datasets.DatasetDict) -> str:
    """sha256 over every split's block ids and token ids: equal corpora, equal fingerprints."""
    digest = hashlib.sha256()
    for name in SPLITS:
        for block_id, ids in zip(corpus[name]["id"], corpus[name]["input_ids"], strict=True):
            digest.update(f"{name}\t{block_id}\t{' '.join(map(str, ids))}\n".encode())
    return digest.hexdigest()


def build_lm_corpus(
    out_dir: str | os.PathLike,
    *,
    task: str,
    source: str,
    source_options: dict[str, Any],
    context: int,
    valid_fraction: float = 0.02,
    test_fraction: float = 0.02,
    split_seed: int = 0,
    vocab_size: int = 8000,
    max_examples: int | None = None,
) -> dict[str, Any]:
    """Build the ``task`` ("lm" or "mlm") corpus of ``context``-token blocks into ``out_dir``; returns its
    statistics (JSON-ready).

    ``source`` "sword" reads :func:`~pipeline.data.documents.read_sword_chapters` (options ``sword_path``,
    ``modules``, ``books``), "hf" :func:`~pipeline.data.documents.read_hf_documents` (``name``, ``config``,
    ``text_column``, ``lines``). The tokenizer is trained on the training documents (with ``<mask>`` for
    mlm); ``max_examples`` caps every split at that many blocks, those first in a seeded order of block-id
    hashes. Every argument is checked before any work; a bad one raises :class:`UserError`.
    """
    if task not in LM_TASKS:
        raise UserError(f"task = {task!r}: allowed for a block corpus: {', '.join(LM_TASKS)}")
    check_fractions(valid_fraction, test_fraction)
    check_cap(max_examples)
    check_vocab_size(vocab_size)
    readers = {"sword": read_sword_chapters, "hf": read_hf_documents}
    if source not in readers:
        raise UserError(f"source = {source!r}: allowed for task {task!r}: {', '.join(readers)}")

    documents = readers[source](**source_options)
    splits = split_documents(
        documents, valid_fraction=valid_fraction, test_fraction=test_fraction, seed=split_seed
    )
    if not splits["train"]:
        raise UserError(f"source {source!r} gave no training documents ({len(documents)} read)")
    tokenizer = train_tokenizer(
        (document.text for document in splits["train"]), vocab_size=vocab_size, mask=task == "mlm"
    )

    encoded, stats = {}, {}
    for name in SPLITS:
        blocks, count = cut_blocks(splits[name], name, tokenizer, context)
        if not blocks:
            raise UserError(
                f"prepare.context = {context}: the {name} split ({count.documents} documents, "
                f"{count.dropped_tokens} tokens) holds no whole block; allowed: a smaller context, or a "
                "larger share of the documents for that split"
            )
        capped: list[Block] = cap_examples(blocks, max_examples, split_seed)
        encoded[name] = datasets.Dataset.from_dict(
            {"id": [b.id for b in capped], "input_ids": [b.input_ids for b in capped]}, features=LM_FEATURES
        )
        stats[name] = {
            "blocks": len(capped),
            "capped": count.blocks - len(capped),
            "documents": count.documents,
            "tokens": count.tokens,
            "dropped_tokens": count.dropped_tokens,
        }
    corpus = datasets.DatasetDict(encoded)

    with atomic_path(out_dir, directory=True) as tmp:
        corpus.save_to_disk(os.fspath(tmp))
        tokenizer.save_pretrained(os.fspath(tmp / TOKENIZER_DIR))
        write_corpus_card(tmp, task=task, context=context)
    return {
        "task": task,
        "source": source,
        "context": context,
        "documents": len(documents),
        "splits": stats,
        "vocab_size": len(tokenizer),
        "fingerprint": _fingerprint(corpus),
    }
