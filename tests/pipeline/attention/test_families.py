"""Every attention implementation in every model family it claims: one matrix of (family, implementation).

Families: Llama, Qwen2 with grouped-query heads, GPT-2, BERT, T5 and Marian, tiny and random with a large
initialisation, so that α-entmax attention is visibly sparse. Implementations: ``entmax`` everywhere;
``sparsefinder`` (window predictor), ``ssa``, ``sbm`` and ``samsa`` everywhere but T5. The matrix asserts:

1. forward: α-entmax logits equal those of an independent reference attention written here (the ``entmax``
   package's entmax15 over each row's allowed keys); sparsefinder's equal that reference restricted to the
   window band; SSA's in eval mode equal dense α-entmax;
2. padding (decoder-only, BERT): a right- and a left-padded batch give the same logits at real tokens;
3. cache (decoder-only, Marian): greedy generation with and without the cache agree, and cached steps give
   the full forward's logits;
4. backward: finite gradients, nonzero for the query projections and for the attached heads' parameters;
5. save/load: ``load_model`` of a saved folder gives identical logits;
6. α after loading: α ∈ {1, 1.5, 2} gives three different models, α = 1 being eager softmax;

and T5, whose stacks are not laid out like Marian's, is refused in one line by every stateful implementation.
Checks 1 and 2 run in float64 (see :func:`exact`), the others in float32; logits agree within atol 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from entmax import entmax15
from torch import Tensor, nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from pipeline.attention.implementations import (
    attach_learned_alpha,
    attach_predictor,
    attach_samsa,
    attach_sbm,
    attach_ssa,
    load_model,
    make_predictor,
    set_entmax_alpha,
)
from pipeline.attention.interface import attention_modules, register_attention
from pipeline.attention.recording import UnsupportedLayoutError
from pipeline.checkpoint import save_checkpoint

VOCAB, PAD = 40, 0
ENTMAX, SPARSEFINDER, SSA, SBM, SAMSA = "entmax", "sparsefinder", "ssa", "sbm", "samsa"
STATEFUL = (SPARSEFINDER, SSA, SBM, SAMSA)
IMPLEMENTATIONS = (ENTMAX, *STATEFUL)
DECODER_ONLY = ("llama", "qwen2", "gpt2")
SEQ2SEQ = ("t5", "marian")
FAMILIES = (*DECODER_ONLY, "bert", *SEQ2SEQ)
# the self-attention kinds each family's heads go to, and the kind of its sparsefinder predictor
KINDS = {
    **dict.fromkeys(DECODER_ONLY, ("decoder_self",)),
    "bert": ("encoder_self",),
    "t5": ("encoder_self", "decoder_self"),
    "marian": ("encoder_self", "decoder_self"),
}
PREDICTOR_KIND = {
    **dict.fromkeys(DECODER_ONLY, "decoder_self"),
    "bert": "encoder_self",
    "t5": "decoder_self",
    "marian": "decoder_self",
}
WINDOW = 3
# window 3 is the band |i − j| ≤ ⌊3/2⌋ = 1 around each query, in absolute positions
# (attention_kernels/attended.py)
RADIUS = 1
TOLERANCE = dict(atol=1e-5, rtol=1e-4)


# -- the families --------------------------------------------------------------------------------------


def _rotary_decoder(config_class: type, key_value_heads: int) -> Callable[[], Any]:
    """The config maker of a Llama-like decoder (rotary positions) with ``key_value_heads`` of its 4 heads."""

    def make() -> Any:
        return config_class(
            vocab_size=VOCAB,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=key_value_heads,
            max_position_embeddings=64,
            initializer_range=0.5,
            pad_token_id=PAD,
            bos_token_id=1,
            eos_token_id=1,
        )

    return make


_llama = _rotary_decoder(LlamaConfig, 4)
_qwen2 = _rotary_decoder(Qwen2Config, 2)  # grouped-query: each key/value head serves two query heads


def _gpt2() -> GPT2Config:
    return GPT2Config(
        vocab_size=VOCAB,
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_positions=64,
        initializer_range=0.5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=1,
    )


def _bert() -> BertConfig:
    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.5,
        pad_token_id=PAD,
    )


def _t5() -> T5Config:
    return T5Config(
        vocab_size=VOCAB,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=2,
        num_heads=2,
        dropout_rate=0.0,
        initializer_factor=1.0,  # T5's own init: entmax is already visibly sparse (supports of 3–5 keys)
        pad_token_id=PAD,
        eos_token_id=1,
        decoder_start_token_id=PAD,
    )


def _marian() -> MarianConfig:
    return MarianConfig(
        vocab_size=VOCAB,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        init_std=0.5,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=PAD,
        eos_token_id=1,
        decoder_start_token_id=PAD,
    )


CONFIGS: dict[str, tuple[type[PreTrainedModel], Callable[[], Any]]] = {
    "llama": (LlamaForCausalLM, _llama),
    "qwen2": (Qwen2ForCausalLM, _qwen2),
    "gpt2": (GPT2LMHeadModel, _gpt2),
    "bert": (BertForMaskedLM, _bert),
    "t5": (T5ForConditionalGeneration, _t5),
    "marian": (MarianMTModel, _marian),
}


def build(family: str, implementation: str) -> PreTrainedModel:
    """A tiny random model of ``family`` with α = 1.5 running ``implementation`` (no heads yet), in eval mode;
    its weights are the same whatever the implementation."""
    model_cls, make_config = CONFIGS[family]
    config = make_config()
    config.entmax_alpha = 1.5
    torch.manual_seed(0)
    return model_cls._from_config(config, attn_implementation=implementation).eval()


def exact(model: PreTrainedModel) -> PreTrainedModel:
    """``model`` in float64, for comparisons of two computations of one attention: in float32 these
    large-init models amplify rounding to ~3e-5 in the logits (BERT), too close to the 1e-5 tolerance for
    it to tell a wrong attention from rounding."""
    return model.to(torch.float64)


def attach(model: PreTrainedModel, family: str, implementation: str) -> None:
    """Give ``model`` the heads of ``implementation`` (nothing for entmax), new parameters from seed 1."""
    kinds = list(KINDS[family])
    torch.manual_seed(1)
    if implementation == SPARSEFINDER:
        attach_predictor(model, make_predictor("window"), kind=PREDICTOR_KIND[family], window=WINDOW)
    elif implementation == SSA:
        attach_ssa(model, {"mode": "unbiased", "keys": 3, "kinds": kinds})
    elif implementation == SBM:
        spec = {
            "clusters": 3,
            "kinds": kinds,
            "density_weight": 0.01,
            "sparse_above": 64,
            "evaluation": "expected",
            "threshold": 0.3,
            "seed": 0,
        }
        attach_sbm(model, spec)
    elif implementation == SAMSA:
        attach_samsa(model, {"keys": 3, "temperature": 1.0, "kinds": kinds})


def model_with_heads(family: str, implementation: str) -> PreTrainedModel:
    model = build(family, implementation)
    attach(model, family, implementation)
    return model


# -- inputs --------------------------------------------------------------------------------------------


def right_padded(lengths: tuple[int, ...], width: int, seed: int) -> tuple[Tensor, Tensor]:
    """(ids, mask) of random real tokens (never pad or eos) of ``lengths``, padded on the right."""
    ids = torch.randint(2, VOCAB, (len(lengths), width), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, PAD), mask


def to_left(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The same rows with their padding moved to the left (real tokens last, in order)."""
    shifts = (mask == 0).sum(-1).tolist()
    rows = [(torch.roll(i, s), torch.roll(m, s)) for i, m, s in zip(ids, mask, shifts, strict=True)]
    return torch.stack([i for i, _ in rows]), torch.stack([m for _, m in rows])


