"""Sparsefinder attention: α-entmax over a predicted graph Ĝ instead of over every key.

For one layer of the configured attention kind, with the layer's learned projections q′ = g_q(q), k′ = g_k(k)
and a predictor (k-means buckets, a distance threshold, ...):

    Ĝ = (learned(q′, k′) ∪ W ∪ G) ∩ A,     P = α-entmax(s masked to Ĝ by −inf),     out = P V

where W and G are the window band and the global tokens of :mod:`attention_kernels.attended` (absolute
positions, so a cached decoding step at position t sees the band around t) and A is what the model's own mask
allows (padding, causality, the cache). By sparse-consistency (Sparsefinder, Prop. 1) the output equals the
teacher's whenever Ĝ holds every key of the teacher's support.

Bucket predictors run through :func:`attention_kernels.bucketed.bucketed_attention` (Triton on CUDA, the
sub-quadratic PyTorch path on CPU) for whole sequences; mask predictors, decoding steps with a cache, a
learned α and padded non-causal batches run the dense masked entmax of :mod:`pipeline.attention.entmax` on Ĝ.
Both compute the same set. Keys' bucket ids are recomputed from the cached keys at each step: a key's ids
depend on that key alone (predictors of scope "token"), so this costs O(m·B·r) next to the step's O(m·d) and
is exact. Row-scope predictors (the τ-indexer) see the same keys a full forward gives the query, so they too
are exact; with the cache :func:`~pipeline.attention.interface.generation_cache` gives ``generate``, a
τ-indexer step projects only its new key (:mod:`pipeline.attention.indexer_cache`).

The τ-indexer runs whole sequences of at least ``INDEXED_MIN_KEYS`` keys without a window or global tokens
through :func:`attention_kernels.indexed.attention.indexed_attention`, which never builds the n × m graph:
entmax over Ĝ, the same set (``approximate``), or, when the configuration says ``certified``, exact α-entmax
over every allowed key (on GPU, Ĝ decides which key blocks are provably empty and skipped; on CPU the scanned
kernel scores every pair and runs the entmax on the keys near each row's maximum). A certified head is the
teacher's attention on every path (the other paths compute it densely).

The configuration lives in ``config.sparsefinder`` (see :func:`attach_sparsefinder`); every attention module
of the configured kind carries a :class:`SparsefinderHead` holding its layer's projections and fitted
tensors, saved with the model as safetensors. Modules without one compute plain α-entmax. Importing this
module registers ``attn_implementation="sparsefinder"``; :func:`pipeline.attention.load_model` then
rebuilds the heads from the config before loading the weights.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

import pipeline.predictors  # noqa: F401  (registers every predictor with make_predictor)
from attention_kernels.attended import pattern_pairs, shared_bucket_pairs, window_radius
from attention_kernels.bucketed import bucketed_attention
from attention_kernels.indexed.attention import index_needed, indexed_attention
from pipeline.attention.counting import PairCounter
from pipeline.attention.entmax import attention_alpha, entmax_attention_forward
from pipeline.attention.indexer_cache import indexer_cache
from pipeline.attention.interface import (
    causal_or_given,
    mark_stateless,
    refuse_missing_state,
    register_attention,
    register_generation_cache,
    register_state_attacher,
)
from pipeline.attention.recording import attention_layers
from pipeline.attention_kinds import KINDS, attention_kind
from pipeline.errors import UserError
from pipeline.predictors.base import HeadInputs, Prediction, Predictor, make_predictor
from pipeline.predictors.indexer import IndexerPredictor
from pipeline.projection.model import HeadProjections

SPARSEFINDER = "sparsefinder"
INDEXED_MIN_KEYS = 256
"""Keys from which the τ-indexer runs on :func:`attention_kernels.indexed.attention.indexed_attention` in a
whole-sequence forward; shorter rows take the masked dense path, which is faster there (the kernel works in
blocks of 32 keys, so a short row has too few blocks to skip)."""
# the predictor scopes a model can run in each kind: a decoder's queries arrive one step at a time, each
# with every key it may attend (its row)
MODEL_SCOPES = {
    "decoder_self": ("token", "row"),
    "cross": ("token", "row"),
    "encoder_self": ("token", "row", "sentence"),
}


class SparsefinderHead(PairCounter):
    """The predictor of one attention module: its layer's projections and fitted tensors (as buffers).

    ``predictor`` is the method with its knobs (a frozen dataclass, not a module); its fitted tensors for
    ``layer`` are the buffers ``state_<name>``, handed to it at every call so they follow the model's
    device. When :func:`~pipeline.attention.counting.measure_sparsity` is active the head also sums, per
    head, how many valid pairs it attended.
    """

    def __init__(
        self,
        predictor: Predictor,
        layer: int,
        kind: str,
        *,
        window: int,
        global_tokens: int,
        projections: HeadProjections | None,
        state: Mapping[str, Tensor],
        certified: bool = False,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.predictor, self.layer = predictor, layer
        self.groups = groups  # query heads per key/value head (grouped-query attention)
        self.causal = attention_kind(kind).causal
        self.self_attention = kind != "cross"
        self.window, self.global_tokens = window, global_tokens
        self.certified = certified
        self.projections = projections
        # the generation cache layer that last took this layer's keys (pipeline.attention.indexer_cache)
        self.index_cache: weakref.ref | None = None
        self.state_names = sorted(state)
        for name in self.state_names:
            self.register_buffer(f"state_{name}", state[name].clone())

    def extra_repr(self) -> str:
        return (
            f"{self.predictor.describe()}, layer={self.layer}, window={self.window}, "
            f"global_tokens={self.global_tokens}, certified={self.certified}"
        )

    def load_state(self) -> None:
        """Hand the predictor this layer's fitted tensors (buffers, so they follow the model's device)."""
        self.predictor.set_layer_state(self.layer, {n: getattr(self, f"state_{n}") for n in self.state_names})

    def predict(
        self,
        q: Tensor,
        k: Tensor,
        q_valid: Tensor,
        k_valid: Tensor,
        allowed: Tensor,
        scaling: float | None,
        key_index: Tensor | None = None,
    ) -> Prediction:
        """The predictor's buckets or mask for queries (b, h, n, d) and keys (b, h, m, d), within the pairs
        the model allows (b, 1 | h, n, m) and with the model's scaling; ``key_index``: the τ-indexer's B k
        (b, h, m, r) when a cache holds it."""
        q_proj = k_proj = None
        if self.projections is not None:
            dtype = self.projections.q_weight.dtype
            q_proj, k_proj = self.projections(q.to(dtype), k.to(dtype))
        self.load_state()
        inputs = HeadInputs(q, k, q_valid, k_valid, self.causal, q_proj, k_proj, scaling, allowed)
        if key_index is None:
            return self.predictor.predict(self.layer, inputs)
        return self.predictor.select(self.predictor.index_queries(self.layer, q), key_index, inputs)

    def index_keys(self, key: Tensor) -> Tensor:
        """(b, h, m, r) the τ-indexer's low-rank keys B k of the module's keys (b, h_kv, m, d), one map per
        query head."""
        self.load_state()
        return self.predictor.index_keys(self.layer, _per_query_head(key, self.groups))

    def cached_key_index(self, keys: Tensor) -> Tensor | None:
        """(b, h, m, r) B k of ``keys`` (b, h_kv, m, d) as a generation cache holds them; None unless the
        cache layer that last updated this head holds exactly this keys tensor."""
        layer = None if self.index_cache is None else self.index_cache()
        if layer is None or layer.keys is not keys:
            return None
        return layer.key_index()

    def graph(self, prediction: Prediction, allowed: Tensor, q_offset: int) -> Tensor:
        """(b, h, n, m) bool Ĝ = (learned ∪ W ∪ G) ∩ ``allowed`` for queries at positions q_offset + i."""
        if prediction.is_buckets:
            learned = shared_bucket_pairs(prediction.q_buckets, prediction.k_buckets)
        else:
            learned = prediction.mask
        n, m = learned.shape[-2:]
        pattern = pattern_pairs(
            n,
            m,
            window=self.window,
            global_tokens=self.global_tokens,
            q_offset=q_offset,
            device=learned.device,
        )
        return (learned | pattern) & allowed


def _allowed_pairs(attention_mask: Tensor | None, b: int, n: int, m: int, device: torch.device) -> Tensor:
    """(b, 1 | h, n, m) bool: the pairs the model's mask allows (all when it gives none)."""
    if attention_mask is None:
        return torch.ones(b, 1, n, m, dtype=torch.bool, device=device)
    mask = attention_mask[..., :m]
    if mask.dtype != torch.bool:
        mask = mask > torch.finfo(mask.dtype).min
    return mask.expand(b, -1, n, m)


