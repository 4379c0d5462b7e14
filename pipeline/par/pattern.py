"""PAR patterns: which sublayers a stack is made of, written as in the PAR paper.

A pattern is a sequence of sublayer letters, read left to right from the embeddings up:

- ``s``: self-attention, ``x ← LayerNorm(x + SelfAttention(x))``;
- ``f``: feed-forward, ``x ← LayerNorm(x + W₂ act(W₁ x))``;
- ``c``: cross-attention to the encoder's output (decoder only), ``x ← LayerNorm(x + CrossAttention(x, h))``.

Letters may be grouped and repeated, ``(sff)x2 (f)x2`` = ``sffsffff``; spaces between items are
ignored. A Marian stack of L layers is ``(sf)xL`` (encoder) and ``(scf)xL`` (decoder); a decoder-only LM
(Llama) of L layers is one decoder stack ``(sf)xL``, whose sublayers are pre-norm, ``x ← x + F(Norm(x))``.
The paper's letters are ``s`` and ``f`` (its models are decoder-only); ``c`` keeps an encoder–decoder's
cross-attention where the pattern puts it.

Whether a decoder reads an encoder (``cross``) is the model's business: params check a pattern's syntax
and letters (``cross=None``), the model it is applied to checks the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

Stack = Literal["encoder", "decoder"]

SELF, FEED_FORWARD, CROSS = "s", "f", "c"
LETTERS: dict[Stack, str] = {"encoder": SELF + FEED_FORWARD, "decoder": SELF + CROSS + FEED_FORWARD}
# an item: a run of letters, or a parenthesised run with a repeat count
_ITEM = re.compile(
    r"\s*(?:(?P<run>[a-z]+)|\((?P<group>[a-z]*)(?P<close>\)?)(?P<times>\s*x)?\s*(?P<count>\d*))"
)


def stack_letters(stack: Stack, cross: bool | None) -> str:
    """The sublayer letters of ``stack``: a decoder's ``c`` only when it reads an encoder (``cross``; None:
    not known yet, so allowed)."""
    return SELF + FEED_FORWARD if cross is False else LETTERS[stack]


def teacher_pattern(stack: Stack, layers: int, *, cross: bool = True) -> str:
    """The pattern of a teacher stack with ``layers`` layers (each layer's sublayers, in order): a Marian
    encoder or decoder, or (``cross=False``) a decoder-only LM."""
    return stack_letters(stack, cross) * layers


def _syntax(text: str, position: int, what: str, stack: Stack, cross: bool | None) -> ValueError:
    allowed = ", ".join(stack_letters(stack, cross))
    return ValueError(
        f"{stack} pattern {text!r}, position {position + 1}: {what}; allowed: the letters {allowed} and "
        "groups '(letters)xN', e.g. '(sff)x2 ff'"
    )


def parse_pattern(text: str, stack: Stack, *, cross: bool | None = True) -> str:
    """The flat letter string of ``text`` (``'(sf)x2 f'`` → ``'sfsff'``), checked for ``stack``.

    Raises ValueError naming the first position that is not a letter of the stack, a well-formed group or a
    repeat count of at least 1. A decoder pattern must hold an ``s`` (or a target token would never see the
    ones before it) and, when it reads an encoder (``cross``), a ``c`` (or it would never read the source);
    a decoder-only LM's (``cross=False``) has no ``c``. ``cross=None`` checks all but the ``c`` rule.
    """
    flat: list[str] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _ITEM.match(text, position)
        if match is None:
            start = len(text) - len(text[position:].lstrip())
            raise _syntax(text, start, f"unexpected {text[start]!r}", stack, cross)
        letters = match["run"] if match["run"] is not None else match["group"]
        offset = match.start("run") if match["run"] is not None else match.start("group")
        for i, letter in enumerate(letters):
            if letter not in stack_letters(stack, cross):
                what = f"{letter!r} is not a sublayer of the {stack}"
                if letter == CROSS and stack == "decoder":
                    what += " of a decoder-only model (it has no encoder to attend)"
                raise _syntax(text, offset + i, what, stack, cross)
        if match["run"] is not None:
            flat.append(letters)
        else:
            if not match["close"]:
                raise _syntax(text, match.end("group"), "the group is not closed by ')'", stack, cross)
            if not letters:
                raise _syntax(text, match.start("group") - 1, "an empty group", stack, cross)
            if not match["times"] or not match["count"] or int(match["count"]) < 1:
                what = "a group needs a repeat count 'xN' (N ≥ 1) after its ')'"
                raise _syntax(text, match.end("close"), what, stack, cross)
            flat.append(letters * int(match["count"]))
        position = match.end()
    pattern = "".join(flat)
    if not pattern:
        raise _syntax(text, 0, "no sublayers", stack, cross)
    if stack == "decoder" and cross and CROSS not in pattern:
        raise _syntax(text, 0, "no 'c': the decoder would never read the encoder's output", stack, cross)
    if stack == "decoder" and SELF not in pattern:
        raise _syntax(text, 0, "no 's': a target token would never see the tokens before it", stack, cross)
    return pattern


def compact_pattern(pattern: str) -> str:
    """A short way to write a flat pattern: each maximal repeat of the shortest period as ``(…)xN``,
    e.g. ``'sfsfsfff'`` → ``'(sf)x3 (f)x2'``; parses back to ``pattern``."""
    items: list[str] = []
    start = 0
    while start < len(pattern):
        best = (1, 1)  # (period, repeats) covering the most letters, shortest period first
        for period in range(1, (len(pattern) - start) // 2 + 1):
            unit = pattern[start : start + period]
            repeats = 1
            while pattern.startswith(unit, start + repeats * period):
                repeats += 1
            if repeats > 1 and period * repeats > best[0] * best[1]:
                best = (period, repeats)
        period, repeats = best
        unit = pattern[start : start + period]
        if repeats > 1:
            items.append(f"({unit})x{repeats}")
        elif items and not items[-1].startswith("("):
            items[-1] += unit
        else:
            items.append(unit)
        start += period * repeats
    return " ".join(items)


def attention_sublayers(pattern: str) -> int:
    """How many self-attention sublayers a flat pattern has."""
    return pattern.count(SELF)


def attention_share(patterns: Mapping[Stack, str], teacher_layers: int) -> tuple[int, float]:
    """(self-attention sublayers of the flat ``patterns``, their share of a teacher's ``teacher_layers``
    self-attentions, rounded to 4 places): the PAR paper's "fewer attention blocks"."""
    attention = sum(attention_sublayers(pattern) for pattern in patterns.values())
    return attention, round(attention / teacher_layers, 4)
