"""The attention kinds a graph store can hold, and which side of a sentence pair each one reads.

- ``decoder_self``: decoder self-attention over the target prefix, causal (key j ≤ query i).
- ``encoder_self``: encoder self-attention over the source, bidirectional.
- ``cross``: decoder queries over encoder keys (a bipartite graph), bidirectional.

It lives outside :mod:`pipeline.attention`, whose import registers the attention implementations with
transformers (seconds): the graph store, the predictors and the stages that never build a model read the
kinds without that import.
"""

from __future__ import annotations

from dataclasses import dataclass

SIDES = ("source", "target")


@dataclass(frozen=True)
class AttentionKind:
    """Where a kind's queries and keys come from, and whether its valid pairs are causal."""

    name: str
    query_side: str
    key_side: str
    causal: bool


KINDS: dict[str, AttentionKind] = {
    kind.name: kind
    for kind in (
        AttentionKind("decoder_self", query_side="target", key_side="target", causal=True),
        AttentionKind("encoder_self", query_side="source", key_side="source", causal=False),
        AttentionKind("cross", query_side="target", key_side="source", causal=False),
    )
}


def attention_kind(name: str) -> AttentionKind:
    """The kind called ``name``; ``ValueError`` naming the allowed kinds otherwise."""
    if name not in KINDS:
        raise ValueError(f"unknown attention kind {name!r}; allowed: {', '.join(KINDS)}")
    return KINDS[name]


def valid_pair_count(n: int, m: int, *, causal: bool) -> int:
    """|V| for one sentence: n·m pairs, or n(n+1)/2 when causal (square, key j ≤ query i)."""
    return n * (n + 1) // 2 if causal else n * m