def _per_query_head(x: Tensor, groups: int) -> Tensor:
    """Keys or values (b, h_kv, m, d) repeated to the query heads (b, h_kv · groups, m, d) under grouped-query
    attention; the dense path repeats its own (:func:`~pipeline.attention.entmax.attention_inputs`)."""
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def _indexed_forward(
    head: SparsefinderHead,
    query: Tensor,
    keys: Tensor,
    values: Tensor,
    k_valid: Tensor,
    alpha: float,
    scaling: float | None,
    key_index: Tensor | None,
) -> Tensor:
    """(b, h, n, d) the τ-indexer's attention through
    :func:`attention_kernels.indexed.attention.indexed_attention`: entmax over Ĝ (approximate) or exact entmax
    with Ĝ deciding which key blocks are skipped (certified). Nothing n × m is built. ``candidates`` is every
    key, so the kernel's set is the predictor's Ĝ uncapped. ``key_index``: B k (b, h, m, r) when a generation
    cache holds it."""
    head.load_state()
    mode = "certified" if head.certified else "approximate"
    q_index = k_index = None  # certified on the scanned CPU kernel scores every pair: no index to compute
    if index_needed(alpha, query, mode):
        q_index = head.predictor.index_queries(head.layer, query)  # (b, h, n, r)
        k_index = head.predictor.index_keys(head.layer, keys) if key_index is None else key_index.contiguous()
    return indexed_attention(
        query,
        keys,
        values,
        q_index,
        k_index,
        alpha=alpha,
        causal=head.causal,
        key_valid=None if bool(k_valid.all()) else k_valid,
        scale=scaling,
        margin=float(head.predictor.margin),
        mode=mode,
        candidates=keys.shape[-2],
    )


