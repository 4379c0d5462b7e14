"""Sparsefinder attention in a model: sparse-consistency, cached decoding, the kernel path, save/reload."""

from __future__ import annotations

import pytest
import torch
from transformers import MarianMTModel

import pipeline.attention.sparsefinder as sparsefinder
from pipeline.attention import ENTMAX, entmax_attention_forward, load_model
from pipeline.attention.counting import measure_sparsity
from pipeline.attention.sparsefinder import (
    SPARSEFINDER,
    attach_sparsefinder,
    sparsefinder_attention_forward,
    sparsefinder_heads,
)
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from pipeline.projection.model import HeadProjections
from tests.tiny import padded_batch, tiny_marian, word_tokenizer

VOCAB, HEADS, HEAD_DIM, RANK, LAYERS = 40, 4, 8, 4, 2
UNPROJECTED = ("window", "indexer")  # predictors that read the teacher's queries and keys directly


def teacher(attn_implementation: str = ENTMAX) -> MarianMTModel:
    """A tiny α-entmax Marian whose peaked initial scores make its attention visibly sparse."""
    return tiny_marian(
        vocab=VOCAB,
        d_model=HEADS * HEAD_DIM,
        encoder_layers=1,
        decoder_layers=LAYERS,
        encoder_heads=2,
        decoder_heads=HEADS,
        attn_implementation=attn_implementation,
    )


def spec(
    predictor: str,
    knobs: dict | None = None,
    *,
    window: int = 0,
    global_tokens: int = 0,
    shapes=None,
    projector: dict | None = None,
):
    projector = projector or {}
    return {
        "kind": "decoder_self",
        "predictor": predictor,
        "knobs": knobs or {},
        "window": window,
        "global_tokens": global_tokens,
        "projections": (
            None if predictor in UNPROJECTED else HeadProjections(HEADS, HEAD_DIM, RANK, **projector).config()
        ),
        "state_shapes": shapes or {},
    }


