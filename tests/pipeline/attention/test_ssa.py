"""SSA attention in a model: causality, own keys, dense limits, shared draws, seeds, save/reload, errors."""

from __future__ import annotations

import pytest
import torch
from transformers import MarianMTModel

from pipeline.attention import ENTMAX, load_model
from pipeline.attention.ssa import (
    SSA,
    SSAHead,
    attach_ssa,
    sampling,
    set_sampling,
    ssa_attention_forward,
    ssa_heads,
)
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from tests.tiny import dropout_free_marian, padded_batch, teacher_and_student, word_tokenizer

VOCAB, LAYERS = 40, 2
BOTH = ["encoder_self", "decoder_self"]
UNBIASED = {"mode": "unbiased", "keys": 3, "kinds": BOTH}
LOCAL = {"mode": "local", "windows": 3, "sigma": [1.0, 4.0], "kinds": BOTH}


def marian(attn_implementation: str = SSA, alpha: float = 1.5) -> MarianMTModel:
    """A tiny Marian without dropout, so train mode differs from eval only by SSA's sampling."""
    return dropout_free_marian(
        vocab=VOCAB,
        attn_implementation=attn_implementation,
        alpha=alpha,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
    )


def ssa_model(spec: dict, alpha: float = 1.5) -> tuple[MarianMTModel, MarianMTModel]:
    """(the dense α-entmax teacher, the same weights with SSA heads)."""
    teacher, student = teacher_and_student(vocab=VOCAB, attn_implementation=SSA, alpha=alpha)
    attach_ssa(student, spec)
    return teacher, student


def batch() -> dict[str, torch.Tensor]:
    return padded_batch(VOCAB)


