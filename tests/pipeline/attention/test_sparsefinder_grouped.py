"""Bucket predictors in a Llama with grouped keys: the bucketed kernel reads the key/value heads the query
heads share, never copies of them, and attends the same graph as the dense path."""

from __future__ import annotations

import torch

import pipeline.attention.sparsefinder as sparsefinder
from pipeline.attention import entmax_attention_forward
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_sparsefinder, sparsefinder_attention_forward
from pipeline.projection.model import HeadProjections
from tests.pipeline.attention.test_sparsefinder_indexed import (
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    causal_mask,
    llama,
)

RANK, BUCKETS, N = 4, 6, 40


def kmeans_llama():
    """A tiny α = 1.5 Llama (4 query heads over 2 key/value heads) with random k-means heads, top-2."""
    model = llama(SPARSEFINDER)
    generator = torch.Generator().manual_seed(2)
    projections = {
        layer: HeadProjections(HEADS, HEAD_DIM, RANK, generator=generator) for layer in range(LAYERS)
    }
    states = {
        layer: {"centroids": torch.randn(HEADS, BUCKETS, RANK, generator=generator)}
        for layer in range(LAYERS)
    }
    spec = {
        "kind": "decoder_self",
        "predictor": "kmeans",
        "knobs": {"buckets": BUCKETS, "top_k": 2},
        "window": 3,
        "global_tokens": 0,
        "projections": projections[0].config(),
        "state_shapes": {"centroids": [HEADS, BUCKETS, RANK]},
    }
    attach_sparsefinder(model, spec, projections, states)
    return model


def test_the_kernel_reads_shared_key_value_heads_and_equals_the_dense_path(monkeypatch) -> None:
    module = kmeans_llama().model.layers[0].self_attn
    seen = []
    kernel = sparsefinder.bucketed_attention

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.shape[1], k.shape[1], v.shape[1]))
        return kernel(q, k, v, *args, **kwargs)

    monkeypatch.setattr(sparsefinder, "bucketed_attention", spy)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, HEADS, N, HEAD_DIM, generator=g)
    k, v = (torch.randn(2, KV_HEADS, N, HEAD_DIM, generator=g) for _ in range(2))
    mask = causal_mask(2, N)
    with torch.no_grad():
        out, probs = sparsefinder_attention_forward(module, q, k, v, mask, scaling=0.4)
    assert probs is None and seen == [(HEADS, KV_HEADS, KV_HEADS)]  # the kernel ran on the shared heads
    head = module.sparsefinder
    valid = torch.ones(2, N, dtype=torch.bool)
    keys = k.repeat_interleave(HEADS // KV_HEADS, dim=1)  # each query head's keys, for the predictor
    graph = head.graph(head.predict(q, keys, valid, valid, mask, 0.4), mask, 0)
    assert 0 < graph.float().mean() < mask.float().mean()  # really sparse, really attending
    expected, _ = entmax_attention_forward(module, q, k, v, graph, scaling=0.4)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_gradients_reach_the_shared_heads_as_on_the_dense_path() -> None:
    module = kmeans_llama().model.layers[0].self_attn
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, HEADS, N, HEAD_DIM, generator=g, requires_grad=True)
    k, v = (torch.randn(1, KV_HEADS, N, HEAD_DIM, generator=g, requires_grad=True) for _ in range(2))
    mask = causal_mask(1, N)
    out, _ = sparsefinder_attention_forward(module, q, k, v, mask, scaling=0.4)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    head = module.sparsefinder
    valid = torch.ones(1, N, dtype=torch.bool)
    with torch.no_grad():
        keys = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        graph = head.graph(head.predict(q, keys, valid, valid, mask, 0.4), mask, 0)
    expected, _ = entmax_attention_forward(module, q, k, v, graph, scaling=0.4)
    for ours, dense in zip(grads, torch.autograd.grad(expected.square().sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(ours, dense, rtol=1e-4, atol=1e-5)