def positions(mask: Tensor) -> Tensor:
    """Positions counted from each row's first real token, as ``generate`` gives a left-padded batch."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


SOURCE = ((10, 7), 10)  # lengths and width: the second row is padded
TARGET = ((8, 6), 8)


def batch(family: str, padding: str = "right") -> dict[str, Tensor]:
    """A padded batch of two rows for ``family``: its own tokens, or source and target for T5 and Marian;
    ``left`` padding comes with position ids counted from the first real token."""
    ids, mask = right_padded(*SOURCE, seed=2)
    if family in SEQ2SEQ:
        target, target_mask = right_padded(*TARGET, seed=3)
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "decoder_input_ids": target,
            "decoder_attention_mask": target_mask,
        }
    if padding == "right":
        return {"input_ids": ids, "attention_mask": mask}
    ids, mask = to_left(ids, mask)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions(mask)}


def logits(model: PreTrainedModel, inputs: dict[str, Tensor]) -> Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def labelled(family: str, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """``inputs`` with labels (−100 on padding) for the family's own loss."""
    if family in SEQ2SEQ:
        labels = inputs["decoder_input_ids"].masked_fill(inputs["decoder_attention_mask"] == 0, -100)
        return {
            "input_ids": inputs["input_ids"],
            "attention_mask": inputs["attention_mask"],
            "labels": labels,
        }
    return dict(inputs, labels=inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100))


