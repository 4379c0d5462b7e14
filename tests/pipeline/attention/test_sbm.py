"""SBM attention in a model: dense limits, causality, own keys, deterministic and cached evaluation, straight-
through gradients, the density penalty, memory of the fastRG path, save/reload, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM, MarianMTModel

from pipeline.attention import ENTMAX, load_model
from pipeline.attention.interface import loss_penalty
from pipeline.attention.sbm import SBM, SBMHead, attach_sbm, density_penalty, sbm_attention_forward, sbm_heads
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from tests.largest import largest_tensor
from tests.tiny import dropout_free_marian, padded_batch, teacher_and_student, tiny_llama, word_tokenizer

VOCAB = 40
BOTH = ["encoder_self", "decoder_self"]
SPEC = {
    "clusters": 3,
    "kinds": BOTH,
    "density_weight": 0.01,
    "sparse_above": 64,
    "evaluation": "expected",
    "threshold": 0.3,
    "seed": 0,
}
PATHS = {"dense": 64, "fastrg": 1}  # sparse_above: every tiny sentence is short, or long


def marian(attn_implementation: str = SBM, alpha: float = 1.5, **sizes) -> MarianMTModel:
    """A tiny Marian without dropout, so train mode differs from eval only by SBM's sampling."""
    return dropout_free_marian(vocab=VOCAB, attn_implementation=attn_implementation, alpha=alpha, **sizes)


def sbm_model(alpha: float = 1.5, **changes) -> tuple[MarianMTModel, MarianMTModel]:
    """(the dense α-entmax teacher, the same weights with SBM heads)."""
    teacher, student = teacher_and_student(vocab=VOCAB, attn_implementation=SBM, alpha=alpha)
    torch.manual_seed(1)
    attach_sbm(student, {**SPEC, **changes})
    return teacher, student


def logits(model: MarianMTModel, inputs: dict[str, torch.Tensor], seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)  # the training draws
    with torch.no_grad():
        return model(**inputs).logits


def labelled(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    labels = inputs["decoder_input_ids"].masked_fill(inputs["decoder_attention_mask"] == 0, -100)
    return dict(inputs, labels=labels)


def one_hot_probabilities(module, n: int, *, seed: int = 5) -> torch.Tensor:
    """(b, h, n, n) attention probabilities of one call without mask: the values are one-hot rows."""
    g = torch.Generator().manual_seed(seed)
    heads = module.num_heads
    query = torch.randn(2, heads, n, module.head_dim, generator=g)
    key = torch.randn(2, heads, n, module.head_dim, generator=g)
    value = torch.eye(n).expand(2, heads, n, n)
    output, _ = sbm_attention_forward(module, query, key, value, None, scaling=1.0)
    return output.transpose(1, 2)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("alpha", [1.5, 1.0], ids=["entmax15", "softmax"])
def test_every_pair_kept_equals_dense_attention(alpha, path):
    teacher, student = sbm_model(alpha, threshold=1e-6, sparse_above=PATHS[path])  # every p ≥ 1e-6
    inputs = padded_batch(VOCAB)
    real = inputs["decoder_attention_mask"].bool()
    torch.testing.assert_close(
        logits(student, inputs)[real], logits(teacher, inputs)[real], rtol=1e-5, atol=1e-5
    )
    generate = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    assert torch.equal(
        student.generate(**generate, num_beams=2, max_new_tokens=8),
        teacher.generate(**generate, num_beams=2, max_new_tokens=8),
    )


@pytest.mark.parametrize("mode", ["train", "expected", "sampled"])
@pytest.mark.parametrize("path", PATHS)
def test_a_target_never_sees_later_targets(path, mode):
    evaluation = "sampled" if mode == "sampled" else "expected"
    _, student = sbm_model(sparse_above=PATHS[path], evaluation=evaluation)
    student.train(mode == "train")
    inputs = padded_batch(VOCAB)
    changed = dict(inputs, decoder_input_ids=inputs["decoder_input_ids"].clone())
    changed["decoder_input_ids"][:, 6:] = torch.randint(2, VOCAB, (2, 6), generator=torch.Generator())
    before, after = logits(student, inputs), logits(student, changed)
    torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=1e-5)
    assert not torch.allclose(after[:, 6:], before[:, 6:])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", BOTH)
