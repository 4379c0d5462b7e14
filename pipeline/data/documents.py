"""Long documents for language modelling, each in the stream it is read with and with the unit that
decides its split.

- SWORD: every chapter of every book of one or more (English) Bible modules. A chapter's stream is its
  module ("engKJV2006eb"); its unit is the chapter id ("Gen.1"), shared by every translation, so that one
  chapter lands in one split in all of them (a chapter tested in the WEB is never trained on in the KJV).
- A Hugging Face dataset of text rows, as WikiText-103 is: rows are lines, and an article starts at a
  title line `` = Title = ``. Its stream is the dataset split, whose own split it keeps.

A document's split depends on its unit alone, and blocks are cut from each stream's documents of one split
(:mod:`pipeline.data.blocks`), so adding a book, a translation or an article never moves text across splits.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pipeline.data.hf_source import SPLIT_NAMES, load_splits, require_columns
from pipeline.data.sword import open_module, read_verses

# WikiText's article titles: " = Title = " (one '=' each side; sections have two or more)
ARTICLE_TITLE = re.compile(r"^ = [^=].* = $")


@dataclass(frozen=True)
class Document:
    """One document: ``stream`` groups the documents blocks are cut from, ``unit`` decides the split by
    its hash unless the source gives ``split`` itself."""

    stream: str
    unit: str
    text: str
    split: str | None = None


def read_sword_chapters(
    sword_path: str, modules: Sequence[str], books: Sequence[str] | None = None
) -> list[Document]:
    """Every non-empty chapter of every module (of ``books`` only, OSIS names, when given), in the modules'
    order and reading order; verses joined by spaces."""
    documents = []
    for module in modules:
        verses = read_verses(open_module(module, sword_path), books=books)
        chapters: dict[str, list[str]] = {}
        for verse_id, text in verses.items():
            book, chapter, _ = verse_id.split(".")
            if text.strip():
                chapters.setdefault(f"{book}.{chapter}", []).append(text.strip())
        documents += [Document(module, unit, " ".join(texts)) for unit, texts in chapters.items()]
    return documents


def _articles(lines: Sequence[str]) -> Iterator[str]:
    """WikiText's rows grouped into articles, each starting at its title line; blank rows dropped."""
    article: list[str] = []
    for line in lines:
        text = line.rstrip("\n")
        if ARTICLE_TITLE.match(text) and article:
            yield " ".join(article)
            article = []
        if text.strip():
            article.append(text.strip())
    if article:
        yield " ".join(article)


def read_hf_documents(
    name: str, *, config: str | None = None, text_column: str = "text", lines: bool = True
) -> list[Document]:
    """The documents of every split of the dataset ``name`` (hub id or local folder), split by the dataset.

    ``lines``: rows are lines of articles that start at WikiText's title lines; otherwise every non-empty
    row is a document.
    """
    documents = []
    for split_name, dataset in load_splits(name, config, None).items():
        require_columns(name, dataset, [text_column])
        rows = list(dataset[text_column])
        texts = _articles(rows) if lines else (" ".join(row.split()) for row in rows if row.strip())
        split = SPLIT_NAMES.get(split_name)
        for index, text in enumerate(texts):
            documents.append(Document(split_name, f"{split_name}-{index}", text, split))
    return documents
