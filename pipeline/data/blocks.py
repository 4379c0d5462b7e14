"""Fixed-length blocks of token ids for language modelling, cut from streams of documents.

A stream's documents of one split are tokenised (each ends with ``</s>``, so a block shows where one
document ends and the next begins), concatenated in reading order and cut into consecutive blocks of
``context`` tokens; the last, shorter piece is dropped, so every block is full and no block is padding.
A block's id is ``<stream>/<split>/<index>``: it depends on its stream and split only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerFast

from pipeline.data.documents import Document


@dataclass(frozen=True)
class Block:
    id: str
    input_ids: list[int]


@dataclass
class BlockCount:
    """What cutting one split gave: blocks, documents read, and tokens kept in blocks or dropped at the end
    of a stream."""

    blocks: int = 0
    documents: int = 0
    tokens: int = 0
    dropped_tokens: int = 0


def cut_blocks(
    documents: Iterable[Document], split: str, tokenizer: PreTrainedTokenizerFast, context: int
) -> tuple[list[Block], BlockCount]:
    """The blocks of ``documents`` (all of one split), stream by stream in order of first appearance."""
    if context < 2:
        raise ValueError(
            f"a block needs at least 2 tokens (one to predict from, one to predict), got {context}"
        )
    streams: dict[str, list[str]] = {}
    for document in documents:
        streams.setdefault(document.stream, []).append(document.text)
    blocks, count = [], BlockCount()
    for stream, texts in streams.items():
        ids = [token for encoded in tokenizer(texts)["input_ids"] for token in encoded]
        whole = len(ids) // context
        blocks += [
            Block(f"{stream}/{split}/{index}", ids[index * context : (index + 1) * context])
            for index in range(whole)
        ]
        count.documents += len(texts)
        count.tokens += whole * context
        count.dropped_tokens += len(ids) - whole * context
    count.blocks = len(blocks)
    return blocks, count