def cases(families: tuple[str, ...], implementations: tuple[str, ...] = IMPLEMENTATIONS) -> list[Any]:
    """(family, implementation) parameters, T5 only with entmax (the others refuse it, see the last test)."""
    return [
        pytest.param(family, implementation, id=f"{family}-{implementation}")
        for family in families
        for implementation in implementations
        if family != "t5" or implementation == ENTMAX
    ]


# -- 1. forward against an independent reference -------------------------------------------------------

REFERENCE = "reference_entmax"
# (allowed pairs, attended pairs, rows with no allowed key) of every reference call: what was compared
REFERENCE_CALLS: list[tuple[int, int, int]] = []


def reference_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_bias: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """1.5-entmax attention from its definition, in the attention interface's signature (eval only).

    scores = scaling · q kᵀ (+ T5's position bias, + an additive float mask), each row normalised by the
    ``entmax`` package's entmax15 over its allowed keys alone (the mask's, and the band |i − j| ≤ radius of
    queries at positions m − n … m − 1 where the module carries ``reference_radius``); a row with no allowed
    key gives zeros. Keys and values are repeated to the query heads of a grouped-query module.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = query @ key.transpose(-1, -2) * scaling  # (b, h, n, m)
    if position_bias is not None:  # T5: relative position bias (1, h, n, m), passed apart from the mask
        scores = scores + position_bias
    b, h, n, m = scores.shape
    allowed = torch.ones(b, h, n, m, dtype=torch.bool)
    if attention_mask is not None:
        mask = attention_mask[..., :m]
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:  # additive: the dtype's most negative value excludes, anything else is a bias
            allowed = allowed & (mask > torch.finfo(mask.dtype).min)
            scores = scores + mask
    radius = getattr(module, "reference_radius", None)
    if radius is not None:
        i, j = torch.arange(m - n, m)[:, None], torch.arange(m)
        allowed = allowed & ((i - j).abs() <= radius)
    probs = torch.zeros_like(scores)
    # entmax15 fails on −inf entries, so each row is normalised over its allowed keys only
    for row in allowed.any(-1).nonzero().tolist():
        keep = allowed[tuple(row)].nonzero()[:, 0]
        probs[(*row, keep)] = entmax15(scores[(*row, keep)], dim=-1)
    REFERENCE_CALLS.append((int(allowed.sum()), int((probs > 0).sum()), int((~allowed.any(-1)).sum())))
    return (probs @ value).transpose(1, 2).contiguous(), probs


register_attention(REFERENCE, reference_attention)


def twin(model: PreTrainedModel, family: str, implementation: str) -> PreTrainedModel:
    """A model of ``family`` running ``implementation`` with ``model``'s weights (heads left out)."""
    other = build(family, implementation).to(model.dtype)
    missing, _ = other.load_state_dict(model.state_dict(), strict=False)
    assert not [name for name in missing if name not in other.all_tied_weights_keys]
    return other


def window_modules(model: PreTrainedModel, family: str) -> list[nn.Module]:
    """The attention modules the sparsefinder heads of ``family`` sit in: every one of a decoder- or
    encoder-only model, Marian's decoder self-attention."""
    if family == "marian":
        return [layer.self_attn for layer in model.model.decoder.layers]
    return [module for _, module in attention_modules(model)]


