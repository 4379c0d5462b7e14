"""SAMSA attention: exact causal picks, dense limit, per-head subsets, counting, gradients, memory, reload."""

from __future__ import annotations

import pytest
import torch
from transformers import MarianMTModel

from pipeline.attention import ENTMAX, entmax_normalize, load_model
from pipeline.attention.counting import measure_sparsity
from pipeline.attention.samsa import (
    CHUNK,
    SAMSA,
    SAMSAHead,
    attach_samsa,
    samsa_attention_forward,
    samsa_heads,
)
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from tests.largest import largest_tensor
from tests.tiny import dropout_free_marian, padded_batch, teacher_and_student, word_tokenizer

VOCAB = 40
BOTH = ["encoder_self", "decoder_self"]
SPEC = {"keys": 3, "temperature": 1.0, "kinds": BOTH}
KIND = {False: "encoder_self", True: "decoder_self"}


def marian(attn_implementation: str = SAMSA, alpha: float = 1.5) -> MarianMTModel:
    """A tiny Marian without dropout, so train mode differs from eval only by SAMSA's Gumbel noise."""
    return dropout_free_marian(vocab=VOCAB, attn_implementation=attn_implementation, alpha=alpha)


def samsa_model(spec: dict = SPEC, alpha: float = 1.5) -> tuple[MarianMTModel, MarianMTModel]:
    """(the dense α-entmax teacher, the same weights with SAMSA heads)."""
    teacher, student = teacher_and_student(vocab=VOCAB, attn_implementation=SAMSA, alpha=alpha)
    torch.manual_seed(1)
    attach_samsa(student, spec)
    return teacher, student


def logits(model: MarianMTModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def module_with_head(
    causal: bool, keys: int, alpha: float = 1.5, supports: int | None = None, heads: int = 2
):
    """A real Marian attention module of the kind asked for, carrying a SAMSA head of ``heads`` heads of
    dimension 8 whose supports have nonzero keys and values."""
    model = marian(alpha=alpha)
    part = model.get_decoder() if causal else model.get_encoder()
    module = part.layers[0].self_attn
    torch.manual_seed(2)
    head = SAMSAHead(heads, 8, keys, 0.5, 0, KIND[causal], supports=supports)
    with torch.no_grad():
        head.support_keys.normal_()
        head.support_values.normal_()
    setattr(module, SAMSA, head)
    return module, head


def inputs(b: int, h: int, n: int, m: int, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, rows, 8, generator=g) for rows in (n, m, m))


def padded_mask(causal: bool, n: int, lengths: list[int]) -> torch.Tensor:
    """(b, 1, n, n) boolean mask: right padding at ``lengths``, and j ≤ i when causal."""
    keys = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (b, n)
    mask = keys[:, None, None, :].expand(len(lengths), 1, n, n)
    return mask & torch.ones(n, n, dtype=torch.bool).tril() if causal else mask


def dense_with_supports(module, head, q, k, v, mask, causal: bool) -> torch.Tensor:
    """α-entmax over every allowed key with the supports appended to the keys and values: (b, n, h, d)."""
    b, _, n, _ = q.shape
    m = k.shape[-2]
    s = head.support_keys.shape[1]
    keys = torch.cat([k, head.support_keys.detach().expand(b, -1, -1, -1)], dim=-2)
    values = torch.cat([v, head.support_values.detach().expand(b, -1, -1, -1)], dim=-2)
    if mask is None:
        mask = torch.ones(1, 1, n, m, dtype=torch.bool)
        if causal:
            mask = mask & (torch.arange(m) <= torch.arange(m - n, m)[:, None])
    mask = torch.cat([mask, torch.ones(*mask.shape[:3], s, dtype=torch.bool)], dim=-1)
    scores = (q @ keys.transpose(-1, -2) * 8**-0.5).masked_fill(~mask, float("-inf"))
    probs = entmax_normalize(scores, float(module.config.entmax_alpha))
    return (probs @ values).transpose(1, 2)