def sparsefinder_model(
    predictor: str, knobs: dict | None = None, *, buckets: int = 4, projector: dict | None = None, **pattern
):
    """The teacher's weights with a sparsefinder head in decoder self-attention (random projections, linear
    unless ``projector`` names other HeadProjections options)."""
    model = teacher()
    sparse = teacher(SPARSEFINDER)
    sparse.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(1)
    projections = {
        layer: HeadProjections(HEADS, HEAD_DIM, RANK, generator=generator, **(projector or {}))
        for layer in range(LAYERS)
    }
    # random fitted tensors of the fitted predictors: k-means centroids, Reformer rotations (r × β/2),
    # the indexer's rank-r maps of queries and keys
    index_rank = (knobs or {}).get("rank", 8)
    shapes = {
        "kmeans": {"centroids": [HEADS, buckets, RANK]},
        "reformer": {"rotations": [HEADS, RANK, (knobs or {}).get("buckets", 4) // 2]},
        "indexer": {"q_map": [HEADS, index_rank, HEAD_DIM], "k_map": [HEADS, index_rank, HEAD_DIM]},
    }.get(predictor)
    states = None
    if shapes is not None:
        states = {
            layer: {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
            for layer in range(LAYERS)
        }
    attach_sparsefinder(
        sparse,
        spec(predictor, knobs, shapes=shapes, projector=projector, **pattern),
        None if predictor in UNPROJECTED else projections,
        states,
    )
    return model, sparse.eval()


def batch() -> dict[str, torch.Tensor]:
    return padded_batch(VOCAB)


def real_logits(model, inputs) -> torch.Tensor:
    """Logits at real target positions only (padded positions are never scored)."""
    with torch.no_grad():
        logits = model(**inputs).logits
    return logits[inputs["decoder_attention_mask"].bool()]


@pytest.mark.parametrize(
    ("predictor", "knobs", "pattern"),
    [
        ("kmeans", {"buckets": 1}, {}),  # one bucket holds every token: through the kernel
        ("window", {}, {"window": 25}),  # a window wider than the sentence: the mask path
        ("distance", {"threshold": 1e9}, {}),
        ("indexer", {"rank": 2, "margin": 1e9}, {}),  # a margin wider than any score gap keeps every key
    ],
)
def test_recall_one_predictor_reproduces_the_teacher(predictor, knobs, pattern):
    model, sparse = sparsefinder_model(predictor, knobs, buckets=1, **pattern)
    inputs = batch()
    torch.testing.assert_close(real_logits(sparse, inputs), real_logits(model, inputs), rtol=1e-5, atol=1e-5)
    generate = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=10)
    assert torch.equal(sparse.generate(**generate, num_beams=3), model.generate(**generate, num_beams=3))


def test_a_sparse_predictor_changes_the_output_only_where_it_drops_gold_keys():
    model, sparse = sparsefinder_model("kmeans", {"buckets": 4})
    inputs = batch()
    assert not torch.allclose(real_logits(sparse, inputs), real_logits(model, inputs), atol=1e-3)


@pytest.mark.parametrize(
    ("predictor", "knobs", "pattern"),
    [
        ("kmeans", {"buckets": 4, "top_k": 2}, {"window": 3}),
        ("kmeans", {"buckets": 4}, {"global_tokens": 2}),
        ("distance", {"threshold": 1.0}, {"window": 1}),
        ("reformer", {"buckets": 4}, {}),
        ("indexer", {"rank": 2, "margin": 0.05}, {}),  # each step's threshold from its row of cached keys
    ],
)
def test_cached_decoding_equals_uncached(predictor, knobs, pattern):
    _, sparse = sparsefinder_model(predictor, knobs, **pattern)
    inputs = batch()
    generate = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=12)
    greedy = dict(generate, num_beams=1, do_sample=False, output_scores=True, return_dict_in_generate=True)
    cached = sparse.generate(**greedy, use_cache=True)
    uncached = sparse.generate(**greedy, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    for step_cached, step_uncached in zip(cached.scores, uncached.scores, strict=True):
        torch.testing.assert_close(step_cached, step_uncached, rtol=1e-5, atol=1e-5)
    assert torch.equal(
        sparse.generate(**generate, num_beams=3, use_cache=True),
        sparse.generate(**generate, num_beams=3, use_cache=False),
    )


def test_kernel_path_equals_dense_entmax_over_the_same_graph():
    _, sparse = sparsefinder_model("kmeans", {"buckets": 3, "top_k": 2}, window=3, global_tokens=1)
    module = sparse.get_decoder().layers[0].self_attn
    head = module.sparsefinder
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, HEADS, 11, HEAD_DIM, generator=g) for _ in range(3))
    causal = torch.ones(11, 11, dtype=torch.bool).tril()[None, None].expand(2, 1, 11, 11)
    out, probs = sparsefinder_attention_forward(module, q, k, v, causal, scaling=0.3)
    assert probs is None  # the kernel ran
    valid = torch.ones(2, 11, dtype=torch.bool)
    graph = head.graph(head.predict(q, k, valid, valid, causal, 0.3), causal, 0)
    assert 0 < graph.float().mean() < causal.float().mean()  # really sparse, really attending
    expected, _ = entmax_attention_forward(module, q, k, v, graph, scaling=0.3)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_measured_sparsity_counts_the_graphs_used():
    _, sparse = sparsefinder_model("window", window=1)  # the diagonal alone: one key per query
    inputs = batch()
    with measure_sparsity(sparse) as measured, torch.no_grad():
        sparse(**inputs)
    lengths = inputs["decoder_attention_mask"].sum(-1).tolist()  # 12 and 8 real target tokens
    expected = 1 - sum(lengths) / sum(n * (n + 1) // 2 for n in lengths)
    assert measured["sparsity"] == pytest.approx(expected)
    assert len(measured["per_layer_head"]) == LAYERS and len(measured["per_layer_head"][0]) == HEADS
    assert all(not head.measuring for head in sparsefinder_heads(sparse))


@pytest.mark.parametrize("projector", [{}, {"shared": True, "hidden": 6}], ids=["linear", "shared-mlp"])
def test_save_and_reload_keeps_every_head(tmp_path, projector):
    _, sparse = sparsefinder_model("kmeans", {"buckets": 4, "top_k": 2}, window=3, projector=projector)
    save_checkpoint(tmp_path, sparse, word_tokenizer(VOCAB), {})
    reloaded = load_model(tmp_path, attn_implementation=SPARSEFINDER)
    heads = sparsefinder_heads(reloaded)
    assert [h.layer for h in heads] == [0, 1]
    assert heads[0].predictor.describe() == sparsefinder_heads(sparse)[0].predictor.describe()
    for before, after in zip(sparsefinder_heads(sparse), heads, strict=True):
        assert torch.equal(before.state_centroids, after.state_centroids)
        assert before.projections.config() == after.projections.config()
        for name, tensor in before.projections.state_dict().items():
            assert torch.equal(tensor, after.projections.state_dict()[name])
    inputs = batch()
    torch.testing.assert_close(real_logits(reloaded, inputs), real_logits(sparse, inputs))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"predictor": "bigbird", "knobs": {}}, "bigbird cannot run inside a model's decoder_self attention"),
        ({"predictor": "quantization", "knobs": {}}, "depends on the whole sentence"),
        ({"window": 4}, "window must be 0 .none. or an odd size"),
        ({"global_tokens": -1}, "global tokens must be an integer >= 0"),
        ({"knobs": {"buckets": 4, "depth": 2}}, "predictor kmeans has no knob depth"),
        ({"kind": "cross", "window": 3}, "cross-attention has no shared positions"),
        ({"projections": None}, "works on projected queries and keys"),
    ],
)
def test_bad_configurations_fail_in_one_line(changes, message):
    bad = {**spec("kmeans", {"buckets": 4}, shapes={"centroids": [HEADS, 4, RANK]}), **changes}
    with pytest.raises(UserError, match=message) as err:
        attach_sparsefinder(teacher(SPARSEFINDER), bad)
    assert "\n" not in str(err.value)


