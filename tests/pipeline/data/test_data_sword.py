"""Reading and aligning the SWORD modules."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.data.sword import open_module, read_sword, restore_chapter_opening
from pipeline.errors import UserError


def test_genesis_opens_aligned(sword_read):
    first = sword_read.pairs[0]
    assert first.id == "Gen.1.1"
    assert first.src == "In the beginning, God created the heavens and the earth."
    # The RV1909 prints "EN el principio"; the drop capital is undone.
    assert first.tgt == "En el principio crió Dios los cielos y la tierra."
    assert first.split is None


def test_counts_add_up(sword_read):
    counts = sword_read.counts()
    assert counts["total"] == counts["kept"] + counts["dropped_missing"] + counts["dropped_empty"]
    assert counts["kept"] > 30_000
    ids = [pair.id for pair in sword_read.pairs]
    assert len(set(ids)) == len(ids)
    # The deuterocanon is in the WEB's versification but not the RV1909's.
    assert not any(pair.id.startswith(("Tob.", "Sir.", "1Macc.")) for pair in sword_read.pairs)
    assert counts["dropped_missing"] > 5_000


def test_verses_pair_up_across_the_canon(sword_read):
    pairs = {pair.id: pair for pair in sword_read.pairs}
    assert pairs["John.3.16"].tgt.startswith("Porque de tal manera amó Dios al mundo")
    assert pairs["Rev.22.21"].tgt == "La gracia de nuestro Señor Jesucristo sea con todos vosotros. Amén."
    assert pairs["Ps.23.1"].src.startswith("A Psalm by David. Yahweh is my shepherd")


def test_drop_capitals_take_their_usual_case():
    counts = Counter({"aconteció": 40, "Aconteció": 2, "Jehová": 90, "aquí": 30})
    assert restore_chapter_opening("Y ACONTECIÓ que", counts) == "Y aconteció que"
    assert restore_chapter_opening("Y JEHOVÁ dijo", counts) == "Y Jehová dijo"
    assert restore_chapter_opening("HE AQUÍ que", counts) == "He aquí que"
    assert restore_chapter_opening("¡AY de ti", counts) == "¡Ay de ti"
    assert restore_chapter_opening("No capitals here", counts) == "No capitals here"


def test_missing_library_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as excinfo:
        read_sword(sword_path=tmp_path)
    message = str(excinfo.value)
    assert "engWEB2015eb" in message and str(tmp_path) in message
    assert "sword-text-web sword-text-sparv" in message
    assert "\n" not in message


def test_missing_module_is_a_user_error(sword_installed):
    with pytest.raises(UserError, match="SWORD module noSuchBible not found under /usr/share/sword"):
        open_module("noSuchBible")


def test_module_without_data_files_is_a_user_error(tmp_path):
    (tmp_path / "mods.d").mkdir()
    (tmp_path / "mods.d" / "ghost.conf").write_text(
        "[ghost]\nDataPath=./modules/texts/ztext/ghost/\nModDrv=zText\nSourceType=OSIS\nVersification=KJV\n"
    )
    with pytest.raises(UserError, match=r"ghost .*sword-text-web"):
        open_module("ghost", tmp_path)