def test_every_query_keeps_itself_and_causal_ones_only_earlier_keys(kind, path):
    _, student = sbm_model(1.0, sparse_above=PATHS[path])  # softmax: every attended key gets probability
    layers = student.get_encoder().layers if kind == "encoder_self" else student.get_decoder().layers
    module = layers[0].self_attn.train()
    n = 12
    torch.manual_seed(0)
    probs = one_hot_probabilities(module, n)
    torch.testing.assert_close(probs.sum(-1), torch.ones(*probs.shape[:3]))
    assert (probs.diagonal(dim1=-2, dim2=-1) > 0).all()
    if kind == "decoder_self":
        assert (probs.triu(diagonal=1) == 0).all()
    else:
        assert (probs.triu(diagonal=1) > 0).any()
    assert (probs == 0).any()  # sampled, not dense


@pytest.mark.parametrize("path", PATHS)
def test_expected_evaluation_keeps_exactly_the_likely_edges(path):
    _, student = sbm_model(1.0, sparse_above=PATHS[path], threshold=0.2)
    module = student.get_encoder().layers[1].self_attn
    head: SBMHead = module.sbm
    n = 10
    probs = one_hot_probabilities(module, n, seed=6)  # eval mode
    g = torch.Generator().manual_seed(6)
    query = torch.randn(2, module.num_heads, n, module.head_dim, generator=g)
    key = torch.randn(2, module.num_heads, n, module.head_dim, generator=g)
    with torch.no_grad():
        rates = head.members(query) @ head.blocks() @ head.members(key).transpose(-1, -2)
    expected = (rates >= 0.2) | torch.eye(n, dtype=torch.bool)
    assert torch.equal(probs > 0, expected)
    assert 0 < int((rates >= 0.2).sum()) < rates.numel()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("evaluation", ["expected", "sampled"])
def test_evaluation_is_deterministic_and_cached_decoding_sees_the_same_graph(evaluation, path):
    _, student = sbm_model(sparse_above=PATHS[path], evaluation=evaluation)
    inputs = padded_batch(VOCAB)
    first = logits(student, inputs, seed=0)
    assert torch.equal(first, logits(student, inputs, seed=1))
    generate = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=8)
    for beams in (1, 2):
        cached = student.generate(**generate, num_beams=beams)
        assert torch.equal(cached, student.generate(**generate, num_beams=beams, use_cache=False))
    if evaluation == "sampled":
        for head in sbm_heads(student):
            head.seed = 1
        assert not torch.allclose(logits(student, inputs), first, atol=1e-3)


def test_training_draws_a_fresh_graph_per_call_seeded_by_torch():
    _, student = sbm_model()
    student.train()
    inputs = padded_batch(VOCAB)
    assert torch.equal(logits(student, inputs, seed=3), logits(student, inputs, seed=3))
    assert not torch.allclose(logits(student, inputs, seed=3), logits(student, inputs, seed=4), atol=1e-3)


@pytest.mark.parametrize("path", PATHS)
def test_straight_through_gradients_reach_the_block_models(path):
    _, student = sbm_model(sparse_above=PATHS[path])
    student.train()
    torch.manual_seed(0)
    student(**labelled(padded_batch(VOCAB))).loss.backward()
    for head in sbm_heads(student):
        for name, parameter in head.named_parameters():
            assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
            assert parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("path", PATHS)
