"""PAR on a decoder-only LM: a Llama's decoder rebuilt as pre-norm sublayers, its supernet, its students."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, RobertaConfig, RobertaForMaskedLM

from pipeline.attention import ENTMAX, load_model
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from pipeline.par.from_teacher import rebuild_from_teacher
from pipeline.par.stacks import PAR, PreNormFeedForward, PreNormSelfAttention, stack_modules, teacher_layers
from pipeline.par.supernet import (
    CHOICES,
    MixedSublayer,
    architecture_parameters,
    build_supernet,
    mixing_weights,
    searched_patterns,
)
from pipeline.params.student import ParStudent
from pipeline.students.init import build_student
from tests.tiny import word_tokenizer

VOCAB, LAYERS = 40, 2
TEACHER = "sfsf"  # (sf)x2: the 2-layer teacher's own pattern
WIDE = "sffssfsf"  # a third and fourth self-attention, beyond the teacher's layers
KINDS = {"s": PreNormSelfAttention, "f": PreNormFeedForward}
OUTPUTS = {"out": "o", "run_dir": "r", "metrics": "m"}


def teacher() -> LlamaForCausalLM:
    """A tiny α-entmax Llama (rotary positions, 4 query heads on 2 key/value heads), in eval mode."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.3,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    config.entmax_alpha = 1.5
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation=ENTMAX).eval()


def rebuilt(pattern: str, seed: int = 0) -> LlamaForCausalLM:
    model = teacher()
    rebuild_from_teacher(model, {"decoder": pattern}, seed=seed)
    return model.eval()


def tokens(n: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama-par") / "teacher"
    save_checkpoint(folder, teacher(), word_tokenizer(VOCAB), {"stage": "test"})
    return folder


def test_a_decoder_only_model_has_one_stack_of_pre_norm_sublayers():
    model = rebuilt(TEACHER)
    assert list(stack_modules(model)) == ["decoder"]
    assert [type(layer) for layer in model.model.layers] == [KINDS[c] for c in TEACHER]
    assert model.config.par == {"decoder": TEACHER}
    assert teacher_layers(teacher()) == {"decoder": LAYERS}


def test_the_teachers_own_pattern_gives_back_the_teacher():
    original, model = teacher(), rebuilt(TEACHER)
    ids = tokens()
    torch.testing.assert_close(logits(model, ids), logits(original, ids), rtol=0, atol=0)
    greedy = {"max_new_tokens": 6, "do_sample": False}
    assert torch.equal(model.generate(ids[:1], **greedy), original.generate(ids[:1], **greedy))


def test_more_sublayers_than_teacher_layers_decode_with_the_cache():
    model = rebuilt(WIDE)
    assert model.config.num_hidden_layers == len(WIDE)  # the Llama loop runs every sublayer
    assert [layer.index for layer in model.model.layers] == [0, 0, 1, 1, 2, 2, 3, 3]
    ids = tokens()
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        cache, steps = None, []
        for t in range(ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache, steps = out.cache, [*steps, out.logits]
        assert cache.get_seq_length(3) == ids.shape[1]  # one slot per self-attention sublayer
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-4)
    greedy = {"max_new_tokens": 6, "do_sample": False}
    assert torch.equal(model.generate(ids, **greedy), model.generate(ids, **greedy, use_cache=False))


@pytest.mark.parametrize("pattern", [TEACHER, WIDE])
def test_the_rebuilt_lm_is_causal(pattern):
    model, ids, t = rebuilt(pattern), tokens(), 5
    changed = ids.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % (VOCAB - 2) + 2
    before, after = logits(model, ids), logits(model, changed)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])