_VALID_KEYS: dict[int, dict[int, Tensor]] = {}
"""Per live model mask (by identity; its entry goes when the mask does), per key count m: the keys some query
may see."""


def _valid_keys(attention_mask: Tensor | None, allowed: Tensor) -> Tensor:
    """(b, m) bool: the keys some query may see; a key no query may see is padding. It reads all n × m
    allowed pairs, and a model hands every layer the same mask: computed once per mask, not per layer."""
    b, m = allowed.shape[0], allowed.shape[-1]
    if attention_mask is None:
        return torch.ones(b, m, dtype=torch.bool, device=allowed.device)
    mask_id = id(attention_mask)
    if mask_id not in _VALID_KEYS:
        _VALID_KEYS[mask_id] = {}
        weakref.finalize(attention_mask, _VALID_KEYS.pop, mask_id, None)
    per_count = _VALID_KEYS[mask_id]
    if m not in per_count:
        # the largest byte over queries and heads: about 15× faster on CPU than ``any`` over a non-last dim
        per_count[m] = allowed.view(torch.uint8).amax(dim=-2).amax(dim=1).bool()
    return per_count[m]


def sparsefinder_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_bias: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """α-entmax over Ĝ (see the module docstring) in the ``transformers.AttentionInterface`` signature.

    Shapes as :func:`~pipeline.attention.entmax.entmax_attention_forward`. Returns the output
    (b, n, h, d) and the probabilities (b, h, n, m), or None for them when a kernel ran.
    """
    refuse_missing_state(module, SPARSEFINDER)
    head: SparsefinderHead | None = getattr(module, SPARSEFINDER, None)
    b, _, n, _ = query.shape
    m = key.shape[-2]
    # None from causal_skipping_mask: whole causal sequences, no padding (the mask built once per length)
    given, attention_mask = attention_mask, causal_or_given(module, attention_mask, n, m, query.device)
    whole_causal = given is None and attention_mask is not None
    dense = (module, query, key, value)
    options = dict(scaling=scaling, dropout=dropout, position_bias=position_bias, **kwargs)
    if head is None:
        return entmax_attention_forward(*dense, attention_mask, **options)

    keys = _per_query_head(key, head.groups)  # (b, h, m, d)
    allowed = _allowed_pairs(attention_mask, b, n, m, query.device)  # (b, 1 | h, n, m)
    if whole_causal:  # every key valid: no need to read the n × m pairs
        k_valid = torch.ones(b, m, dtype=torch.bool, device=query.device)
    else:
        k_valid = _valid_keys(attention_mask, allowed)  # (b, m)
    q_offset = m - n if head.self_attention else 0  # cached keys before this step's queries
    if head.self_attention:
        q_valid = k_valid[:, q_offset:]
    else:  # cross-attention: the decoder's padding is not in the encoder mask
        q_valid = torch.ones(b, n, dtype=torch.bool, device=query.device)

    alpha = attention_alpha(module)
    # what a kernel needs: whole sequences (no cache), no additive bias, one α, no dropout; the bucketed
    # kernel takes no padding mask (causal rows of real queries never reach right padding)
    whole = (
        q_offset == 0
        and position_bias is None
        and isinstance(alpha, float)
        and not (module.training and dropout > 0.0)
    )
    key_index = None
    if isinstance(head.predictor, IndexerPredictor):
        key_index = head.cached_key_index(key)  # (b, h, m, r) or None
        indexed = (
            whole
            and not head.measuring  # counting needs the graph, which the kernel never builds
            and m >= INDEXED_MIN_KEYS
            and alpha == float(head.predictor.alpha)
            and not head.window
            and not head.global_tokens
        )
        if indexed:
            values = _per_query_head(value, head.groups)
            output = _indexed_forward(head, query, keys, values, k_valid, alpha, scaling, key_index)
            return output.transpose(1, 2).contiguous(), None
        if head.certified:  # exact: dense α-entmax over every allowed pair, its support is what is attended
            output, probs = entmax_attention_forward(*dense, attention_mask, **options)
            if head.measuring:
                head.record_graph(probs > 0, allowed, q_valid)
            return output, probs

    prediction = head.predict(query, keys, q_valid, k_valid, allowed, scaling, key_index)
    use_kernel = whole and prediction.is_buckets and (head.causal or bool(k_valid.all()))
    graph = None
    if not use_kernel or head.measuring:
        graph = head.graph(prediction, allowed, q_offset)  # (b, h, n, m)
        if head.measuring:
            head.record_graph(graph.expand(-1, query.shape[1], -1, -1), allowed, q_valid)
    if not use_kernel:
        return entmax_attention_forward(*dense, graph, **options)
    output = bucketed_attention(  # the kernel reads grouped keys and values where they are
        query,
        key,
        value,
        prediction.q_buckets,
        prediction.k_buckets,
        alpha=alpha,
        causal=head.causal,
        window=head.window,
        global_tokens=head.global_tokens,
        scale=scaling,
    )  # (b, h, n, d)
    return output.transpose(1, 2).contiguous(), None