def test_quantization_with_one_bin_in_encoder_self_attention_reproduces_the_teacher():
    """One bin per dimension holds every real source token, so the graph is every valid pair of the padded
    batch, in both directions: the sparse model's logits are the teacher's, and its head attended them all."""
    encoder_spec = {**spec("quantization", {"bins": 1}), "kind": "encoder_self"}
    encoder_spec["projections"] = HeadProjections(2, HEAD_DIM * 2, RANK).config()
    model = teacher()
    sparse = teacher(SPARSEFINDER)
    sparse.load_state_dict(model.state_dict())
    heads = attach_sparsefinder(sparse, encoder_spec)
    assert len(heads) == 1 and heads[0].causal is False
    with torch.no_grad():
        for head in heads:
            for p in head.projections.parameters():
                p.normal_()
    inputs = batch()
    with measure_sparsity(sparse) as measured:
        logits = real_logits(sparse, inputs)
    assert measured["sparsity"] == 0.0  # the head ran, on every valid pair
    torch.testing.assert_close(logits, real_logits(model, inputs), rtol=1e-5, atol=1e-5)


def test_valid_keys_are_read_once_per_mask_and_forgotten_with_it():
    """Every layer gets the model's one mask: the keys some query may see are computed from its n × m pairs
    once, for as long as the mask lives."""
    mask = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 6).clone()
    mask[1, :, :, :2] = False  # two padding keys in the second sequence
    first = sparsefinder._valid_keys(mask, mask)
    assert first.tolist() == [[True] * 6, [False, False, True, True, True, True]]
    assert sparsefinder._valid_keys(mask, mask) is first  # the same mask: not recomputed
    assert sparsefinder._valid_keys(mask, mask[..., :4]).shape == (2, 4)  # another key count: its own entry
    entries = len(sparsefinder._VALID_KEYS)
    del mask
    assert len(sparsefinder._VALID_KEYS) == entries - 1