@pytest.mark.parametrize(("family", "implementation"), cases(FAMILIES, (ENTMAX,)) + cases(FAMILIES, (SSA,)))
def test_dense_logits_equal_the_reference_entmax15(family, implementation):
    """entmax (all six families) equals the reference; SSA in eval mode samples nothing, so equals entmax."""
    inputs = batch(family, "left" if family in DECODER_ONLY else "right")  # left: rows with no key
    dense = exact(build(family, ENTMAX))
    REFERENCE_CALLS.clear()
    expected = logits(twin(dense, family, REFERENCE), inputs)
    allowed, attended, empty = (sum(column) for column in zip(*REFERENCE_CALLS, strict=True))
    assert attended < allowed  # the attention compared is sparse: some allowed keys get exactly zero
    assert empty > 0 or family not in DECODER_ONLY  # left padding: its queries may attend nothing
    if implementation == ENTMAX:
        torch.testing.assert_close(logits(dense, inputs), expected, **TOLERANCE)
        return
    model = twin(dense, family, SSA)
    attach(model, family, SSA)
    assert torch.equal(logits(model, inputs), logits(dense, inputs))


@pytest.mark.parametrize(
    ("family", "implementation"), cases((*DECODER_ONLY, "bert", "marian"), (SPARSEFINDER,))
)
def test_window_sparsefinder_equals_the_reference_on_the_band(family, implementation):
    """The window predictor predicts no pair: the attention is the reference's over |i − j| ≤ 1 alone."""
    inputs = batch(family, "left" if family in DECODER_ONLY else "right")
    model = exact(model_with_heads(family, implementation))
    reference = twin(model, family, REFERENCE)
    for module in window_modules(reference, family):
        module.reference_radius = RADIUS
    full = logits(twin(model, family, REFERENCE), inputs)
    expected = logits(reference, inputs)
    assert not torch.allclose(full, expected, atol=1e-3)  # the band changes the model
    torch.testing.assert_close(logits(model, inputs), expected, **TOLERANCE)


# -- 2. right vs left padding --------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "implementation"), cases((*DECODER_ONLY, "bert")))
def test_right_and_left_padding_give_the_same_logits_at_real_tokens(family, implementation):
    model = exact(model_with_heads(family, implementation))
    right, left = batch(family, "right"), batch(family, "left")
    assert not torch.equal(right["input_ids"], left["input_ids"])
    right_logits, left_logits = logits(model, right), logits(model, left)
    real_right, real_left = right["attention_mask"].bool(), left["attention_mask"].bool()
    torch.testing.assert_close(left_logits[real_left], right_logits[real_right], **TOLERANCE)


# -- 3. cache vs no cache ------------------------------------------------------------------------------


def generate(model: PreTrainedModel, inputs: dict[str, Tensor], use_cache: bool) -> Tensor:
    with torch.no_grad():
        return model.generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            max_new_tokens=5,
            do_sample=False,
            num_beams=1,
            use_cache=use_cache,
            pad_token_id=PAD,
        )


