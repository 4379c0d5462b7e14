"""α-entmax attention through the transformers attention interface.

Exactness against the entmax package, masks, cached decoding, half precision, learned α.
"""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15, entmax_bisect
from transformers import (
    AttentionInterface,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function

from pipeline.attention import (
    ENTMAX,
    LearnedAlpha,
    attach_learned_alpha,
    attention_modules,
    boolean_attention_mask,
    entmax_attention_forward,
    entmax_normalize,
    load_model,
    model_skeleton,
)
from pipeline.attention.interface import causal_or_given, causal_skipping_mask
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from tests.tiny import standard_marian, word_tokenizer

VOCAB = 40


def marian(alpha: float = 1.5, init_std: float = 0.5, **overrides) -> MarianMTModel:
    """A tiny Marian; a large init_std gives peaked scores, hence visibly sparse entmax attention."""
    return standard_marian(vocab=VOCAB, alpha=alpha, init_std=init_std, **overrides)


def llama(alpha: float = 1.5) -> LlamaForCausalLM:
    """A tiny Llama with grouped keys/values (4 query heads share 2 key/value heads)."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.5,
        pad_token_id=0,
    )
    config.entmax_alpha = alpha
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation=ENTMAX).eval()


def source_batch() -> dict[str, torch.Tensor]:
    """Two source sentences (the second padded after 5 tokens) and two targets (the second padded after 4)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(2, VOCAB, (2, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    decoder_input_ids = torch.randint(2, VOCAB, (2, 6), generator=generator)
    decoder_attention_mask = torch.ones_like(decoder_input_ids)
    decoder_attention_mask[1, 4:] = 0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": decoder_attention_mask,
    }


def dense_entmax(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """Reference α-entmax of one vector straight from the entmax package."""
    if alpha == 1.0:
        return torch.softmax(z, dim=-1)
    if alpha == 1.5:
        return entmax15(z, dim=-1)
    return entmax_bisect(z, alpha, dim=-1, n_iter=100)


def reference_probs(scores: torch.Tensor, allowed: torch.Tensor, alpha: float) -> torch.Tensor:
    """Entmax of each row over its allowed keys only (truncation, no masking), zeros elsewhere."""
    probs = torch.zeros_like(scores)
    for b, h, i in torch.cartesian_prod(*(torch.arange(n) for n in scores.shape[:3])).tolist():
        keep = allowed[b, i]
        if keep.any():
            probs[b, h, i, keep] = dense_entmax(scores[b, h, i, keep], alpha)
    return probs


def record_attention_calls(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, dict, tuple]]:
    """Record (name, module, inputs, outputs) of every attention module call."""
    calls = []
    for name, module in attention_modules(model):

        def hook(module, args, kwargs, output, name=name):
            inputs = {"hidden_states": args[0] if args else kwargs["hidden_states"], **kwargs}
            calls.append((name, module, inputs, output))

        module.register_forward_hook(hook, with_kwargs=True)
    return calls


def test_entmax_is_registered_with_both_interfaces():
    assert ENTMAX in AttentionInterface().valid_keys()
    assert ENTMAX in AttentionMaskInterface._global_mapping


@pytest.mark.parametrize("alpha", [1.5, 1.25, 2.0])
def test_marian_matches_dense_entmax_over_valid_keys(alpha):
    model = marian(alpha)
    calls = record_attention_calls(model)
    batch = source_batch()
    with torch.no_grad():
        model(**batch)
    source = batch["attention_mask"].bool()
    target = batch["decoder_attention_mask"].bool()
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert len(calls) == 2 + 2 * 2
    for name, module, inputs, (output, probs) in calls:
        if ".encoder." in name:
            allowed = source[:, None, :].expand(2, 7, 7)
        elif name.endswith("encoder_attn"):
            allowed = source[:, None, :].expand(2, 6, 7)
        else:
            allowed = target[:, None, :] & causal
        hidden = inputs["hidden_states"]
        states = inputs.get("key_value_states")
        states = hidden if states is None else states
        heads, d = module.num_heads, module.head_dim
        q = module.q_proj(hidden).view(2, hidden.shape[1], heads, d).transpose(1, 2)
        k = module.k_proj(states).view(2, states.shape[1], heads, d).transpose(1, 2)
        v = module.v_proj(states).view(2, states.shape[1], heads, d).transpose(1, 2)
        expected = reference_probs(q @ k.transpose(-1, -2) * module.scaling, allowed, alpha)
        torch.testing.assert_close(probs, expected, atol=1e-5, rtol=1e-4)
        assert torch.equal(probs > 0, expected > 0) or alpha != 1.5, name
        expected_out = module.out_proj((expected @ v).transpose(1, 2).reshape(2, hidden.shape[1], -1))
        torch.testing.assert_close(output, expected_out, atol=1e-5, rtol=1e-4)


def test_probabilities_are_exactly_sparse_and_sum_to_one_over_valid_keys():
    model = marian(1.5)
    batch = source_batch()
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    source = batch["attention_mask"].bool()
    for probs in out.encoder_attentions + out.cross_attentions:
        assert probs.dtype == torch.float32
        assert (probs.masked_select(source[:, None, None, :]) == 0).any()  # exact zeros among valid keys
        assert (probs.masked_select(~source[:, None, None, :]) == 0).all()
        torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    for probs in out.decoder_attentions:
        assert (probs.masked_select(causal) == 0).any()
        assert (probs.masked_select(~causal) == 0).all()
        torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))


