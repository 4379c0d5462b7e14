"""The τ-indexer inside a model on the indexed kernel: approximate mode attends the predictor's Ĝ, certified
mode is the teacher's attention; both in a causal Llama with grouped keys, cached and uncached."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import pipeline.attention.sparsefinder as sparsefinder
from attention_kernels.indexed.attention import index_needed
from pipeline.attention import ENTMAX, entmax_attention_forward, load_model
from pipeline.attention.counting import measure_sparsity
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_sparsefinder, sparsefinder_attention_forward
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from pipeline.predictors.indexer import IndexerPredictor
from tests.tiny import word_tokenizer

VOCAB, HEADS, KV_HEADS, HEAD_DIM, LAYERS, RANK = 50, 4, 2, 16, 2, 4
MAPS = ("q_map", "k_map")


def llama(attn_implementation: str) -> LlamaForCausalLM:
    """A tiny α = 1.5 Llama, 4 query heads sharing 2 key/value heads; a wide init makes attention sparse."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HEADS * HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=1024,
        initializer_range=0.3,
        pad_token_id=0,
    )
    config.entmax_alpha = 1.5
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation=attn_implementation).eval()


def indexer_spec(*, margin: float, certified: bool) -> dict:
    return {
        "kind": "decoder_self",
        "predictor": "indexer",
        "knobs": {"rank": RANK, "margin": margin},
        "window": 0,
        "global_tokens": 0,
        "projections": None,
        "state_shapes": {"q_map": [HEADS, RANK, HEAD_DIM], "k_map": [HEADS, RANK, HEAD_DIM]},
        "certified": certified,
    }


def indexed_llama(*, margin: float = 0.0, certified: bool = False):
    """(the entmax teacher, the same weights with indexer heads whose rank-4 maps are random)."""
    teacher = llama(ENTMAX)
    model = llama(SPARSEFINDER)
    model.load_state_dict(teacher.state_dict())
    generator = torch.Generator().manual_seed(3)
    states = {
        layer: {name: 0.2 * torch.randn(HEADS, RANK, HEAD_DIM, generator=generator) for name in MAPS}
        for layer in range(LAYERS)
    }
    attach_sparsefinder(model, indexer_spec(margin=margin, certified=certified), None, states)
    return teacher, model


def tokens(n: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def causal_mask(b: int, n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(b, 1, n, n)


def attention_inputs(n: int, seed: int = 5) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, HEADS, n, HEAD_DIM, generator=g) * 2
    k, v = (torch.randn(2, KV_HEADS, n, HEAD_DIM, generator=g) * 2 for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])
def test_approximate_kernel_attends_the_predicted_graph(padded):
    """A long row runs the kernel (no probabilities come back) and equals dense entmax over Ĝ."""
    _, model = indexed_llama(margin=0.1)
    module = model.model.layers[0].self_attn
    head = module.sparsefinder
    n = sparsefinder.INDEXED_MIN_KEYS + 37  # awkward: not a multiple of the kernel's blocks
    q, k, v = attention_inputs(n)
    allowed = causal_mask(2, n).clone()
    if padded:  # the second sequence starts after 50 padding tokens, as a batch for generation does
        allowed[1, :, :, :50] = False
    out, probs = sparsefinder_attention_forward(module, q, k, v, allowed, scaling=0.25)
    assert probs is None  # the indexed kernel ran
    keys = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    valid = allowed.any(-2).any(1)
    graph = head.graph(head.predict(q, keys, valid, valid, allowed, 0.25), allowed, 0)
    assert 0.05 < graph.float().mean() / allowed.float().mean() < 0.5  # a real, partial selection
    expected, _ = entmax_attention_forward(module, q, k, v, graph, scaling=0.25)
    # (b, n, h, d) at real queries: a padding query's output is never read
    torch.testing.assert_close(out[valid], expected[valid], rtol=1e-4, atol=1e-5)


def test_certified_kernel_is_dense_entmax_in_values_and_gradients():
    """A random rank-4 indexer with margin 0 misses support keys; certified attention is exact anyway."""
    _, model = indexed_llama(margin=0.0, certified=True)
    module = model.model.layers[1].self_attn
    n = sparsefinder.INDEXED_MIN_KEYS + 11
    q, k, v = (x.requires_grad_() for x in attention_inputs(n, seed=7))
    allowed = causal_mask(2, n)
    out, probs = sparsefinder_attention_forward(module, q, k, v, allowed, scaling=0.25)
    assert probs is None
    (out * torch.linspace(-1, 1, HEAD_DIM)).sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    expected, dense_probs = entmax_attention_forward(module, q, k, v, allowed, scaling=0.25)
    assert (dense_probs[allowed.expand_as(dense_probs)] == 0).float().mean() > 0.5  # sparse, so blocks skip
    (expected * torch.linspace(-1, 1, HEAD_DIM)).sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for grad, x in zip(grads, (q, k, v), strict=True):
        torch.testing.assert_close(grad, x.grad, rtol=1e-4, atol=1e-5)