# -- configuration ---------------------------------------------------------------------------------------


def sparsefinder_heads(model: nn.Module) -> list[SparsefinderHead]:
    """Every :class:`SparsefinderHead` of ``model``, in layer order."""
    return sorted(
        (m for m in model.modules() if isinstance(m, SparsefinderHead)), key=lambda head: head.layer
    )


def check_spec(spec: Mapping[str, Any]) -> Predictor:
    """The predictor ``spec`` names, after one-line checks of every field against the attention kind."""
    kind = spec["kind"]
    if kind not in KINDS:
        raise UserError(f"sparsefinder kind {kind!r} is unknown; allowed: {', '.join(KINDS)}")
    predictor = make_predictor(spec["predictor"], **spec["knobs"])
    if predictor.scope not in MODEL_SCOPES[kind]:
        raise UserError(
            f"predictor {predictor.name} cannot run inside a model's {kind} attention: its graph depends on "
            f"the whole {predictor.scope}, which a decoder does not have while generating; allowed there: "
            "predictors of scope " + " or ".join(MODEL_SCOPES[kind])
        )
    try:
        window_radius(spec["window"])
    except ValueError as err:
        raise UserError(f"sparsefinder {err}") from None
    if isinstance(spec["global_tokens"], bool) or not isinstance(spec["global_tokens"], int):
        raise UserError(f"sparsefinder global tokens must be an integer >= 0; got {spec['global_tokens']!r}")
    if spec["global_tokens"] < 0:
        raise UserError(f"sparsefinder global tokens must be an integer >= 0; got {spec['global_tokens']}")
    if kind == "cross" and (spec["window"] or spec["global_tokens"]):
        raise UserError(
            "cross-attention has no shared positions for a window or global tokens; "
            "allowed there: window 0 and global tokens 0"
        )
    if predictor.needs_projections and spec["projections"] is None:
        raise UserError(f"predictor {predictor.name} works on projected queries and keys; give projections")
    certified = spec.get("certified", False)
    if not isinstance(certified, bool):
        raise UserError(f"sparsefinder certified must be true or false; got {certified!r}")
    if certified and not isinstance(predictor, IndexerPredictor):
        raise UserError(
            f"certified (exact) attention needs a threshold to prune against; allowed with predictor "
            f"indexer, not {predictor.name}"
        )
    return predictor