def test_padding_queries_attend_nothing_and_count_no_pairs(path):
    _, student = sbm_model(sparse_above=PATHS[path], threshold=0.01)  # nearly every real pair is kept
    module = student.get_encoder().layers[0].self_attn
    head: SBMHead = module.sbm
    g = torch.Generator().manual_seed(3)
    b, n, real = 2, 7, 4  # row 1 is right-padded after 4 tokens
    query, key, value = (torch.randn(b, module.num_heads, n, module.head_dim, generator=g) for _ in range(3))
    mask = torch.ones(b, 1, n, n, dtype=torch.bool)
    mask[1, :, :, real:] = False  # key padding, as the model's encoder mask spells it
    head.measuring = True
    head.reset_counts()
    output, _ = sbm_attention_forward(module, query, key, value, mask, scaling=1.0)  # eval: expected graph
    assert (output[1, real:] == 0).all() and (output[1, :real] != 0).any()  # (b, n, h, d)
    valid = n * n + real * real  # row 0: every pair; row 1: real queries over real keys only
    assert torch.equal(head.valid, torch.full((module.num_heads,), float(valid), dtype=torch.float64))
    assert (head.attended <= head.valid).all() and (head.attended >= n + real).all()  # own keys at least


def test_the_density_penalty_is_the_weighted_mean_density_of_the_last_training_call():
    _, student = sbm_model(density_weight=0.5)
    inputs = labelled(padded_batch(VOCAB))
    assert loss_penalty(student) is None  # nothing trained yet
    student.train()
    torch.manual_seed(0)
    for head in sbm_heads(student):  # count each head's pairs (measure_sparsity, kept per head)
        head.measuring = True
    student(**inputs)
    densities = torch.cat([head.attended / head.valid for head in sbm_heads(student)])  # per head, all layers
    penalty = loss_penalty(student)
    torch.testing.assert_close(penalty.double(), 0.5 * densities.mean(), rtol=1e-6, atol=0)
    assert 0 < penalty.item() < 0.5
    assert density_penalty(student) is None  # taken once
    penalty.backward()
    clusters = [head.clusters.grad for head in sbm_heads(student)]
    assert all(grad is not None and grad.abs().sum() > 0 for grad in clusters)
    student.eval()
    logits(student, inputs)
    assert density_penalty(student) is None  # evaluation calls give no term
    assert density_penalty(marian(ENTMAX)) is None


def test_the_fastrg_path_builds_nothing_quadratic():
    model = marian(d_model=8, encoder_layers=1, decoder_layers=1, encoder_heads=1, decoder_heads=1)
    torch.manual_seed(0)
    attach_sbm(model, {**SPEC, "kinds": ["encoder_self"]})
    module = model.get_encoder().layers[0].self_attn.train()
    head: SBMHead = module.sbm
    with torch.no_grad():  # memberships near σ(−3): p ≈ 0.002, about ten edges per query
        head.output_weight.mul_(0.1)
        head.output_bias.fill_(-1.0)
        head.clusters.fill_(3 / 8).add_(0.1 * torch.randn_like(head.clusters))
    for n, quadratic in ((4096, False), (1024, True)):  # the dense path is the detector's sanity check
        head.sparse_above = n - 1 if not quadratic else n
        g = torch.Generator().manual_seed(0)
        query, key, value = (torch.randn(1, 1, n, 8, generator=g, requires_grad=True) for _ in range(3))
        with largest_tensor() as largest:
            output, _ = sbm_attention_forward(module, query, key, value, None)
            (output.sum() + density_penalty(model)).backward()
        assert (largest.numel >= n * n // 8) == quadratic, largest.op
        assert head.clusters.grad.abs().sum() > 0 and query.grad.abs().sum() > 0


def test_save_and_reload_rebuilds_the_heads(tmp_path):
    _, student = sbm_model(evaluation="sampled", seed=3)
    save_checkpoint(tmp_path / "sbm", student, word_tokenizer(VOCAB), {"stage": "test"})
    reloaded = load_model(tmp_path / "sbm", attn_implementation=SBM)
    assert reloaded.config.sbm == student.config.sbm == {**SPEC, "evaluation": "sampled", "seed": 3}
    assert [h.extra_repr() for h in sbm_heads(reloaded)] == [h.extra_repr() for h in sbm_heads(student)]
    inputs = padded_batch(VOCAB)
    assert torch.equal(logits(reloaded, inputs), logits(student.eval(), inputs))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"clusters": 0}, "sbm clusters must be an integer >= 1; got 0"),
        ({"clusters": True}, "sbm clusters must be an integer >= 1; got True"),
        ({"sparse_above": 2.5}, "sbm sparse_above must be an integer >= 1; got 2.5"),
        ({"seed": -1}, "sbm seed must be an integer >= 0; got -1"),
        ({"density_weight": -0.1}, "sbm density_weight must be a finite number >= 0; got -0.1"),
        ({"threshold": 0}, r"sbm threshold must be a number in \(0, 1\]; got 0"),
        ({"threshold": 1.5}, r"sbm threshold must be a number in \(0, 1\]; got 1.5"),
        ({"evaluation": "mean"}, "sbm evaluation 'mean' is unknown; allowed: expected, sampled"),
        ({"kinds": ["cross"]}, r"sbm kinds must be a non-empty list .* \(cross-attention stays dense\)"),
        ({"kinds": ["encoder_self", "encoder_self"]}, "sbm kinds must be a non-empty list of distinct"),
        ({"cluster": 3}, "sbm has no setting 'cluster'; allowed: clusters, kinds, density_weight"),
    ],
)
def test_bad_settings_fail_in_one_line(changes, message):
    with pytest.raises(UserError, match=message) as err:
        attach_sbm(marian(), {**SPEC, **changes})
    assert "\n" not in str(err.value)


