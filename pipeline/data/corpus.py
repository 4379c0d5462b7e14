"""Build the training corpus: read a source, split, train the tokenizer, tokenise, filter, save.

The result on disk is a ``datasets.DatasetDict`` (``train``/``valid``/``test``; columns ``id``, ``src``,
``tgt``, ``input_ids``, ``labels``) saved with ``save_to_disk``, plus the tokenizer in ``<out>/tokenizer``
and ``<out>/corpus.json`` naming the task (:mod:`pipeline.corpus_card`).
The folder is written under a temporary name and renamed, so it is either whole or absent.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import datasets
from transformers import PreTrainedTokenizerFast

from pipeline.atomic import atomic_path
from pipeline.corpus_card import write_corpus_card
from pipeline.data.filter import REASONS, LengthFilter
from pipeline.data.hf_source import read_hf
from pipeline.data.pair import Pair, SourceRead
from pipeline.data.split import (
    SPLITS,
    cap_examples,
    check_cap,
    check_fractions,
    leave_out_seen,
    split_pairs,
)
from pipeline.data.sword import read_sword
from pipeline.data.text_source import read_text_pair
from pipeline.data.tokenizer import check_vocab_size, train_tokenizer
from pipeline.errors import UserError

SOURCES: dict[str, Callable[..., SourceRead]] = {"sword": read_sword, "text": read_text_pair, "hf": read_hf}
# Options the builder passes itself rather than taking from ``source_options``.
_BUILDER_OPTIONS = frozenset({"src_lang", "tgt_lang"})
FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "src": datasets.Value("string"),
        "tgt": datasets.Value("string"),
        "input_ids": datasets.List(datasets.Value("int64")),
        "labels": datasets.List(datasets.Value("int64")),
    }
)
TOKENIZER_DIR = "tokenizer"


def _source_reader(
    source: str, options: Mapping[str, Any], **builder_options: Any
) -> Callable[[], SourceRead]:
    """Check ``source`` and its options against the reader's signature; return the reader, ready to call.

    ``builder_options`` (the languages) are passed on to readers that take them.
    """
    if source not in SOURCES:
        raise UserError(f"source = {source!r} is not one of {', '.join(SOURCES)}")
    reader = SOURCES[source]
    parameters = inspect.signature(reader).parameters
    allowed = set(parameters) - _BUILDER_OPTIONS
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise UserError(
            f"source_options {unknown} are not options of source {source!r}; allowed: {sorted(allowed)}"
        )
    required = [
        name
        for name, parameter in parameters.items()
        if parameter.default is inspect.Parameter.empty and name not in options
    ]
    if required:
        raise UserError(f"source {source!r} needs source_options {required}")
    passed_on = {key: value for key, value in builder_options.items() if key in parameters}
    return functools.partial(reader, **options, **passed_on)


def _length_stats(lengths: list[int]) -> dict[str, float | int]:
    return {"mean": round(sum(lengths) / len(lengths), 2) if lengths else 0.0, "max": max(lengths, default=0)}


def _encode_split(
    pairs: list[Pair], tokenizer: PreTrainedTokenizerFast, length_filter: LengthFilter
) -> tuple[dict[str, list], dict[str, int]]:
    """Tokenise one split and drop pairs the filter rejects; return its columns and drops by reason."""
    src_ids = tokenizer([pair.src for pair in pairs])["input_ids"] if pairs else []
    tgt_ids = tokenizer([pair.tgt for pair in pairs])["input_ids"] if pairs else []
    columns: dict[str, list] = {name: [] for name in FEATURES}
    dropped = dict.fromkeys(REASONS, 0)
    for pair, source, target in zip(pairs, src_ids, tgt_ids, strict=True):
        reason = length_filter.reason(len(source), len(target))
        if reason is not None:
            dropped[reason] += 1
            continue
        for name, value in (
            ("id", pair.id),
            ("src", pair.src),
            ("tgt", pair.tgt),
            ("input_ids", source),
            ("labels", target),
        ):
            columns[name].append(value)
    return columns, dropped


def _empty_split(
    name: str,
    pairs: list[Pair],
    split_dropped: dict[str, int],
    length_filter: LengthFilter,
    fraction: float,
) -> UserError:
    """Why split ``name`` ended up empty, naming the prepare key to change."""
    before = sum(split_dropped.values())
    seen = split_dropped.get("seen_source", 0)
    if before and seen == before:
        return UserError(
            f"prepare.{name}_fraction = {fraction}: all {seen} {name} pairs have a source sentence that is "
            "also in training, and are left out; allowed: a fraction that puts unseen sentences there, or "
            "prepare.held_out_unseen: false"
        )
    if before:
        f = length_filter
        ratio = "null" if f.max_length_ratio is None else f.max_length_ratio
        reasons = ", ".join(f"{reason} {count}" for reason, count in split_dropped.items())
        return UserError(
            f"prepare.min_length = {f.min_length}, max_length = {f.max_length}, max_length_ratio = {ratio}: "
            f"the length filter dropped all {before} {name} pairs ({reasons})"
        )
    if any(pair.split is not None for pair in pairs):
        return UserError(
            f"prepare.hf.use_dataset_splits = true: the dataset gives no {name} pairs; "
            "allowed: false, to split by id hash"
        )
    return UserError(
        f"prepare.{name}_fraction = {fraction}: the {name} split of {len(pairs)} pairs is empty; "
        "allowed: a fraction that puts at least one pair there"
    )


def _fingerprint(corpus: datasets.DatasetDict) -> str:
    """sha256 over every split's ids and texts: equal corpora, equal fingerprints."""
    digest = hashlib.sha256()
    for name in SPLITS:
        for pair_id, src, tgt in zip(
            corpus[name]["id"], corpus[name]["src"], corpus[name]["tgt"], strict=True
        ):
            digest.update(f"{name}\t{pair_id}\t{src}\t{tgt}\n".encode())
    return digest.hexdigest()


