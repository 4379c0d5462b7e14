"""Turn one verse of OSIS markup (as stored in SWORD modules) into clean plain text.

pysword's own cleaner deletes tags without regard to what they separate, so a footnote between two words glues
them ("God<note>…</note><w>created</w>" becomes "Godcreated"). Here every tag is classified by what it means
for the running text:

- editorial elements whose content is not verse text (notes, speaker labels, non-canonical headings) are
  removed with their content and leave a word break;
- structural tags (paragraphs, poetry lines, lists, chapter/verse milestones) become a word break;
- inline wrappers (``<w>`` Strong's words, ``<transChange>``, ``<q>``, ``<name>``, ``<seg>`` …) disappear
  without a break because they sit inside running text;
- anything after the end-of-book marker is back matter (the WEB appends its glossary to Rev 22:21) and is cut.

Spaces introduced before punctuation by removed notes are then closed up.
"""

from __future__ import annotations

import functools
import html
import re

# Strong's numbers are most of the markup by volume; dropping them first makes every later pass cheap.
_W_OPEN = re.compile(r"<w\b[^>]*>")
# Elements removed together with their content; each leaves a word break.
_DROPPED_ELEMENTS = re.compile(
    r"<(note|speaker|catchWord|rdg|rdgGroup|figure|abbr)\b[^>]*?/>"
    r"|<(note|speaker|catchWord|rdg|rdgGroup|figure|abbr)\b[^>]*>.*?</\2>",
    re.DOTALL,
)
# Headings are editorial except canonical ones: a psalm's superscription is verse text (the RV1909 keeps it
# inside verse 1 without markup), so its content stays.
_TITLE = re.compile(r"<title\b([^>]*)>(.*?)</title>", re.DOTALL)
# Closing book marker; whatever follows in the same verse (glossaries, appendices) is not part of the verse.
_BOOK_END = re.compile(r"<div\b(?=[^>]*\btype=\"book\")(?=[^>]*\beID=)[^>]*/>")
# A pronoun supplied by the translators and attached to the preceding verb: RV1909 writes "díjo" +
# <transChange>le</transChange> for "díjole". The verb is recognised by an infinitive, imperative or gerund
# ending, or by the written accent RV1909 puts on verbs carrying enclitics.
_ENCLITIC = re.compile(
    r"(?P<word>\b\w+)(?P<close></w>)?"
    r"<transChange\b[^>]*>(?P<clitic>(?:[mts]e|nos|os|l[aeo]s?))</transChange>"
)
_VERB_ENDING = re.compile(r"(?:[aei]r|[aei]d|ndo)$")
_ACCENTED = re.compile(r"[áéíóú]")
# Accented words that take a following pronoun as a separate word ("cuánto nos").
_NOT_VERBS = frozenset(
    {"cuánto", "cuánta", "cuántos", "cuántas", "qué", "cómo", "cuándo", "dónde", "quién", "más"}
)
_SENTENCE_START = re.compile(r"(?:^|[.:;!?¡¿\"“(]\s*)$")

_TAG_RUN = re.compile(r"(?:<[^>]*>)+")
# A lone word wrapper (no tag beside it) can never break a word; removing these in one pass spares the
# per-run callback for most of the markup.
_LONE_W = re.compile(r"<(?<!><)/?w>(?!<)")
_TAG = re.compile(r"<(/?)(\w+)([^>]*?)(/?)>")
_MARKER = re.compile(r"\bmarker=\"([^\"]*)\"")
# Wrappers that sit inside running text: removing them inserts no break by itself.
_INLINE = frozenset(
    {"w", "transChange", "q", "name", "seg", "hi", "foreign", "divineName", "reference", "mentioned", "a"}
)
_SPACE_BEFORE = re.compile(r" ([,.;:!?)\]»”])")
_SPACE_AFTER = re.compile(r"([(\[«“¿¡]) ")


def _keep_canonical_title(match: re.Match[str]) -> str:
    return f" {match.group(2)} " if 'canonical="true"' in match.group(1) else " "


def _is_enclitic_host(word: str, before: str) -> bool:
    """Whether ``word`` is a verb that absorbs a following supplied pronoun.

    Capitalised words qualify only at the start of a sentence, where a verb can be capitalised; elsewhere a
    capital marks a name ("Josué los circuncidó").
    """
    if word[0].isupper() and not _SENTENCE_START.search(before):
        return False
    lower = word.lower()
    if lower in _NOT_VERBS:
        return False
    return bool(_VERB_ENDING.search(lower) or _ACCENTED.search(lower))


def _attach_enclitics(text: str) -> str:
    def attach(match: re.Match[str]) -> str:
        before = _TAG_RUN.sub("", text[: match.start()])
        if match.group("close") and not _is_enclitic_host(match.group("word"), before):
            return match.group(0)
        # Closing the word wrapper after the pronoun keeps the two inside one tag run, which is inline.
        return f"{match.group('word')}{match.group('clitic')}{match.group('close') or ''}"

    return _ENCLITIC.sub(attach, text)


def _replace_tag_run(match: re.Match[str]) -> str:
    return _tag_run_replacement(match.group(0))


# Runs repeat endlessly ("</w> <w>", "</w><w>"), so their replacement is memoised.
@functools.lru_cache(maxsize=4096)
def _tag_run_replacement(run: str) -> str:
    """Replace a run of adjacent tags by a word break, by nothing, or by quotation marks.

    A run breaks words when it holds a structural tag, or when it closes one inline wrapper and then opens
    another: "<w>allí</w><transChange>también</transChange>" is two words although no space separates them.
    A run that only opens or only closes wrappers sits inside a word ("preguntándo<transChange>le").
    """
    breaks = False
    closed = False
    marks = []
    for closing, name, attrs, _ in _TAG.findall(run):
        if name not in _INLINE:
            breaks = True
        elif closing:
            closed = True
        elif closed:
            breaks = True
        if name == "q":
            # OSIS renders a <q> with its marker attribute; both modules set marker="" (and declare
            # OSISqToTick=false) because the quotation marks are already in the text.
            marker = _MARKER.search(attrs)
            marks.append(marker.group(1) if marker else "")
    return (" " if breaks else "") + "".join(marks)


def normalize_spacing(text: str) -> str:
    """Collapse whitespace and close up spaces inside punctuation ("word ," → "word,", "( x" → "(x")."""
    text = " ".join(text.split())
    text = _SPACE_BEFORE.sub(r"\1", text)
    return _SPACE_AFTER.sub(r"\1", text)


def clean_osis(raw: str) -> str:
    """Return the plain text of one verse of OSIS markup; empty when the verse holds only markup."""
    end = _BOOK_END.search(raw)
    if end:
        raw = raw[: end.start()]
    text = _W_OPEN.sub("<w>", raw)
    text = _DROPPED_ELEMENTS.sub(" ", text)
    text = _TITLE.sub(_keep_canonical_title, text)
    if "<transChange" in text:
        text = _attach_enclitics(text)
    text = _LONE_W.sub("", text)
    text = _TAG_RUN.sub(_replace_tag_run, text)
    return normalize_spacing(html.unescape(text))
