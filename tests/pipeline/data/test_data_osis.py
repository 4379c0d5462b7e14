"""OSIS cleaning, checked on real verses of the installed modules and on small synthetic markup."""

from __future__ import annotations

import re

import pytest
from pysword.cleaner import OSISCleaner

from pipeline.data.osis import clean_osis, normalize_spacing
from pipeline.data.sword import DEFAULT_SOURCE_MODULE as WEB
from pipeline.data.sword import DEFAULT_TARGET_MODULE as RV

# (module, verse, what pysword's own cleaner glues, what the verse must read)
GLUED_BY_PYSWORD = [
    (WEB, "Gen.1.1", "Godcreated", "In the beginning, God created the heavens and the earth."),
    (
        WEB,
        "John.3.16",
        "bornSon",
        "For God so loved the world, that he gave his only born Son, that whoever believes in him should "
        "not perish, but have eternal life.",
    ),
    (
        WEB,
        "Matt.13.25",
        "weedsalso",
        "but while people slept, his enemy came and sowed darnel weeds also among the wheat, and went away.",
    ),
    (
        RV,
        "Gen.2.12",
        "allítambiénbdelio",
        "Y el oro de aquella tierra es bueno: hay allí también bdelio y piedra cornerina.",
    ),
    (
        RV,
        "1Kgs.3.5",
        "díjoleDios",
        "Y aparecióse Jehová á Salomón en Gabaón una noche en sueños, y díjole Dios: Pide lo que quisieres "
        "que yo te dé.",
    ),
]


@pytest.mark.parametrize(("module", "verse", "glued", "expected"), GLUED_BY_PYSWORD)
def test_words_stay_apart_where_pysword_glues_them(raw_verses, module, verse, glued, expected):
    raw = raw_verses[module][verse]
    assert glued in OSISCleaner().clean(raw)
    assert clean_osis(raw) == expected


def test_psalm_title_is_kept_as_verse_text(raw_verses):
    # The RV1909 carries the superscription inside verse 1, so the English must too.
    assert clean_osis(raw_verses[WEB]["Ps.3.1"]).startswith(
        "A Psalm by David, when he fled from Absalom his son. Yahweh, how my adversaries"
    )
    assert clean_osis(raw_verses[RV]["Ps.3.1"]).startswith(
        "Salmo de David, cuando huía de delante de Absalom"
    )


def test_editorial_matter_is_dropped(raw_verses):
    # Speaker labels, the glossary appended to the last verse, footnote text.
    assert clean_osis(raw_verses[WEB]["Song.1.2"]) == (
        "Let him kiss me with the kisses of his mouth; for your love is better than wine."
    )
    assert clean_osis(raw_verses[WEB]["Rev.22.21"]) == (
        "The grace of the Lord Jesus Christ be with all the saints. Amen."
    )
    assert "Elohim" not in clean_osis(raw_verses[WEB]["Gen.1.1"])
    assert clean_osis(raw_verses[WEB]["Ezra.8.2"]) == (
        "Of the sons of Phinehas, Gershom. Of the sons of Ithamar, Daniel. Of the sons of David, Hattush."
    )


def test_supplied_pronouns_attach_only_to_verbs(raw_verses):
    assert clean_osis(raw_verses[RV]["1Chr.10.13"]).endswith("consultó al pythón, preguntándole,")
    assert "Josué los circuncidó" in clean_osis(raw_verses[RV]["Josh.5.4"])
    assert "Y dijo Jacob: Júramelo en este día." in clean_osis(raw_verses[RV]["Gen.25.33"])


@pytest.mark.parametrize("module", [WEB, RV])
def test_no_markup_or_loose_spacing_survives(raw_verses, module):
    verses = {verse: clean_osis(raw) for verse, raw in raw_verses[module].items()}
    assert sum(bool(text) for text in verses.values()) > 10_000
    for verse, text in verses.items():
        assert not re.search(r"[<>]|&#?\w+;", text), (verse, text)
        assert text == normalize_spacing(text), (verse, text)
        assert not re.search(r"[a-záéíóúñ][A-ZÁÉÍÓÚÑ]", text), (verse, text)


@pytest.mark.parametrize(
    ("markup", "expected"),
    [
        ('<w lemma="a">one</w><note placement="foot">x <rdg>y</rdg></note><w lemma="b">two</w>.', "one two."),
        ("word<note>n</note>, next", "word, next"),
        ('<l sID="1"/>first line<l eID="1"/><l sID="2"/>second<l eID="2"/>', "first line second"),
        ('said, <q marker="“">Go</q><q marker="">!</q>', "said, “Go!"),
        ('<title type="x">Heading</title>Text', "Text"),
        ('<title canonical="true" type="psalm">Of David.</title> <l/>Text', "Of David. Text"),
        ("A &amp; B", "A & B"),
        ('end. <div eID="x" type="book"/> <div type="glossary"/> Appendix', "end."),
        ("( spaced ) ¿ así ?", "(spaced) ¿así?"),
    ],
)
def test_markup_rules(markup, expected):
    assert clean_osis(markup) == expected