def test_certified_heads_compute_no_index_where_the_kernel_reads_none(monkeypatch):
    """On CPU the certified mode's kernel scores every pair: the heads skip the indexer's projections; the
    approximate heads compute them."""
    calls = []
    original = IndexerPredictor.index_queries

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(IndexerPredictor, "index_queries", counted)
    skipped = not index_needed(1.5, torch.zeros(1), "certified")
    for certified in (True, False):
        _, model = indexed_llama(certified=certified)
        with torch.no_grad():
            model(input_ids=tokens(sparsefinder.INDEXED_MIN_KEYS + 5, batch=1))
        assert len(calls) == (0 if certified and skipped else LAYERS)
        calls.clear()


def test_certified_model_is_the_teacher_on_every_path():
    """Logits of a long sequence (kernel), of a short one (dense) and greedy generation with a cache."""
    teacher, model = indexed_llama(margin=0.0, certified=True)
    with torch.no_grad():
        for n in (sparsefinder.INDEXED_MIN_KEYS + 5, 40):
            ids = tokens(n)
            torch.testing.assert_close(model(ids).logits, teacher(ids).logits, rtol=1e-4, atol=1e-4)
    prompt = tokens(sparsefinder.INDEXED_MIN_KEYS, batch=1, seed=1)
    generate = dict(max_new_tokens=6, do_sample=False)
    assert torch.equal(model.generate(prompt, **generate), teacher.generate(prompt, **generate))


def test_approximate_uncached_kernel_equals_cached_decoding():
    """The prompt runs on the kernel, every later step on the masked path of its cached row: one Ĝ."""
    _, model = indexed_llama(margin=0.05)
    prompt = tokens(sparsefinder.INDEXED_MIN_KEYS + 3, batch=1, seed=2)
    greedy = dict(max_new_tokens=8, do_sample=False, output_scores=True, return_dict_in_generate=True)
    cached = model.generate(prompt, **greedy, use_cache=True)
    uncached = model.generate(prompt, **greedy, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    for step_cached, step_uncached in zip(cached.scores, uncached.scores, strict=True):
        torch.testing.assert_close(step_cached, step_uncached, rtol=1e-4, atol=1e-4)


def test_certified_heads_count_the_teachers_support():
    teacher, model = indexed_llama(certified=True)
    ids = tokens(30)
    with measure_sparsity(model) as measured, torch.no_grad():
        model(ids)
    expected = []
    with torch.no_grad():
        probs = teacher(ids, output_attentions=True).attentions  # per layer (b, h, n, n)
    allowed = causal_mask(2, 30)
    for layer in probs:
        kept = ((layer > 0) & allowed).sum((0, 2, 3)).double()
        expected.append((1 - kept / allowed.sum((0, 2, 3)).double()).tolist())
    for measured_layer, expected_layer in zip(measured["per_layer_head"], expected, strict=True):
        assert measured_layer == pytest.approx(expected_layer)


def test_certified_survives_save_and_reload(tmp_path):
    _, model = indexed_llama(certified=True)
    save_checkpoint(tmp_path, model, word_tokenizer(VOCAB), {})
    reloaded = load_model(tmp_path, attn_implementation=SPARSEFINDER).eval()
    assert reloaded.config.sparsefinder["certified"] is True
    assert all(layer.self_attn.sparsefinder.certified for layer in reloaded.model.layers)
    ids = tokens(sparsefinder.INDEXED_MIN_KEYS + 1)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)


def test_a_folder_written_before_certified_existed_loads_as_approximate():
    _, model = indexed_llama()
    spec = dict(model.config.sparsefinder)
    del spec["certified"]
    fresh = llama(SPARSEFINDER)
    heads = attach_sparsefinder(fresh, spec)
    assert not any(head.certified for head in heads)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"certified": "yes"}, "certified must be true or false"),
        ({"predictor": "window", "knobs": {}, "state_shapes": {}}, "allowed with predictor indexer"),
    ],
)
def test_bad_certified_settings_fail_in_one_line(changes, message):
    spec = {**indexer_spec(margin=0.0, certified=True), **changes}
    with pytest.raises(UserError, match=message):
        attach_sparsefinder(llama(SPARSEFINDER), spec)
