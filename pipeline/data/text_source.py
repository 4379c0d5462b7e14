"""Sentence pairs from two local UTF-8 text files aligned line by line (line n of one translates line n of the
other). Pair ids are "line-<n>", counting from 1, so they stay put when lines are appended.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.data.pair import SourceRead
from pipeline.errors import UserError


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"text corpus file {path} does not exist")
    try:
        with path.open(encoding="utf-8") as handle:
            # Whitespace inside a line is collapsed; nothing else is touched, the text may be pre-tokenised.
            return [" ".join(line.split()) for line in handle]
    except UnicodeDecodeError as err:
        raise UserError(f"text corpus file {path} is not UTF-8 ({err.reason} at byte {err.start})") from None


def read_text_pair(source_file: str | os.PathLike, target_file: str | os.PathLike) -> SourceRead:
    """Read aligned lines from ``source_file`` and ``target_file``; a pair with an empty side is dropped.

    Raises :class:`UserError` when a file is missing or not UTF-8, or when the line counts differ.
    """
    source_path, target_path = Path(source_file), Path(target_file)
    sources, targets = _read_lines(source_path), _read_lines(target_path)
    if len(sources) != len(targets):
        raise UserError(
            f"text corpus files are not aligned: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}"
        )
    read = SourceRead()
    for number, (src, tgt) in enumerate(zip(sources, targets, strict=True), start=1):
        read.add(f"line-{number}", src, tgt)
    return read