def attach_sparsefinder(
    model: PreTrainedModel,
    spec: Mapping[str, Any],
    projections: Mapping[int, HeadProjections] | None = None,
    states: Mapping[int, Mapping[str, Tensor]] | None = None,
) -> list[SparsefinderHead]:
    """Give the attention modules of ``spec["kind"]`` their :class:`SparsefinderHead` and record ``spec``.

    ``spec``: ``{"kind", "predictor", "knobs", "window", "global_tokens", "projections" (HeadProjections
    config or None), "state_shapes" ({name: shape}), "certified" (bool; absent in folders written before
    it existed, meaning false)}``. ``projections`` and ``states`` give each layer's
    tensors; without them the heads get uninitialised tensors of the recorded shapes, for
    ``load_state_dict`` to fill (this is how a saved model is rebuilt).
    """
    check_spec(spec)
    modules = attention_layers(model, attention_kind(spec["kind"]))
    heads = []
    for layer, module in enumerate(modules):
        if projections is not None:
            layer_projections = projections[layer]
        elif spec["projections"] is not None:
            layer_projections = HeadProjections(**spec["projections"])
        else:
            layer_projections = None
        if states is not None:
            state = dict(states[layer])
        else:
            state = {name: torch.empty(shape) for name, shape in spec["state_shapes"].items()}
        head = SparsefinderHead(
            make_predictor(spec["predictor"], **spec["knobs"]),  # one per layer: it holds the layer's state
            layer,
            spec["kind"],
            window=spec["window"],
            global_tokens=spec["global_tokens"],
            projections=layer_projections,
            state=state,
            certified=spec.get("certified", False),
            groups=getattr(module, "num_key_value_groups", 1),
        )
        device = next(module.parameters()).device
        setattr(module, SPARSEFINDER, head.to(device))
        heads.append(head)
    mark_stateless(model, SPARSEFINDER)
    model.config.sparsefinder = dict(spec)
    return heads


def attach_predictor(
    model: PreTrainedModel,
    predictor: Predictor,
    *,
    kind: str = "decoder_self",
    window: int = 0,
    global_tokens: int = 0,
    projections: Mapping[int, HeadProjections] | None = None,
    certified: bool = False,
) -> list[SparsefinderHead]:
    """:func:`attach_sparsefinder` for a predictor (fitted state included) and each layer's projections;
    ``certified``: exact α-entmax, the predictor only deciding what is skipped (the τ-indexer)."""
    if not predictor.needs_projections:
        projections = None
    layers = sorted(projections) if projections else range(len(attention_layers(model, attention_kind(kind))))
    states = {layer: predictor.layer_state(layer) for layer in layers} if predictor.fitted else None
    spec = {
        "kind": kind,
        "predictor": predictor.name,
        "knobs": predictor.knobs(),
        "window": window,
        "global_tokens": global_tokens,
        "projections": projections[min(projections)].config() if projections else None,
        "state_shapes": {name: list(t.shape) for name, t in states[min(states)].items()} if states else {},
        "certified": certified,
    }
    return attach_sparsefinder(model, spec, projections, states)


def _attach_if_configured(model: PreTrainedModel) -> None:
    spec = getattr(model.config, SPARSEFINDER, None)
    if spec is not None and not sparsefinder_heads(model):
        attach_sparsefinder(model, spec)


def _generation_cache(model: PreTrainedModel) -> Cache | None:
    """A cache in which τ-indexer heads keep their keys' projections
    (:mod:`pipeline.attention.indexer_cache`); None for other models, and for encoder self-attention, which
    runs once."""
    spec = getattr(model.config, SPARSEFINDER, None)
    if spec is None or spec["kind"] == "encoder_self":
        return None
    heads = {
        module.layer_idx: head
        for module in attention_layers(model, attention_kind(spec["kind"]))
        if isinstance(head := getattr(module, SPARSEFINDER, None), SparsefinderHead)
        and isinstance(head.predictor, IndexerPredictor)
    }
    return indexer_cache(model.config, spec["kind"], heads) if heads else None


def register_sparsefinder() -> None:
    """Make ``attn_implementation="sparsefinder"`` available to every model using the attention interface."""
    register_attention(SPARSEFINDER, sparsefinder_attention_forward, skip_causal=True)
    register_state_attacher(SPARSEFINDER, _attach_if_configured)
    register_generation_cache(SPARSEFINDER, _generation_cache)


register_sparsefinder()