def build_corpus(
    out_dir: str | os.PathLike,
    *,
    source: str = "sword",
    source_options: Mapping[str, Any] | None = None,
    src_lang: str = "en",
    tgt_lang: str = "es",
    valid_fraction: float = 0.02,
    test_fraction: float = 0.02,
    split_seed: int = 0,
    vocab_size: int = 8000,
    min_length: int = 1,
    max_length: int = 256,
    max_length_ratio: float | None = None,
    max_examples: int | None = None,
    held_out_unseen: bool = True,
) -> dict[str, Any]:
    """Build the corpus into ``out_dir`` and return its statistics (JSON-ready).

    ``source`` is "sword", "text" or "hf"; ``source_options`` are the keyword arguments of
    :func:`~pipeline.data.sword.read_sword`, :func:`~pipeline.data.text_source.read_text_pair` or
    :func:`~pipeline.data.hf_source.read_hf` (``src_lang``/``tgt_lang`` come from here). ``max_examples``
    caps the corpus, before splitting, at the pairs first in a seeded order of id hashes. Splits come from
    id hashes (``valid_fraction``, ``test_fraction``, ``split_seed``), except that a hub dataset's own splits
    are kept (its ``use_dataset_splits`` option). The tokenizer (``vocab_size``) is trained on the training
    split only; then every split is tokenised and pairs outside ``min_length``..``max_length`` tokens per
    side (``</s>`` included) or beyond ``max_length_ratio`` are dropped. With ``held_out_unseen``, valid and
    test pairs whose source sentence is also a training source are left out first
    (:func:`~pipeline.data.split.leave_out_seen`, counted as ``seen_source``).

    The statistics: ``read`` (counts from the source), ``dropped`` (pairs lost, by reason), ``splits``
    (examples and token-length mean/max per split), ``vocab_size`` and a ``fingerprint`` of the texts.
    Every argument is checked before any work; a bad one raises :class:`UserError`.
    """
    check_fractions(valid_fraction, test_fraction)
    length_filter = LengthFilter(min_length, max_length, max_length_ratio)
    check_cap(max_examples)
    check_vocab_size(vocab_size)
    read_source = _source_reader(source, source_options or {}, src_lang=src_lang, tgt_lang=tgt_lang)

    read = read_source()
    pairs = cap_examples(read.pairs, max_examples, split_seed)
    splits = split_pairs(
        pairs,
        valid_fraction=valid_fraction,
        test_fraction=test_fraction,
        seed=split_seed,
    )
    if not splits["train"]:
        raise UserError(
            f"source {source!r} gave no training pairs ({read.kept} pairs read, {len(pairs)} kept)"
        )
    seen = leave_out_seen(splits) if held_out_unseen else {}
    tokenizer = train_tokenizer(
        (text for pair in splits["train"] for text in (pair.src, pair.tgt)), vocab_size=vocab_size
    )

    dropped = {"missing": read.dropped_missing, "empty": read.dropped_empty, "cap": read.kept - len(pairs)}
    if held_out_unseen:
        dropped["seen_source"] = 0  # added split by split below
    dropped.update(dict.fromkeys(REASONS, 0))
    split_stats: dict[str, dict[str, Any]] = {}
    encoded: dict[str, datasets.Dataset] = {}
    for name in SPLITS:
        columns, split_dropped = _encode_split(splits[name], tokenizer, length_filter)
        if name in seen:
            split_dropped = {"seen_source": seen[name], **split_dropped}
        if not columns["id"]:
            fraction = test_fraction if name == "test" else valid_fraction
            raise _empty_split(name, pairs, split_dropped, length_filter, fraction)
        for reason, count in split_dropped.items():
            dropped[reason] += count
        encoded[name] = datasets.Dataset.from_dict(columns, features=FEATURES)
        split_stats[name] = {
            "examples": len(columns["id"]),
            "dropped": split_dropped,
            "src_tokens": _length_stats([len(ids) for ids in columns["input_ids"]]),
            "tgt_tokens": _length_stats([len(ids) for ids in columns["labels"]]),
        }
    corpus = datasets.DatasetDict(encoded)

    with atomic_path(out_dir, directory=True) as tmp:
        corpus.save_to_disk(os.fspath(tmp))
        tokenizer.save_pretrained(os.fspath(tmp / TOKENIZER_DIR))
        write_corpus_card(tmp, task="translation")
    return {
        "task": "translation",
        "source": source,
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "read": read.counts(),
        "dropped": dropped,
        "splits": split_stats,
        "vocab_size": len(tokenizer),
        "fingerprint": _fingerprint(corpus),
    }