def test_copied_sublayers_are_the_teachers_and_fresh_ones_are_seeded():
    original = teacher()
    model = rebuilt(WIDE, seed=3)
    layers = model.model.layers
    for sublayer in layers:
        if sublayer.index < LAYERS:
            source = original.model.layers[sublayer.index]
            for part in sublayer.PARTS:
                theirs = getattr(source, part).state_dict()
                assert all(torch.equal(v, theirs[k]) for k, v in getattr(sublayer, part).state_dict().items())
    fresh = [layer for layer in layers if layer.index >= LAYERS]
    again = rebuilt(WIDE, seed=3).model.layers
    other = rebuilt(WIDE, seed=4).model.layers
    for sublayer in fresh:
        position = list(layers).index(sublayer)
        mine = torch.cat([p.flatten() for p in sublayer.parameters()])
        assert torch.equal(mine, torch.cat([p.flatten() for p in again[position].parameters()]))
        assert not torch.equal(mine, torch.cat([p.flatten() for p in other[position].parameters()]))


def test_a_par_lm_saves_and_reloads_alone(tmp_path):
    model = rebuilt(WIDE, seed=5)
    save_checkpoint(tmp_path / "par", model, word_tokenizer(VOCAB), {"stage": "t"})
    assert json.loads((tmp_path / "par" / "config.json").read_text())[PAR] == {"decoder": WIDE}
    reloaded = load_model(tmp_path / "par")
    assert "".join(layer.LETTER for layer in reloaded.model.layers) == WIDE
    ids = tokens()
    torch.testing.assert_close(logits(reloaded, ids), logits(model, ids), rtol=0, atol=0)


def test_the_supernet_mixes_two_candidates_per_teacher_layer_and_its_argmax_is_the_teacher():
    model = teacher()
    build_supernet(model, temperature=1.0)
    layers = model.model.layers
    assert len(layers) == 2 * LAYERS and all(isinstance(layer, MixedSublayer) for layer in layers)
    assert model.config.num_hidden_layers == 2 * LAYERS
    choice = [0, 1, 0, 1]  # s, f, s, f: the teacher's own sublayers
    with torch.no_grad():
        for layer, chosen in zip(layers, choice, strict=True):
            layer.architecture.copy_(
                torch.full((len(CHOICES),), -1e4).index_fill(0, torch.tensor(chosen), 0.0)
            )
    ids = tokens()
    torch.testing.assert_close(logits(model.eval(), ids), logits(teacher(), ids), rtol=1e-5, atol=1e-5)
    assert searched_patterns(mixing_weights(model)) == {"decoder": TEACHER}

    fresh = teacher()
    build_supernet(fresh, temperature=1.0)  # θ = 0: every choice equally likely, every θ has a gradient
    fresh.train()(ids, labels=ids).loss.backward()
    thetas = architecture_parameters(fresh)
    assert len(thetas) == 2 * LAYERS and all(theta.grad.abs().sum() > 0 for theta in thetas)


def test_a_par_lm_student_takes_a_decoder_pattern_alone(teacher_folder):
    spec = ParStudent(init=str(teacher_folder), decoder="(sff)x2", **OUTPUTS)
    model, _ = build_student(spec, "student.instances.par.init", seed=1)
    assert model.training and model.config.par == {"decoder": "sffsff"}
    ids = tokens()
    torch.testing.assert_close(
        logits(model.eval(), ids), logits(rebuilt("sffsff", seed=1), ids), rtol=0, atol=0
    )


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        (
            {"encoder": "sf", "decoder": "scf"},
            "encoder and decoder patterns are given; allowed: its decoder pattern",
        ),
        ({"decoder": "(scf)x2"}, "'c' is not a sublayer of the decoder of a decoder-only model"),
    ],
)
def test_a_par_lm_student_refuses_what_a_decoder_only_model_lacks(teacher_folder, patterns, message):
    spec = ParStudent(init=str(teacher_folder), **patterns, **OUTPUTS)
    with pytest.raises(UserError, match=message) as err:
        build_student(spec, "student.instances.par.init", seed=0)
    assert "\n" not in str(err.value) and "student.instances.par.init" in str(err.value)


def test_a_model_par_does_not_know_is_refused_in_one_line():
    config = RobertaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(UserError, match="for marian and llama models; this one is a roberta"):
        build_supernet(RobertaForMaskedLM(config), temperature=1.0)