@pytest.mark.parametrize("family", ["marian", "t5", "gpt2", "llama"])
@pytest.mark.parametrize("reference", ["sdpa", "eager"])
def test_alpha_one_equals_softmax_implementations(family, reference):
    torch.manual_seed(0)
    batch = source_batch()
    if family == "marian":
        model = marian(alpha=1.0, init_std=0.1)
    elif family == "t5":
        config = T5Config(
            vocab_size=VOCAB,
            d_model=16,
            d_kv=8,
            d_ff=32,
            num_layers=2,
            num_heads=2,
            decoder_start_token_id=0,
            pad_token_id=0,
        )
        config.entmax_alpha = 1.0
        model = T5ForConditionalGeneration._from_config(config, attn_implementation=ENTMAX).eval()
    else:
        if family == "gpt2":
            config = GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=64)
            config.entmax_alpha = 1.0
            model = GPT2LMHeadModel._from_config(config, attn_implementation=ENTMAX).eval()
        else:
            model = llama(alpha=1.0)
        batch = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        ours = model(**batch).logits
        model.set_attn_implementation(reference)
        theirs = model(**batch).logits
    assert model.config._attn_implementation == reference
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_marian_incremental_decoding_equals_full_forward():
    model = marian(1.5)
    batch = source_batch()
    decoder_input_ids = batch["decoder_input_ids"]
    with torch.no_grad():
        full = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_input_ids,
        ).logits
        encoder_outputs = model.get_encoder()(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        )
        past, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=batch["attention_mask"],
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            steps.append(out.logits)
        cached = model.generate(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            max_new_tokens=6,
            do_sample=False,
            num_beams=1,
            use_cache=True,
        )
        uncached = model.generate(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            max_new_tokens=6,
            do_sample=False,
            num_beams=1,
            use_cache=False,
        )
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    assert torch.equal(cached, uncached)


