"""Build the MQAR corpus: train, valid and test examples of one :class:`~pipeline.data.mqar.MqarSpec`, each
split from its own seed, with a tokenizer whose ids are the task's tokens.

On disk, as for the block tasks: a ``datasets.DatasetDict`` (columns ``id``, ``input_ids`` and ``labels``,
every row exactly ``input_seq_len`` tokens) saved with ``save_to_disk``, the tokenizer in
``<out>/tokenizer``, ``<out>/corpus.json`` (task ``mqar``, context T) and ``<out>/mqar.json``, the spec
and the seeds the examples came from. Written under a temporary name and renamed: whole or absent.

Labels are stored in the causal-LM convention, the one a Hugging Face decoder's loss and the ``lm`` task
use: ``labels[t]`` is the token position t − 1 must predict. The generator's target sits at the query
position itself (the model reads the key again and must emit its value next), so the stored labels are
the generator's shifted one place right (:func:`causal_labels`); its last position is never a query, so
nothing falls off.

Token ids are the task's own, 0 … V − 1 (``token_offset`` 0); the tokenizer appends ``<pad>``, ``</s>``
and ``<unk>`` after them (V, V + 1, V + 2), which no example holds. Its tokens are the ids written out,
so ``tokenizer.decode`` shows an example as numbers and ``tokenizer("5 900 5")`` encodes one.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import datasets
import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from pipeline.atomic import atomic_path, write_json
from pipeline.corpus_card import write_corpus_card
from pipeline.data.corpus import TOKENIZER_DIR
from pipeline.data.mqar import IGNORE, MqarSpec, generate, split_seeds
from pipeline.data.mqar_card import MQAR_CARD, mqar_card
from pipeline.data.split import SPLITS
from pipeline.data.tokenizer import EOS, PAD, UNK

MQAR_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "input_ids": datasets.List(datasets.Value("int64")),
        "labels": datasets.List(datasets.Value("int64")),
    }
)


def causal_labels(labels: np.ndarray) -> np.ndarray:
    """(n, T) labels in the causal-LM convention: the generator's ``labels`` (target at the query position
    itself) shifted one place right, −100 at position 0."""
    if (labels[:, -1] != IGNORE).any():
        raise ValueError("an MQAR label at the last position has no next position to move to")
    shifted = np.full_like(labels, IGNORE)
    shifted[:, 1:] = labels[:, :-1]
    return shifted


def mqar_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of the ids 0 … ``vocab_size`` − 1 written as numbers, then ``<pad>``,
    ``</s>`` and ``<unk>``; no post-processor, so an encoded example is its ids alone."""
    vocab = {str(token): token for token in range(vocab_size)}
    vocab |= {PAD: vocab_size, EOS: vocab_size + 1, UNK: vocab_size + 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def _fingerprint(corpus: datasets.DatasetDict) -> str:
    """sha256 over every split's inputs and labels, row by row: equal corpora, equal fingerprints."""
    digest = hashlib.sha256()
    for name in SPLITS:
        digest.update(name.encode())
        for ids, labels in zip(corpus[name]["input_ids"], corpus[name]["labels"], strict=True):
            digest.update(np.asarray(ids, dtype=np.int64).tobytes())
            digest.update(np.asarray(labels, dtype=np.int64).tobytes())
    return digest.hexdigest()


def part_seeds(seed: int, count: int) -> list[int]:
    """Seeds of the ``count`` parts of a training mixture drawn from the train split's ``seed``: the first
    64-bit word of each of the first ``count`` children of ``np.random.SeedSequence(seed)``."""
    return [int(c.generate_state(1, np.uint64)[0]) for c in np.random.SeedSequence(seed).spawn(count)]


def _examples(name: str, parts: list[tuple[MqarSpec, int, int]]) -> datasets.Dataset:
    """The rows of ``parts`` ((spec, count, seed) each), part after part, ids ``name-index``."""
    inputs, labels = [], []
    for spec, count, seed in parts:
        part_inputs, part_labels = generate(spec, count, seed)  # (n, T) each
        inputs += part_inputs.tolist()
        labels += causal_labels(part_labels).tolist()
    rows = {"id": [f"{name}-{index}" for index in range(len(inputs))], "input_ids": inputs, "labels": labels}
    return datasets.Dataset.from_dict(rows, features=MQAR_FEATURES)


def build_mqar_corpus(
    out_dir: str | os.PathLike,
    *,
    spec: MqarSpec,
    counts: dict[str, int],
    seed: int,
    mixture: list[tuple[int, int, int]] | None = None,
) -> dict[str, Any]:
    """Generate ``counts[split]`` examples of ``spec`` per split (seeds from :func:`split_seeds` of
    ``seed``) into ``out_dir``; returns the corpus statistics (JSON-ready).

    ``mixture`` ((input_seq_len, num_kv_pairs, examples) per part) makes the train split a mixture of such
    examples instead (``counts["train"]`` unread), the task otherwise ``spec``'s, each part from its own
    seed (:func:`part_seeds`)."""
    seeds = split_seeds(seed)
    plans = {name: [(spec, counts[name], seeds[name])] for name in SPLITS}
    parts = None
    if mixture:
        shape = {"power_a": spec.power_a, "random_non_queries": spec.random_non_queries}
        part_specs = [MqarSpec(spec.vocab_size, length, pairs, **shape) for length, pairs, _ in mixture]
        counted = [examples for _, _, examples in mixture]
        counts = {**counts, "train": sum(counted)}
        plans["train"] = list(zip(part_specs, counted, part_seeds(seeds["train"], len(mixture)), strict=True))
        parts = [
            {"input_seq_len": s.input_seq_len, "num_kv_pairs": s.num_kv_pairs, "examples": n, "seed": p}
            for s, n, p in plans["train"]
        ]
    encoded, stats = {}, {}
    for name in SPLITS:
        encoded[name] = _examples(name, plans[name])
        answers = sum(sum(label != IGNORE for label in row) for row in encoded[name]["labels"])
        stats[name] = {"examples": len(encoded[name]), "answers": int(answers)}
    corpus = datasets.DatasetDict(encoded)
    tokenizer = mqar_tokenizer(spec.vocab_size)
    with atomic_path(out_dir, directory=True) as tmp:
        corpus.save_to_disk(os.fspath(tmp))
        tokenizer.save_pretrained(os.fspath(tmp / TOKENIZER_DIR))
        write_corpus_card(tmp, task="mqar", context=spec.input_seq_len)
        write_json(tmp / MQAR_CARD, mqar_card(spec, seed, counts, parts))
    return {
        "task": "mqar",
        **spec.to_json(),
        "context": spec.input_seq_len,
        "splits": stats,
        "vocab_size": len(tokenizer),
        "fingerprint": _fingerprint(corpus),
    }