def logits(model: MarianMTModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def record_draws(monkeypatch) -> list[tuple[SSAHead, torch.Tensor]]:
    """Every (head, sources) drawn from now on."""
    draws = []
    original = SSAHead.draw

    def draw(self, n, m):
        positions, sources = original(self, n, m)
        draws.append((self, sources))
        return positions, sources

    monkeypatch.setattr(SSAHead, "draw", draw)
    return draws


def probabilities(module, n: int, m: int, mask: torch.Tensor | None, batch_size: int = 2, heads: int = 3):
    """(b, h, n, m) attention probabilities of one sampled call: the values are one-hot rows, so the output
    of query i is its probability row."""
    g = torch.Generator().manual_seed(5)
    query = torch.randn(batch_size, heads, n, m, generator=g)
    key = torch.randn(batch_size, heads, m, m, generator=g)
    value = torch.eye(m).expand(batch_size, heads, m, m)
    output, _ = ssa_attention_forward(module, query, key, value, mask, scaling=1.0)
    return output.transpose(1, 2)


def causal_mask(batch_size: int, n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(batch_size, 1, n, n)


@pytest.mark.parametrize("alpha", [1.5, 1.0], ids=["entmax15", "softmax"])
@pytest.mark.parametrize(
    "spec",
    [
        {"mode": "unbiased", "keys": 64, "kinds": BOTH},  # more keys than any sentence: every key
        {"mode": "local", "windows": 1, "sigma": [1e6, 1e6], "kinds": BOTH},  # one window: every key
    ],
    ids=["all-keys", "one-window"],
)
def test_all_keys_or_one_window_equals_dense_attention(spec, alpha):
    teacher, student = ssa_model(spec, alpha)
    inputs = batch()
    real = inputs["decoder_attention_mask"].bool()
    with sampling(student, seed=0):
        sampled = logits(student, inputs)
        generate = dict(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        generated = student.generate(**generate, num_beams=2, max_new_tokens=8)  # cached decoding steps
    torch.testing.assert_close(sampled[real], logits(teacher, inputs)[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(generated, teacher.generate(**generate, num_beams=2, max_new_tokens=8))


@pytest.mark.parametrize("spec", [UNBIASED, LOCAL], ids=["unbiased", "local"])
def test_a_target_never_sees_later_targets(spec):
    _, student = ssa_model(spec)
    inputs = batch()
    changed = dict(inputs, decoder_input_ids=inputs["decoder_input_ids"].clone())
    changed["decoder_input_ids"][:, 6:] = torch.randint(2, VOCAB, (2, 6), generator=torch.Generator())
    with sampling(student, seed=1):
        before = logits(student, inputs)
    with sampling(student, seed=1):
        after = logits(student, changed)
    torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, 6:], before[:, 6:])


@pytest.mark.parametrize(
    "spec",
    [
        {"mode": "unbiased", "keys": 1, "kinds": ["decoder_self"]},
        {"mode": "local", "windows": 4, "sigma": [3.0, 3.0], "kinds": ["decoder_self"]},
    ],
    ids=["one-key", "local"],
)
@pytest.mark.parametrize("given_mask", [True, False], ids=["model-mask", "no-mask"])
def test_every_target_keeps_itself_and_only_earlier_drawn_keys(monkeypatch, spec, given_mask):
    _, student = ssa_model(spec, alpha=1.0)  # softmax: every allowed key gets some probability
    module = student.get_decoder().layers[0].self_attn.train()
    draws = record_draws(monkeypatch)
    n = 10
    # causal by itself: the head knows its kind, whatever mask the model passes
    probs = probabilities(module, n, n, causal_mask(2, n) if given_mask else None)  # (b, h, n, m)
    ((head, sources),) = draws
    assert head is module.ssa
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, n))
    diagonal = probs.diagonal(dim1=-2, dim2=-1)  # (b, h, n)
    assert (diagonal > 0).all()
    assert (probs.triu(diagonal=1) == 0).all()
    support = probs > 0
    drawn = torch.zeros(n, n, dtype=torch.bool)  # query i may see the keys of its window, or the subset
    for i in range(n):
        keys = sources[i // sources.shape[-1]] if spec["mode"] == "local" else sources[0]
        drawn[i, keys[keys < n]] = True
    assert not (support & ~(drawn | torch.eye(n, dtype=torch.bool))).any()


def test_a_cached_step_attends_its_own_draw_and_itself(monkeypatch):
    spec = {"mode": "local", "windows": 3, "sigma": [2.0, 2.0], "kinds": ["decoder_self"]}
    _, student = ssa_model(spec, alpha=1.0)
    module = student.get_decoder().layers[1].self_attn
    draws = record_draws(monkeypatch)
    m = 10  # the step's query is position 9, in the last window [8, 10) of width 4
    with sampling(student, seed=3):
        probs = probabilities(module, 1, m, torch.ones(2, 1, 1, m, dtype=torch.bool))[:, :, 0]  # (b, h, m)
    ((_, sources),) = draws
    assert sources.shape == (1, 4) and (sources[0, :2] == m).all()  # two sources, two empty slots
    assert (probs[..., m - 1] > 0).all()
    allowed = torch.zeros(m, dtype=torch.bool)
    allowed[sources[sources < m]] = True
    allowed[m - 1] = True
    assert (probs[..., ~allowed] == 0).all() and (probs[..., allowed] > 0).all()


@pytest.mark.parametrize("spec", [UNBIASED, LOCAL], ids=["unbiased", "local"])
def test_one_draw_serves_every_head_and_row(monkeypatch, spec):
    _, student = ssa_model(spec, alpha=1.0)
    module = student.get_encoder().layers[0].self_attn.train()
    draws = record_draws(monkeypatch)
    probs = probabilities(module, 9, 9, None)  # (b, h, n, m) bidirectional, no padding
    ((_, sources),) = draws
    support = probs > 0
    assert (support == support[:1, :1]).all()  # the same keys for every batch row and head
    if spec["mode"] == "unbiased":
        expected = torch.zeros(9, dtype=torch.bool)
        expected[sources[0]] = True
        assert (support[0, 0] == expected).all()  # exactly the k drawn keys for every query
        assert int(support[0, 0, 0].sum()) == spec["keys"]
    else:
        for i in range(9):  # query i attends the sources of its window of 3
            window = sources[i // 3]
            assert set(support[0, 0, i].nonzero().flatten().tolist()) == set(window.tolist())


def test_draws_differ_across_layers_and_steps(monkeypatch):
    _, student = ssa_model(UNBIASED)
    student.train()
    draws = record_draws(monkeypatch)
    torch.manual_seed(0)
    student(**batch())
    first = list(draws)
    student(**batch())
    second = draws[len(first) :]
    assert [head for head, _ in first] == ssa_heads(student)  # one draw per layer and call
    assert [head for head, _ in second] == ssa_heads(student)
    for step in (first, second):
        assert not torch.equal(step[0][1], step[1][1])  # encoder layers 0 and 1
        assert not torch.equal(step[2][1], step[3][1])  # decoder layers 0 and 1
    assert all(not torch.equal(a, b) for (_, a), (_, b) in zip(first, second, strict=True))


@pytest.mark.parametrize("spec", [UNBIASED, LOCAL], ids=["unbiased", "local"])
def test_gradients_reach_the_projections_while_training(spec):
    _, student = ssa_model(spec)
    student.train()
    inputs = batch()
    labels = inputs["decoder_input_ids"].masked_fill(inputs["decoder_attention_mask"] == 0, -100)
    student(**inputs, labels=labels).loss.backward()
    for layer in [*student.get_encoder().layers, *student.get_decoder().layers]:
        for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            grad = projection.weight.grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_eval_is_dense_and_training_samples_until_switched_off():
    teacher, student = ssa_model(UNBIASED)
    inputs = batch()
    dense = logits(teacher, inputs)
    assert torch.equal(logits(student, inputs), dense)
    assert torch.equal(logits(student, inputs), dense)
    student.train()
    assert not torch.allclose(logits(student, inputs), dense, atol=1e-3)
    set_sampling(student, False)  # dense fine-tuning
    assert torch.equal(logits(student, inputs), dense)
    set_sampling(student, True)
    assert not torch.allclose(logits(student, inputs), dense, atol=1e-3)


@pytest.mark.parametrize("spec", [UNBIASED, LOCAL], ids=["unbiased", "local"])
def test_a_seeded_sampled_pass_is_reproducible(spec):
    teacher, student = ssa_model(spec)
    inputs = batch()
    with sampling(student, seed=7):
        first = logits(student, inputs)
    with sampling(student, seed=7):
        again = logits(student, inputs)
    with sampling(student, seed=8):
        other = logits(student, inputs)
    assert torch.equal(first, again)
    assert not torch.allclose(first, other, atol=1e-3)
    assert torch.equal(logits(student, inputs), logits(teacher, inputs))  # dense again after the block


def test_save_and_reload_rebuilds_the_heads(tmp_path):
    _, student = ssa_model(LOCAL)
    save_checkpoint(tmp_path / "ssa", student, word_tokenizer(VOCAB), {"stage": "test"})
    reloaded = load_model(tmp_path / "ssa", attn_implementation=SSA)
    assert reloaded.config.ssa == student.config.ssa == {**LOCAL, "keys": None}
    assert [h.extra_repr() for h in ssa_heads(reloaded)] == [h.extra_repr() for h in ssa_heads(student)]
    inputs = batch()
    assert torch.equal(logits(reloaded, inputs), logits(student.eval(), inputs))
    samples = []
    for model in (student, reloaded):
        with sampling(model, seed=4):
            samples.append(logits(model, inputs))
    assert torch.equal(*samples)
    dense = load_model(tmp_path / "ssa", attn_implementation=ENTMAX)  # an SSA-trained model, plain α-entmax
    assert not ssa_heads(dense)
    assert torch.equal(logits(dense, inputs), logits(student, inputs))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mode": "random"}, "ssa mode 'random' is unknown; allowed: unbiased, local"),
        ({"mode": "unbiased", "keys": 0}, "ssa keys must be an integer >= 1; got 0"),
        ({"mode": "unbiased", "keys": True}, "ssa keys must be an integer >= 1; got True"),
        ({"windows": 2.5}, "ssa windows must be an integer >= 1; got 2.5"),
        (
            {"sigma": [1.0, 0.0]},
            r"ssa sigma must be a list of finite numbers > 0, one per layer; got \[1.0, 0.0\]",
        ),
        ({"sigma": 2.0}, "ssa sigma must be a list of finite numbers > 0"),
        ({"sigma": [1.0, 2.0, 3.0]}, "ssa sigma has 3 values but encoder_self has 2 layers"),
        ({"kinds": ["cross"]}, r"ssa kinds must be a non-empty list .* \(cross-attention stays dense\)"),
        ({"kinds": []}, "ssa kinds must be a non-empty list"),
        ({"window": 3}, "ssa has no setting 'window'; allowed: mode, keys, windows, sigma, kinds"),
    ],
)
def test_bad_settings_fail_in_one_line(changes, message):
    with pytest.raises(UserError, match=message) as err:
        attach_ssa(marian(), {**LOCAL, **changes})
    assert "\n" not in str(err.value)


def test_heads_need_the_ssa_implementation():
    with pytest.raises(ValueError, match="attn_implementation='ssa'"):
        attach_ssa(marian(ENTMAX), UNBIASED)
    with pytest.raises(UserError, match="has no SSA heads"):
        set_sampling(marian(), False)


def test_local_draws_stay_near_their_window_and_causal_ones_never_reach_past_its_end():
    positions, sources = SSAHead("local", 0, causal=True, windows=3, sigma=1e-3).draw(10, 10)
    assert positions.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # windows of ⌈10/3⌉ = 4
    assert sources.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [10, 10, 8, 9]]  # 10 = an empty slot
    _, sources = SSAHead("local", 0, causal=False, windows=3, sigma=1e-3).draw(10, 10)
    assert sources.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 10]]
    torch.manual_seed(0)
    spread = SSAHead("local", 0, causal=True, windows=3, sigma=100.0)
    reached = set()
    for _ in range(20):
        _, sources = spread.draw(10, 10)
        for window, (start, end) in zip(sources, [(0, 4), (4, 8), (8, 10)], strict=True):
            drawn = window[window < 10]
            assert len(set(drawn.tolist())) == len(drawn) == end - start  # e − s distinct sources
            assert (drawn < end).all()
        reached.update(sources[2][sources[2] < 10].tolist())
    assert min(reached) < 4  # a wide σ reaches far back


def test_unbiased_draws_distinct_keys():
    torch.manual_seed(0)
    positions, sources = SSAHead("unbiased", 0, causal=False, keys=4).draw(9, 9)
    assert positions.tolist() == [list(range(9))]
    assert sources.shape == (1, 4) and len(set(sources[0].tolist())) == 4 and (sources < 9).all()
    _, step = SSAHead("unbiased", 0, causal=True, keys=4).draw(1, 6)  # a cached step at position 5
    assert step.shape == (1, 4) and (step < 6).all()