def test_llama_left_padded_incremental_decoding_equals_full_forward():
    model = llama(1.5)
    input_ids = torch.randint(2, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0  # left padding, as for batched generation
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask).logits
        prefix = model(input_ids=input_ids[:, :5], attention_mask=attention_mask[:, :5], use_cache=True)
        past, steps = prefix.past_key_values, [prefix.logits]
        for t in range(5, 8):
            out = model(
                input_ids=input_ids[:, t : t + 1],
                attention_mask=attention_mask[:, : t + 1],
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            steps.append(out.logits)
    # Left-padding queries attend to nothing: their rows are zeros, not NaN, and compare like the rest.
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(full).all()


def test_mask_function_always_materializes_a_boolean_mask():
    mask = boolean_attention_mask(
        batch_size=2,
        q_length=4,
        kv_length=4,
        mask_function=causal_mask_function,
        attention_mask=None,
        allow_is_causal_skip=True,
    )
    assert mask.dtype == torch.bool
    assert torch.equal(mask[0, 0], torch.ones(4, 4, dtype=torch.bool).tril())


def test_the_causal_skipping_mask_is_none_only_for_whole_causal_sequences():
    """None for as many queries as keys, no offset, no padding, the causal skip allowed; a boolean mask
    otherwise. causal_or_given reads that None back as the causal mask for a causal module only."""
    base = dict(
        batch_size=2, q_length=4, kv_length=4, mask_function=causal_mask_function, allow_is_causal_skip=True
    )
    assert causal_skipping_mask(**base, attention_mask=torch.ones(2, 4, dtype=torch.bool)) is None
    padded = torch.ones(2, 4, dtype=torch.bool)
    padded[1, 0] = False
    for changed in (
        {"attention_mask": padded},
        {"allow_is_causal_skip": False},  # what create_bidirectional_mask and packed sequences pass
        {"q_length": 1},  # a decoding step
        {"q_offset": 3, "kv_length": 7},
        {"local_size": 2},
    ):
        mask = causal_skipping_mask(**(base | changed))
        assert isinstance(mask, torch.Tensor) and mask.dtype == torch.bool, changed
    causal, other = torch.nn.Module(), torch.nn.Module()
    causal.is_causal, other.is_causal = True, False
    read = causal_or_given(causal, None, 4, 4, torch.device("cpu"))
    assert torch.equal(read, torch.ones(1, 1, 4, 4, dtype=torch.bool).tril())
    assert causal_or_given(other, None, 4, 4, torch.device("cpu")) is None  # bidirectional: everything
    assert causal_or_given(causal, None, 1, 4, torch.device("cpu")) is None  # one query sees every key
    assert causal_or_given(causal, padded, 4, 4, torch.device("cpu")) is padded


def random_attention_inputs(dtype: torch.dtype, scale: float = 3.0):
    generator = torch.Generator().manual_seed(2)
    q, k, v = (scale * torch.randn(2, 3, 5, 8, generator=generator) for _ in range(3))
    allowed = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    allowed[1, :, :, 3:] = False
    allowed[1, :, 4, :] = False  # a query that may attend to nothing
    return q.to(dtype), k.to(dtype), v.to(dtype), allowed


def test_mask_forms_agree_and_empty_rows_give_zeros():
    module = torch.nn.Module().eval()
    q, k, v, allowed = random_attention_inputs(torch.float32)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    out_bool, probs_bool = entmax_attention_forward(module, q, k, v, allowed)
    out_float, probs_float = entmax_attention_forward(module, q, k, v, additive)
    torch.testing.assert_close(probs_float, probs_bool)
    torch.testing.assert_close(out_float, out_bool)
    assert (probs_bool[1, :, 4] == 0).all() and (out_bool[1, 4] == 0).all()
    assert torch.isfinite(probs_bool).all()
    _, probs_none = entmax_attention_forward(module, q, k, v, None)
    _, probs_all = entmax_attention_forward(module, q, k, v, torch.ones_like(allowed))
    torch.testing.assert_close(probs_none, probs_all)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_give_no_nan(dtype):
    module = torch.nn.Module().eval()
    q, k, v, allowed = random_attention_inputs(dtype, scale=30.0)  # scores beyond the fp16 range
    out, probs = entmax_attention_forward(module, q, k, v, allowed)
    assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(probs).all()
    out32, probs32 = entmax_attention_forward(module, q.float(), k.float(), v.float(), allowed)
    torch.testing.assert_close(probs, probs32)
    torch.testing.assert_close(out.float(), out32, atol=0.3, rtol=2e-2)


def test_float64_inputs_are_computed_in_float64_and_pass_a_strict_gradcheck():
    module = torch.nn.Module().eval()
    q, k, v, allowed = random_attention_inputs(torch.float64, scale=1.0)
    out, probs = entmax_attention_forward(module, q, k, v, allowed)
    assert out.dtype == probs.dtype == torch.float64
    assert (probs[0] == 0).any()  # sparse: the gradcheck crosses exact zeros, away from support changes
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: entmax_attention_forward(module, q, k, v, allowed)[0], (q, k, v), eps=1e-6, atol=1e-8
    )


def test_dropout_acts_on_probabilities_in_training_only():
    module = torch.nn.Module()
    q, k, v, allowed = random_attention_inputs(torch.float32)
    _, probs = entmax_attention_forward(module.eval(), q, k, v, allowed, dropout=0.5)
    torch.manual_seed(0)
    _, dropped = entmax_attention_forward(module.train(), q, k, v, allowed, dropout=0.5)
    kept = dropped > 0
    assert kept.any() and (kept & (probs > 0)).sum() < (probs > 0).sum()
    torch.testing.assert_close(dropped[kept], 2 * probs[kept])


