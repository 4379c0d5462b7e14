"""Line-aligned text files as a corpus source."""

from __future__ import annotations

import pytest

from pipeline.data.text_source import read_text_pair
from pipeline.errors import UserError


def _write(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_lines_pair_up_with_stable_ids(tmp_path):
    src = _write(tmp_path / "train.en", ["Hello  world.", "", "Good night."])
    tgt = _write(tmp_path / "train.es", ["Hola mundo.", "Vacío.", "Buenas noches."])
    read = read_text_pair(src, tgt)
    assert [(pair.id, pair.src, pair.tgt) for pair in read.pairs] == [
        ("line-1", "Hello world.", "Hola mundo."),
        ("line-3", "Good night.", "Buenas noches."),
    ]
    assert read.counts() == {"total": 3, "kept": 2, "dropped_missing": 0, "dropped_empty": 1}


def test_line_count_mismatch_names_both_files(tmp_path):
    src = _write(tmp_path / "a.en", ["one", "two", "three"])
    tgt = _write(tmp_path / "a.es", ["uno", "dos"])
    with pytest.raises(UserError) as excinfo:
        read_text_pair(src, tgt)
    message = str(excinfo.value)
    assert f"{src} has 3 lines" in message and f"{tgt} has 2" in message


def test_missing_file_is_a_user_error(tmp_path):
    src = _write(tmp_path / "a.en", ["one"])
    with pytest.raises(UserError, match="does not exist"):
        read_text_pair(src, tmp_path / "absent.es")


def test_non_utf8_file_is_a_user_error(tmp_path):
    src = _write(tmp_path / "a.en", ["one"])
    tgt = tmp_path / "a.es"
    tgt.write_bytes("año\n".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        read_text_pair(src, tgt)
