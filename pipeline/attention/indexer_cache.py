"""A generation cache that keeps the τ-indexer's low-rank keys B k beside the keys themselves.

At each decoding step a τ-indexer head scores its new query against every cached key at rank r,
z′_j = s (A q)·(B k_j). Without a cache of B k the step re-projects all m keys, m·d·r multiply-adds per
head: r times the step's own attention work. With it a step projects only its new key.

The projections live in transformers' own indexer cache layer
(:class:`~transformers.cache_utils.DynamicIndexedLayer`, made for DeepSeek's lightning indexer). It
reorders, crops and selects them together with the keys, in beam search and in batched generation.

An attention function is not handed the cache. So each layer, when it takes new keys, tells its head by a
weak reference which cache layer it updated. The head uses that layer's projections only when the keys it
is given are that layer's very keys tensor (an identity check), and re-projects them otherwise. A stale or
foreign cache can therefore cost time, never change a result.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from torch import Tensor
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, DynamicCache, DynamicIndexedLayer, EncoderDecoderCache


class KeyIndexer(Protocol):
    """What a cache layer needs of its head: B k of new keys, and where to say which layer holds them."""

    index_cache: weakref.ref | None

    def index_keys(self, keys: Tensor) -> Tensor:
        """(b, h, t, r) B k of the attention module's keys (b, h_kv, t, d)."""
        ...


class IndexedKeysLayer(DynamicIndexedLayer):
    """One layer's keys and values, and its τ-indexer's B k of every key (b, m, h·r), kept in step."""

    def __init__(self, head: KeyIndexer) -> None:
        super().__init__()
        self.head = head
        self.rank = 0  # r, known from the first keys

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        new = self.head.index_keys(key_states)  # (b, h, t, r)
        b, h, t, r = new.shape
        self.update_indexer(new.transpose(1, 2).reshape(b, t, h * r))
        self.rank = r
        self.head.index_cache = weakref.ref(self)
        return keys, values

    def key_index(self) -> Tensor:
        """(b, h, m, r) B k of every cached key."""
        b, m, _ = self.indexer_keys.shape
        return self.indexer_keys.view(b, m, -1, self.rank).transpose(1, 2)


def indexer_cache(config: PretrainedConfig, kind: str, heads: Mapping[int, KeyIndexer]) -> Cache:
    """A cache for one ``generate`` call of a model with ``config`` whose ``kind`` attention (decoder_self
    or cross) has τ-indexer ``heads`` by layer index: those layers keep their keys' projections."""
    text_config = config.get_text_config(decoder=True)
    indexed = DynamicCache(config=text_config)
    for layer_idx, head in heads.items():
        indexed.layers[layer_idx] = IndexedKeysLayer(head)
    if not config.is_encoder_decoder:
        return indexed
    other = DynamicCache(config=text_config)
    if kind == "cross":
        return EncoderDecoderCache(other, indexed)
    return EncoderDecoderCache(indexed, other)