def test_excluded_keys_and_empty_rows_get_zeros_and_finite_gradients():
    excluded = torch.tensor([[False, False, True, False, True, False], [True] * 6])
    scores = torch.randn(2, 6, generator=torch.Generator().manual_seed(3))
    scores = scores.masked_fill(excluded, float("-inf")).requires_grad_(True)
    for alpha in (1.0, 1.5, 2.0, 1.7, torch.tensor([[1.3], [1.3]])):
        probs = entmax_normalize(scores, alpha)
        assert (probs[0, excluded[0]] == 0).all()
        torch.testing.assert_close(probs[0].sum(), torch.tensor(1.0))
        assert torch.equal(probs[1], torch.zeros(6))
        (probs * torch.arange(6.0)).sum().backward()
        assert torch.isfinite(scores.grad).all()
        scores.grad = None


def test_invalid_alpha_is_rejected():
    module = torch.nn.Module()
    module.config = MarianConfig()
    module.config.entmax_alpha = 0.5
    q, k, v, allowed = random_attention_inputs(torch.float32)
    with pytest.raises(ValueError, match="entmax_alpha"):
        entmax_attention_forward(module, q, k, v, allowed)


def test_learned_alpha_gets_gradients_and_survives_save_and_load(tmp_path):
    model = marian(1.5)
    names = attach_learned_alpha(model)
    assert len(names) == 2 + 2 * 2 and model.config.entmax_learn_alpha
    alphas = [module.entmax_alpha for _, module in attention_modules(model)]
    assert all(isinstance(alpha, LearnedAlpha) for alpha in alphas)
    torch.testing.assert_close(alphas[0](), torch.full((1, 2, 1, 1), 1.5))

    batch = source_batch()
    labels = batch["decoder_input_ids"].masked_fill(batch["decoder_attention_mask"] == 0, -100)
    model.train()
    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()
    for alpha in alphas:
        assert alpha.theta.grad is not None and torch.isfinite(alpha.theta.grad).all()
        assert alpha.theta.grad.abs().sum() > 0
    with torch.no_grad():
        for alpha in alphas:
            alpha.theta.add_(torch.linspace(-1.0, 1.0, alpha.theta.numel()))

    model.eval()
    save_checkpoint(tmp_path, model, word_tokenizer(VOCAB), {})
    restored = load_model(tmp_path)
    assert type(restored) is MarianMTModel and restored.config._attn_implementation == ENTMAX
    for (name, module), (_, restored_module) in zip(
        attention_modules(model), attention_modules(restored), strict=True
    ):
        assert torch.equal(module.entmax_alpha.theta, restored_module.entmax_alpha.theta), name
    with torch.no_grad():
        torch.testing.assert_close(restored(**batch).logits, model(**batch).logits)
        # from_pretrained drops the learned α: refuse to run rather than fall back to the fixed α.
        dropped = MarianMTModel.from_pretrained(tmp_path, attn_implementation=ENTMAX)
        with pytest.raises(RuntimeError, match="learned entmax alpha"):
            dropped(**batch)


def test_load_model_rejects_a_checkpoint_that_does_not_match(tmp_path):
    model = marian(1.5)
    model.config.entmax_learn_alpha = True  # the config asks for a learned α the weights do not hold
    save_checkpoint(tmp_path, model, word_tokenizer(VOCAB), {})
    with pytest.raises(UserError, match=r"missing .*entmax_alpha"):
        load_model(tmp_path, MarianMTModel)


def test_model_skeleton_has_the_loaded_models_modules_and_reads_no_weights(tmp_path):
    model = marian(1.5)
    attach_learned_alpha(model)
    save_checkpoint(tmp_path, model, word_tokenizer(VOCAB), {})
    loaded = load_model(tmp_path)
    (tmp_path / "model.safetensors").unlink()  # the skeleton needs the config alone
    skeleton = model_skeleton(tmp_path)
    assert type(skeleton) is MarianMTModel and skeleton.config._attn_implementation == ENTMAX
    shapes = {name: p.shape for name, p in skeleton.named_parameters()}
    assert shapes == {name: p.shape for name, p in loaded.named_parameters()}  # learned α included
    assert all(p.is_meta for p in skeleton.parameters())