def test_missing_settings_and_the_implementation_are_required():
    spec = dict(SPEC)
    del spec["seed"]
    with pytest.raises(UserError, match="sbm setting 'seed' is missing; needed: clusters, kinds"):
        attach_sbm(marian(), spec)
    with pytest.raises(ValueError, match="attn_implementation='sbm'"):
        attach_sbm(marian(ENTMAX), SPEC)


def test_a_model_deep_copies_after_a_training_call_and_the_copy_is_the_same_model():
    _, student = sbm_model(evaluation="sampled")
    inputs = labelled(padded_batch(VOCAB))
    student.train()
    torch.manual_seed(0)
    student(**inputs).loss.backward()  # leaves each head's density inside the autograd graph
    copied = copy.deepcopy(student)
    assert all(head.density is None for head in sbm_heads(copied))
    assert all(head.density is not None for head in sbm_heads(student))  # the original keeps its own
    student.eval(), copied.eval()
    torch.testing.assert_close(logits(copied, inputs), logits(student, inputs), rtol=0, atol=0)


def sbm_llama(**changes) -> LlamaForCausalLM:
    """A tiny Llama (grouped key/value heads) with SBM heads in its self-attention, in eval mode."""
    model = tiny_llama(vocab=VOCAB, attn_implementation=SBM)
    attach_sbm(model, {**SPEC, "kinds": ["decoder_self"], **changes})
    return model


def padded(rows: list[torch.Tensor], side: str) -> dict[str, torch.Tensor]:
    """``rows`` padded to one length on ``side``, with the mask and the positions of their real tokens."""
    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[r, span], mask[r, span] = row, 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("evaluation", ["expected", "sampled"])
def test_evaluation_graphs_do_not_depend_on_padding(evaluation, path):
    """A row's evaluation graph, hence its logits, is the same padded on the right, on the left, or
    alone: a longer row in the batch shifts no sample."""
    model = sbm_llama(evaluation=evaluation, sparse_above=PATHS[path], threshold=0.1)
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(2, VOCAB, (length,), generator=g) for length in (11, 6)]
    with torch.no_grad():
        alone = [model(**padded([row], "right")).logits[0] for row in rows]
        for side in ("right", "left"):
            batch = padded(rows, side)
            out = model(**batch).logits
            for r in range(len(rows)):  # tolerance: a batch of another size rounds differently
                real = batch["attention_mask"][r].bool()
                torch.testing.assert_close(out[r][real], alone[r], rtol=1e-4, atol=1e-4)
    if evaluation == "sampled":  # the graph is a draw: another seed changes it
        reseeded = sbm_llama(evaluation=evaluation, sparse_above=PATHS[path], seed=7)
        with torch.no_grad():
            assert not torch.allclose(reseeded(**padded([rows[0]], "right")).logits[0], alone[0], atol=1e-3)
