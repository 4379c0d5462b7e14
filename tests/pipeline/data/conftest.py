"""Shared fixtures: verses read from the installed SWORD modules (once per test session).

The README's test command installs the modules first (``make test`` depends on ``make corpus``), so a
missing module fails the requesting test with the reason: a skip would hide a broken install.
"""

from __future__ import annotations

import pytest

from pipeline.data.pair import SourceRead
from pipeline.data.sword import (
    DEFAULT_SOURCE_MODULE,
    DEFAULT_TARGET_MODULE,
    open_module,
    read_sword,
    read_verses,
)
from pipeline.errors import UserError

# Books whose markup covers every case the cleaner handles: footnotes between words, poetry lines, psalm
# titles, lists, speaker labels, red-letter quotes, supplied words, the glossary appended to Revelation.
SAMPLE_BOOKS = ("Gen", "Num", "Josh", "1Kgs", "1Chr", "Ezra", "Ps", "Song", "Matt", "John", "Rev")


@pytest.fixture(scope="session")
def sword_installed() -> None:
    """Fail the requesting test, naming the module, unless both default modules can be opened."""
    try:
        for name in (DEFAULT_SOURCE_MODULE, DEFAULT_TARGET_MODULE):
            open_module(name)
    except UserError as err:
        pytest.fail(f"{err} (install the corpora with `make corpus`)")


@pytest.fixture(scope="session")
def raw_verses(sword_installed: None) -> dict[str, dict[str, str]]:
    """Raw OSIS markup of :data:`SAMPLE_BOOKS`, keyed by module name, then verse id."""
    return {
        name: read_verses(open_module(name), books=SAMPLE_BOOKS, clean=False)
        for name in (DEFAULT_SOURCE_MODULE, DEFAULT_TARGET_MODULE)
    }


@pytest.fixture(scope="session")
def sword_read(sword_installed: None) -> SourceRead:
    """The whole default corpus, aligned and cleaned."""
    return read_sword()