def stepwise_decoder_only(model: PreTrainedModel, inputs: dict[str, Tensor], prefix: int) -> Tensor:
    """Logits of a left-padded batch: its first ``prefix`` tokens in one call, then one token per call."""
    ids, mask, position_ids = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
    with torch.no_grad():
        out = model(
            input_ids=ids[:, :prefix],
            attention_mask=mask[:, :prefix],
            position_ids=position_ids[:, :prefix],
            use_cache=True,
        )
        cache, steps = out.cache, [out.logits]
        for t in range(prefix, ids.shape[1]):
            out = model(
                input_ids=ids[:, t : t + 1],
                attention_mask=mask[:, : t + 1],
                position_ids=position_ids[:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            steps.append(out.logits)
    return torch.cat(steps, dim=1)


def stepwise_marian(model: PreTrainedModel, inputs: dict[str, Tensor]) -> Tensor:
    """Decoder logits of every target token, one token per call over the cache."""
    with torch.no_grad():
        encoded = model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        cache, steps = None, []
        for t in range(inputs["decoder_input_ids"].shape[1]):
            out = model(
                encoder_outputs=encoded,
                attention_mask=inputs["attention_mask"],
                decoder_input_ids=inputs["decoder_input_ids"][:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            steps.append(out.logits)
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize(("family", "implementation"), cases((*DECODER_ONLY, "marian")))
def test_cached_decoding_equals_uncached(family, implementation):
    model = model_with_heads(family, implementation)
    if family == "marian":
        inputs = batch(family)
        inputs = {k: v for k, v in inputs.items() if k != "decoder_attention_mask"}  # targets unpadded
        full, stepped = logits(model, inputs), stepwise_marian(model, inputs)
    else:
        inputs = batch(family, "left")  # as for batched generation
        full, stepped = logits(model, inputs), stepwise_decoder_only(model, inputs, prefix=6)
    torch.testing.assert_close(stepped, full, **TOLERANCE)
    assert torch.equal(generate(model, inputs, use_cache=True), generate(model, inputs, use_cache=False))


# -- 4. backward ---------------------------------------------------------------------------------------


def query_weight_grad(module: nn.Module) -> Tensor:
    """The gradient of the query projection's weight of an attention module (GPT-2: the query columns of
    its fused q/k/v projection)."""
    for name in ("q_proj", "query", "q"):
        if isinstance(projection := getattr(module, name, None), nn.Linear):
            return projection.weight.grad
    width = module.split_size  # GPT-2: Conv1D weight (in, 3 · out), queries first
    return module.c_attn.weight.grad[:, :width]


@pytest.mark.parametrize(("family", "implementation"), cases(FAMILIES))
def test_training_gives_finite_gradients_to_queries_and_heads(family, implementation):
    model = model_with_heads(family, implementation)
    if implementation == ENTMAX:  # entmax's trainable attention state: a learned α per head
        attach_learned_alpha(model)
    model.train()
    inputs = labelled(family, batch(family))
    # gradients of three training draws, summed: one draw of SSA's 3 keys can leave every row of a layer
    # one-hot (GPT-2's second layer under seed 3), and a one-hot entmax row has no gradient at all
    for seed in range(3):
        torch.manual_seed(seed)
        model(**inputs).loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    for name, module in attention_modules(model):
        grad = query_weight_grad(module)
        assert grad is not None and grad.abs().sum() > 0, name
    attribute = "entmax_alpha" if implementation == ENTMAX else implementation
    heads = {
        name: head
        for name, module in attention_modules(model)
        if (head := getattr(module, attribute, None)) is not None
    }
    assert heads
    for name, head in heads.items():
        parameters = list(head.parameters())
        if implementation in (SPARSEFINDER, SSA):
            # nothing to train, so nothing to check: SSA heads only draw, and the window predictor needs
            # neither projections nor fitted tensors, so its heads hold none
            assert parameters == [], name
            continue
        assert parameters and any(p.grad is not None and p.grad.abs().sum() > 0 for p in parameters), name


# -- 5. save / load ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "implementation"), cases(FAMILIES))
def test_load_model_gives_back_identical_logits(tmp_path: Path, family, implementation):
    model = model_with_heads(family, implementation)
    set_entmax_alpha(model, 1.25)  # not the default: a reload that lost α (T5: in a stack's copy) shows
    save_checkpoint(tmp_path, model, None, {"stage": "test"})
    loaded = load_model(tmp_path)
    assert type(loaded) is type(model) and loaded.config._attn_implementation == implementation
    inputs = batch(family)
    assert torch.equal(logits(loaded, inputs), logits(model, inputs))


# -- 6. α after loading --------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_alpha_set_after_loading_changes_the_model_and_one_is_softmax(tmp_path: Path, family):
    saved = build(family, ENTMAX)  # α = 1.5
    save_checkpoint(tmp_path, saved, None, {"stage": "test"})
    model = load_model(tmp_path)
    inputs = batch(family)
    by_alpha = {}
    for alpha in (1.0, 1.5, 2.0):
        set_entmax_alpha(model, alpha)
        by_alpha[alpha] = logits(model, inputs)
    for a, b in ((1.0, 1.5), (1.5, 2.0), (1.0, 2.0)):
        assert not torch.allclose(by_alpha[a], by_alpha[b], atol=1e-3), (a, b)
    assert torch.equal(by_alpha[1.5], logits(saved, inputs))  # set back, α is the saved model's again
    eager = load_model(tmp_path, attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    torch.testing.assert_close(by_alpha[1.0], logits(eager, inputs), **TOLERANCE)


# -- T5 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("implementation", STATEFUL)
def test_t5_refuses_stateful_attention_in_one_line(implementation):
    model = build("t5", implementation)
    with pytest.raises(UnsupportedLayoutError) as refused:
        attach(model, "t5", implementation)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("T5ForConditionalGeneration")