def naive_picks(head, k: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """(b, h, n, m + s) bool: the pool entries each query picks, query by query over its whole pool."""
    b, h, m, _ = k.shape
    with torch.no_grad():
        z = torch.cat([head.importance(k), head.support_scores.expand(b, -1, -1)], dim=-1)
    picked = torch.zeros(b, h, n, z.shape[-1], dtype=torch.bool)
    for i in range(n):
        pool = z.clone()
        if causal:
            pool[..., m - n + i + 1 : m] = float("-inf")
        picked[:, :, i].scatter_(-1, pool.topk(head.keys, dim=-1).indices, True)
    return picked


def naive_output(module, head, q, k, v, causal: bool) -> torch.Tensor:
    """Each query attends exactly its naive picks with the module's α: (b, n, h, d)."""
    b, _, n, _ = q.shape
    keys = torch.cat([k, head.support_keys.detach().expand(b, -1, -1, -1)], dim=-2)
    values = torch.cat([v, head.support_values.detach().expand(b, -1, -1, -1)], dim=-2)
    picked = naive_picks(head, k, n, causal)
    scores = (q @ keys.transpose(-1, -2) * 8**-0.5).masked_fill(~picked, float("-inf"))
    return (entmax_normalize(scores, float(module.config.entmax_alpha)) @ values).transpose(1, 2)


def forward(module, q, k, v, mask=None) -> torch.Tensor:
    return samsa_attention_forward(module, q, k, v, mask)[0]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_chunked_picks_equal_each_querys_own_top_k_over_its_whole_pool(causal):
    module, head = module_with_head(causal, keys=4)
    module.eval()
    n = 2 * CHUNK + 22  # three chunks: the running top carries over chunk borders
    q, k, v = inputs(1, 2, n, n)
    with torch.no_grad():
        torch.testing.assert_close(forward(module, q, k, v), naive_output(module, head, q, k, v, causal))


@pytest.mark.parametrize("alpha", [1.5, 1.0], ids=["entmax15", "softmax"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_k_at_least_the_pool_is_dense_attention_with_the_supports_appended(causal, alpha, training):
    module, head = module_with_head(causal, keys=64, alpha=alpha, supports=3)
    module.train(training)
    n = 10
    q, k, v = inputs(2, 2, n, n)
    mask = padded_mask(causal, n, [10, 6])
    expected = dense_with_supports(module, head, q, k, v, mask, causal)
    torch.testing.assert_close(forward(module, q, k, v, mask), expected, rtol=1e-5, atol=1e-6)
    no_mask = dense_with_supports(module, head, q, k, v, None, causal)  # causal by itself
    torch.testing.assert_close(forward(module, q, k, v), no_mask, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_a_cached_step_picks_exactly_what_the_uncached_pass_picks(causal):
    module, _ = module_with_head(causal, keys=4)
    module.eval()
    m = CHUNK + 30
    q, k, v = inputs(1, 2, m, m)
    with torch.no_grad():
        full = forward(module, q, k, v)
        for t in (0, 5, m - 7, m - 1):  # one query at position t over keys 0 … t
            step = forward(module, q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1])
            if causal:
                torch.testing.assert_close(step, full[:, t : t + 1], rtol=1e-5, atol=1e-6)
        tail = forward(module, q[:, :, m - 5 :], k, v)  # the last 5 queries over every key
    torch.testing.assert_close(tail, full[:, m - 5 :], rtol=1e-5, atol=1e-6)


def test_each_head_picks_its_own_k_keys():
    module, head = module_with_head(False, keys=3, alpha=1.0, heads=4)  # softmax: every pick gets mass
    module.eval()
    with torch.no_grad():
        head.support_scores.fill_(-1e4)  # tokens always win, so every pick is a token
    n = 8  # the head dimension: one-hot values
    q, k, _ = inputs(1, 4, n, n)
    one_hot = torch.eye(n).expand(1, 4, n, n)  # output row = the query's probabilities over the keys
    with torch.no_grad():
        head.support_values.zero_()
        probs = forward(module, q, k, one_hot).transpose(1, 2)  # (b, h, n, m)
    picked = probs[0] > 0  # (h, n, m)
    assert (picked.sum(-1) == 3).all()
    assert (picked == picked[:, :1]).all()  # bidirectional: one subset for every query of a head
    subsets = {tuple(row.nonzero().flatten().tolist()) for row in picked[:, 0]}
    assert len(subsets) > 1  # the heads chose differently
    assert torch.equal(picked[:, 0], naive_picks(head, k, n, causal=False)[0, :, 0, :n])


def test_causal_picks_never_reach_a_later_key():
    module, head = module_with_head(True, keys=3, alpha=1.0)
    module.eval()
    with torch.no_grad():
        head.support_scores.fill_(-1e4)
        head.support_values.zero_()
    n = 8  # the head dimension: one-hot values
    q, k, _ = inputs(1, 2, n, n)
    with torch.no_grad():
        probs = forward(module, q, k, torch.eye(n).expand(1, 2, n, n)).transpose(1, 2)[0]  # (h, n, m)
    assert (probs.triu(diagonal=1) == 0).all()
    assert (((probs > 0).sum(-1)) == torch.arange(1, n + 1).clamp(max=3)).all()  # min(i + 1, k) keys


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_pair_counts_are_the_picked_token_pairs_of_real_queries(causal):
    module, head = module_with_head(causal, keys=3)
    module.eval()
    with torch.no_grad():
        head.support_scores.fill_(-1e4)  # supports are never picked here (they would not count)
    n, lengths = 9, [9, 6]
    q, k, v = inputs(2, 2, n, n)
    with measure_sparsity(module) as result, torch.no_grad():
        forward(module, q, k, v, padded_mask(causal, n, lengths))
    if causal:  # query i may see i + 1 keys and attends min(i + 1, k) of them
        valid = sum(i + 1 for length in lengths for i in range(length))
        attended = sum(min(i + 1, 3) for length in lengths for i in range(length))
    else:  # every real query sees its row's real keys and attends k of them
        valid = sum(length * length for length in lengths)
        attended = sum(length * 3 for length in lengths)
    assert head.valid.tolist() == [valid, valid] and head.attended.tolist() == [attended, attended]
    assert result["sparsity"] == pytest.approx(1 - attended / valid)


def test_a_target_never_sees_later_targets_in_training_or_evaluation():
    _, student = samsa_model()
    inputs_ = padded_batch(VOCAB)
    changed = dict(inputs_, decoder_input_ids=inputs_["decoder_input_ids"].clone())
    changed["decoder_input_ids"][:, 6:] = torch.randint(2, VOCAB, (2, 6), generator=torch.Generator())
    for training in (True, False):
        student.train(training)
        torch.manual_seed(5)
        before = logits(student, inputs_)
        torch.manual_seed(5)
        after = logits(student, changed)
        torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=1e-6)
        assert not torch.allclose(after[:, 6:], before[:, 6:])


def test_evaluation_is_deterministic_and_training_draws_noise():
    _, student = samsa_model()
    inputs_ = padded_batch(VOCAB)
    first = logits(student, inputs_)
    assert torch.equal(logits(student, inputs_), first)
    student.train()
    torch.manual_seed(0)
    noisy = logits(student, inputs_)
    torch.manual_seed(1)
    assert not torch.allclose(logits(student, inputs_), noisy, atol=1e-4)


def test_cached_generation_scores_like_the_uncached_pass():
    _, student = samsa_model({"keys": 2, "temperature": 1.0, "kinds": BOTH})
    batch = padded_batch(VOCAB)
    source = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    out = student.generate(
        **source, num_beams=1, do_sample=False, max_new_tokens=10, min_new_tokens=10, output_logits=True,
        return_dict_in_generate=True,
    )  # fmt: skip
    steps = torch.stack(out.logits, dim=1)  # (b, 10, vocab) from cached decoding steps
    uncached = logits(student, dict(source, decoder_input_ids=out.sequences[:, :-1]))
    torch.testing.assert_close(steps, uncached, rtol=1e-4, atol=1e-4)


def test_straight_through_gradients_reach_the_scorers_and_the_supports():
    _, student = samsa_model({"keys": 8, "temperature": 1.0, "kinds": BOTH}, alpha=1.0)
    student.train()
    batch = padded_batch(VOCAB)
    labels = batch["decoder_input_ids"].masked_fill(batch["decoder_attention_mask"] == 0, -100)
    torch.manual_seed(0)
    student(**batch, labels=labels).loss.backward()
    for head in samsa_heads(student):
        for name, parameter in head.named_parameters():
            grad = parameter.grad
            assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name


def test_forward_and_backward_never_build_anything_n_by_n():
    n = 4096
    for causal in (False, True):
        module, head = module_with_head(causal, keys=8)
        module.train()
        q, k, v = (x.requires_grad_(True) for x in inputs(1, 2, n, n))
        with largest_tensor() as largest:
            forward(module, q, k, v).sum().backward()
        assert largest.numel < n * n // 8, (causal, largest.op, largest.numel)
        assert head.score_weight.grad.abs().sum() > 0 and k.grad.abs().sum() > 0


def test_only_the_configured_kinds_get_heads_and_cross_attention_stays_dense():
    teacher, student = samsa_model({"keys": 64, "temperature": 1.0, "kinds": ["decoder_self"]})
    assert [head.kind for head in samsa_heads(student)] == ["decoder_self", "decoder_self"]
    batch = padded_batch(VOCAB)
    with torch.no_grad():
        encoded = student.get_encoder()(batch["input_ids"], attention_mask=batch["attention_mask"])
        expected = teacher.get_encoder()(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert torch.equal(encoded.last_hidden_state, expected.last_hidden_state)


def test_save_and_reload_rebuilds_the_heads(tmp_path):
    _, student = samsa_model()
    with torch.no_grad():  # trained-looking supports, so a reload that re-initialised them would show
        for head in samsa_heads(student):
            head.support_values.normal_()
    save_checkpoint(tmp_path / "samsa", student, word_tokenizer(VOCAB), {"stage": "test"})
    reloaded = load_model(tmp_path / "samsa", attn_implementation=SAMSA)
    assert reloaded.config.samsa == student.config.samsa == SPEC
    assert [h.extra_repr() for h in samsa_heads(reloaded)] == [h.extra_repr() for h in samsa_heads(student)]
    batch = padded_batch(VOCAB)
    assert torch.equal(logits(reloaded, batch), logits(student.eval(), batch))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"keys": 0}, "samsa keys must be an integer >= 1; got 0"),
        ({"keys": True}, "samsa keys must be an integer >= 1; got True"),
        ({"keys": 2.0}, "samsa keys must be an integer >= 1; got 2.0"),
        ({"temperature": 0.0}, "samsa temperature must be a finite number > 0; got 0.0"),
        ({"temperature": float("inf")}, "samsa temperature must be a finite number > 0; got inf"),
        ({"temperature": "1"}, "samsa temperature must be a finite number > 0; got '1'"),
        ({"kinds": ["cross"]}, r"samsa kinds must be a non-empty list .* \(cross-attention stays dense\)"),
        ({"kinds": []}, "samsa kinds must be a non-empty list"),
        ({"kinds": ["decoder_self", "decoder_self"]}, "samsa kinds must be a non-empty list of distinct"),
        ({"k": 3}, "samsa has no setting 'k'; allowed: keys, temperature, kinds"),
    ],
)
def test_bad_settings_fail_in_one_line(changes, message):
    with pytest.raises(UserError, match=message) as err:
        attach_samsa(marian(), {**SPEC, **changes})
    assert "\n" not in str(err.value)


def test_missing_settings_and_the_wrong_implementation_are_refused():
    with pytest.raises(UserError, match="samsa setting 'temperature' is missing; needed: keys, temperature"):
        attach_samsa(marian(), {"keys": 2, "kinds": BOTH})
    with pytest.raises(UserError, match="samsa settings must be a mapping"):
        attach_samsa(marian(), [2])
    with pytest.raises(ValueError, match="attn_implementation='samsa'"):
        attach_samsa(marian(ENTMAX), SPEC)
