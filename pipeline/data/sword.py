"""Verse-aligned sentence pairs from two locally installed SWORD Bible modules, read with pysword.

The default pair is the World English Bible (engWEB2015eb, NRSVA versification) → Reina-Valera 1909
(spaRV1909eb, KJV versification). Pairs follow the source module's versification; a verse the target's
versification lacks (the deuterocanon, for the RV1909) or that either module leaves empty is dropped and
counted.
"""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping

from pysword.bible import SwordBible
from pysword.modules import SwordModules
from tqdm import tqdm

from pipeline.data.osis import clean_osis
from pipeline.data.pair import SourceRead
from pipeline.errors import UserError

DEFAULT_SWORD_PATH = "/usr/share/sword"
DEFAULT_SOURCE_MODULE = "engWEB2015eb"
DEFAULT_TARGET_MODULE = "spaRV1909eb"
_INSTALL_HINT = "install the Debian packages sword-text-web sword-text-sparv"
_WORD = re.compile(r"\w+")
_SENTENCE_START = re.compile(r"(?:^|[.:;!?¡¿“(]\s*)$")


def _is_capitals(word: str) -> bool:
    return len(word) > 1 and word.isupper()


def restore_chapter_opening(text: str, word_counts: Mapping[str, int]) -> str:
    """Undo the drop-cap convention in a chapter's first verse.

    The RV1909 prints a chapter's first words in capitals ("EN el principio", "Y ACONTECIÓ", "HE AQUÍ"),
    which would teach a model that these words have a capitalised form of their own. The first run of
    all-capitals words (two or more letters each) takes the casing each word has most often elsewhere in the
    module ("aconteció", but "Jehová"), capitalised at the start of a sentence.
    """
    words = list(_WORD.finditer(text))
    first = next((index for index, match in enumerate(words) if _is_capitals(match.group(0))), None)
    if first is None:
        return text
    pieces, position = [], 0
    for match in words[first:]:
        word = match.group(0)
        if not _is_capitals(word):
            break
        lower, title = word.lower(), word.capitalize()
        cased = lower if word_counts.get(lower, 0) > word_counts.get(title, 0) else title
        if _SENTENCE_START.search(text[: match.start()]):
            cased = title
        pieces += [text[position : match.start()], cased]
        position = match.end()
    return "".join(pieces) + text[position:]


def open_module(name: str, sword_path: str | os.PathLike = DEFAULT_SWORD_PATH) -> SwordBible:
    """Open the Bible module ``name`` from the SWORD library at ``sword_path``.

    Raises :class:`UserError` when the library, the module's conf file or its data files are missing.
    """
    missing = f"SWORD module {name} not found under {sword_path}: {_INSTALL_HINT}"
    try:
        modules = SwordModules(os.fspath(sword_path))
        found = modules.parse_modules()
    except OSError:
        raise UserError(missing) from None
    if name not in found:
        raise UserError(missing)
    try:
        bible = modules.get_bible_from_module(name)
    except OSError as err:
        raise UserError(
            f"SWORD module {name} under {sword_path} is unreadable ({err}): {_INSTALL_HINT}"
        ) from None
    if hasattr(bible, "_decompressed_text"):
        # zText modules store a whole book per compressed block and pysword inflates the block again for every
        # verse; remembering the last blocks turns a full read from minutes into well under a second.
        bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)
    return bible


def read_verses(
    bible: SwordBible, *, books: Iterable[str] | None = None, clean: bool = True
) -> dict[str, str]:
    """Map verse ids ("Gen.1.1") to verse text, in the module's versification order.

    ``books`` restricts the read to these OSIS book names ("Gen", "John"); ``clean=False`` returns the raw
    OSIS markup. Verses the module leaves blank map to "".
    """
    wanted = set(books) if books is not None else None
    structure = [
        book
        for testament in bible.get_structure().get_books().values()
        for book in testament
        if wanted is None or book.osis_name in wanted
    ]
    verses: dict[str, str] = {}
    for book in tqdm(structure, desc="read SWORD books", unit="book", disable=None, leave=False):
        ids = [
            f"{book.osis_name}.{chapter}.{verse}"
            for chapter, count in enumerate(book.chapter_lengths, start=1)
            for verse in range(1, count + 1)
        ]
        # pysword's own cleaning glues words across removed notes, so the raw markup is read and cleaned here.
        texts = bible.get_iter(books=book.name, clean=False)
        for verse_id, text in zip(ids, texts, strict=True):
            verses[verse_id] = clean_osis(text) if clean else text
    return verses


def _clean_present(raw: Mapping[str, str], desc: str) -> dict[str, str]:
    """Clean every verse that has any text; blank verses are left out, so they read as missing."""
    present = {verse_id: text for verse_id, text in raw.items() if text.strip()}
    return {
        verse_id: clean_osis(text)
        for verse_id, text in tqdm(present.items(), desc=desc, unit="verse", disable=None, leave=False)
    }


def read_sword(
    sword_path: str | os.PathLike = DEFAULT_SWORD_PATH,
    source_module: str = DEFAULT_SOURCE_MODULE,
    target_module: str = DEFAULT_TARGET_MODULE,
) -> SourceRead:
    """Read both modules and align them by verse id, in the source module's versification.

    A verse is *missing* when the target's versification lacks it or either module stores no text for it,
    and *empty* when it holds only markup (a footnote saying the verse is omitted, a paragraph marker).
    """
    source_raw = read_verses(open_module(source_module, sword_path), clean=False)
    target_raw = read_verses(open_module(target_module, sword_path), clean=False)
    source = _clean_present(source_raw, f"clean {source_module}")
    target = _clean_present(target_raw, f"clean {target_module}")
    source_words = Counter(word for text in source.values() for word in _WORD.findall(text))
    target_words = Counter(word for text in target.values() for word in _WORD.findall(text))
    read = SourceRead()
    for verse_id in source_raw:
        src, tgt = source.get(verse_id), target.get(verse_id)
        if verse_id.endswith(".1") and src and tgt:
            src = restore_chapter_opening(src, source_words)
            tgt = restore_chapter_opening(tgt, target_words)
        read.add(verse_id, src, tgt)
    return read
