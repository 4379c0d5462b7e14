"""PAR stacks (``pipeline.par.stacks``), rebuilt from a teacher (``pipeline.par.from_teacher``), saved,
reloaded and built as a student (``pipeline.students.init``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from pipeline.attention import load_model
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from pipeline.evaluation.student_models import load_student
from pipeline.par.from_teacher import rebuild_from_teacher
from pipeline.par.stacks import PAR, CrossAttention, FeedForward, SelfAttention, build_configured_stacks
from pipeline.params.student import ParStudent
from pipeline.students.init import build_student
from tests.tiny import padded_batch, standard_marian, word_tokenizer

VOCAB = 30
TEACHER = {"encoder": "sfsf", "decoder": "scfscf"}  # (sf)x2, (scf)x2: the 2-layer teacher's own patterns
# more sublayers of every kind than the teacher has layers: a third decoder self-attention, a fourth
# feed-forward, a third encoder feed-forward
WIDE = {"encoder": "sfff", "decoder": "scffssfcf"}
KINDS = {"s": SelfAttention, "c": CrossAttention, "f": FeedForward}
OUTPUTS = {"out": "o", "run_dir": "r", "metrics": "m"}
BEAMS = {"num_beams": 3, "max_new_tokens": 8, "no_repeat_ngram_size": 1, "do_sample": False}


def teacher() -> torch.nn.Module:
    return standard_marian(vocab=VOCAB)  # with dropout, in eval mode


def rebuilt(patterns: dict[str, str], seed: int = 0) -> torch.nn.Module:
    """The teacher rebuilt to ``patterns`` and put (back) in eval mode."""
    model = teacher()
    rebuild_from_teacher(model, patterns, seed=seed)
    return model.eval()


def source(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def parts(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in module.state_dict().items()}


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rebuilding_keeps_the_models_mode():
    """A teacher in eval mode stays in eval mode: every new sublayer too (dropout off)."""
    model = teacher()
    assert not model.training
    rebuild_from_teacher(model, TEACHER, seed=0)
    modes = {name: m.training for name, m in model.named_modules() if m.training}
    assert not modes, f"in training mode inside an eval-mode model: {sorted(modes)[:4]}"


def test_the_teachers_own_pattern_gives_back_the_teacher():
    original, model = teacher(), rebuilt(TEACHER)
    stacks = {"encoder": model.get_encoder().layers, "decoder": model.get_decoder().layers}
    for stack, layers in stacks.items():
        assert "".join(layer.LETTER for layer in layers) == TEACHER[stack]
    assert model.config.par == TEACHER
    batch = padded_batch(VOCAB)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, original(**batch).logits, rtol=0, atol=0)
        expected = original.generate(**source(batch), **BEAMS)
        assert torch.equal(model.generate(**source(batch), **BEAMS), expected)
    assert len(set(expected[0, 1:].tolist())) > 4  # a real search, not one repeated token


def test_more_sublayers_than_teacher_layers_decode_with_the_cache():
    model = rebuilt(WIDE)
    assert [type(layer) for layer in model.get_decoder().layers] == [KINDS[c] for c in WIDE["decoder"]]
    assert [layer.index for layer in model.get_decoder().layers] == [0, 0, 0, 1, 1, 2, 2, 1, 3]
    batch = padded_batch(VOCAB)
    target = batch["decoder_input_ids"][:, :7]  # unpadded in both rows
    with torch.no_grad():
        full = model(**source(batch), decoder_input_ids=target, use_cache=False).logits
        encoded = model.get_encoder()(**source(batch))
        cache, steps = None, []
        for t in range(target.shape[1]):
            out = model(
                encoder_outputs=encoded,
                attention_mask=batch["attention_mask"],
                decoder_input_ids=target[:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache, steps = out.cache, [*steps, out.logits]
        # one self-attention slot per s, one cross-attention slot per c, however many the config names
        assert cache.self_attention_cache.get_seq_length(2) == target.shape[1]
        assert cache.cross_attention_cache.get_seq_length(1) == batch["input_ids"].shape[1]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)

        cached = model.generate(**source(batch), **BEAMS)
        uncached = model.generate(**source(batch), **BEAMS, use_cache=False)
    assert torch.equal(cached, uncached)
    assert cached.shape[1] > 2


@pytest.mark.parametrize("patterns", [TEACHER, WIDE], ids=["teacher", "wide"])
def test_the_decoder_is_causal(patterns):
    model = rebuilt(patterns)
    batch = padded_batch(VOCAB)
    t = 4
    changed = dict(batch, decoder_input_ids=batch["decoder_input_ids"].clone())
    changed["decoder_input_ids"][:, t + 1 :] = (changed["decoder_input_ids"][:, t + 1 :] + 5) % (
        VOCAB - 2
    ) + 2
    assert not torch.equal(changed["decoder_input_ids"], batch["decoder_input_ids"])
    with torch.no_grad():
        before, after = model(**batch).logits, model(**changed).logits
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])  # the later tokens are read


def test_copied_sublayers_are_the_teachers_and_fresh_ones_are_seeded():
    original = teacher()
    model = teacher()
    copied = rebuild_from_teacher(model, WIDE, seed=3)
    # encoder sfff: s0, f0, f1 from the teacher, f2 fresh; decoder: s0 s1 c0 c1 f0 f1, but s2 f2 f3 fresh
    assert copied == {"encoder": 3, "decoder": 6}
    again, other = teacher(), teacher()
    rebuild_from_teacher(again, WIDE, seed=3)
    rebuild_from_teacher(other, WIDE, seed=4)
    fresh = 0
    for stack in ("encoder", "decoder"):
        layers = getattr(original.model, stack).layers
        for i, sublayer in enumerate(getattr(model.model, stack).layers):
            mine = parts(sublayer)
            repeated = parts(getattr(again.model, stack).layers[i])
            drawn = parts(getattr(other.model, stack).layers[i])
            assert same_tensors(mine, repeated)  # the seed decides everything
            if sublayer.index < len(layers):
                source_parts = {
                    f"{part}.{name}": tensor
                    for part in sublayer.PARTS
                    for name, tensor in getattr(layers[sublayer.index], part).state_dict().items()
                }
                assert same_tensors(mine, source_parts), (stack, i)
                assert same_tensors(drawn, source_parts)  # whatever the seed
            else:
                fresh += 1
                weights = [name for name in mine if name.endswith("weight") and "norm" not in name]
                assert weights and all(not torch.equal(mine[n], drawn[n]) for n in weights), (stack, i)
                teacher_kind = getattr(layers[-1], sublayer.PARTS[0]).state_dict()
                first = f"{sublayer.PARTS[0]}."
                assert all(
                    not torch.equal(mine[first + n], t)
                    for n, t in teacher_kind.items()
                    if n.endswith("weight")
                )
    assert fresh == 4


def test_fresh_sublayers_leave_the_global_rng_alone():
    model = teacher()
    torch.manual_seed(11)
    rebuild_from_teacher(model, WIDE, seed=3)
    after = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(after, torch.rand(3))


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory) -> Path:
    """A saved teacher checkpoint (manifest included) with a word-level tokenizer."""
    folder = tmp_path_factory.mktemp("par") / "teacher"
    save_checkpoint(folder, teacher(), word_tokenizer(VOCAB), {"stage": "test"})
    return folder


def test_a_par_model_saves_and_reloads_alone(teacher_folder, tmp_path):
    model = rebuilt(WIDE, seed=5)
    save_checkpoint(tmp_path / "par", model, AutoTokenizer.from_pretrained(teacher_folder), {"stage": "t"})
    assert json.loads((tmp_path / "par" / "config.json").read_text())[PAR] == WIDE
    batch = padded_batch(VOCAB)
    for reloaded in (load_model(tmp_path / "par"), load_student(tmp_path / "par", "student")):
        assert reloaded.config.par == WIDE and not reloaded.training
        letters = "".join(layer.LETTER for layer in reloaded.get_decoder().layers)
        assert letters == WIDE["decoder"]
        with torch.no_grad():
            torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits, rtol=0, atol=0)


def test_configured_stacks_leave_other_models_alone():
    model = teacher()
    layers = list(model.get_decoder().layers)
    build_configured_stacks(model)
    assert list(model.get_decoder().layers) == layers and getattr(model.config, PAR, None) is None


def test_a_par_student_starts_from_the_teacher_or_a_par_folder(teacher_folder, tmp_path):
    spec = ParStudent(init=str(teacher_folder), encoder="(sf)x2 f", decoder="sc (f)x2 scf", **OUTPUTS)
    model, tokenizer = build_student(spec, "student.instances.par.init", seed=1)
    assert model.training
    assert model.config.par == {"encoder": "sfsff", "decoder": "scffscf"}
    expected = rebuilt({"encoder": "sfsff", "decoder": "scffscf"}, seed=1)
    batch = padded_batch(VOCAB)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**batch).logits, expected(**batch).logits, rtol=0, atol=0)

    save_checkpoint(tmp_path / "searched", model, tokenizer, {"stage": "t"})
    searched = ParStudent(init=str(tmp_path / "searched"), **OUTPUTS)
    again, _ = build_student(
        searched, "student.instances.par.init", seed=9
    )  # the folder's patterns as they are
    assert again.training and again.config.par == model.config.par
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(**batch).logits, model(**batch).logits, rtol=0, atol=0)


def test_a_par_student_refuses_patterns_with_a_par_folder_and_a_teacher_without(teacher_folder, tmp_path):
    save_checkpoint(tmp_path / "searched", rebuilt(WIDE), word_tokenizer(VOCAB), {"stage": "t"})
    with_patterns = ParStudent(init=str(tmp_path / "searched"), encoder="sf", decoder="scf", **OUTPUTS)
    with pytest.raises(UserError, match=r"student.instances.par.init = .* already holds a PAR model") as err:
        build_student(with_patterns, "student.instances.par.init", seed=0)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"student.instances.par.init = .* is no PAR model") as err:
        build_student(ParStudent(init=str(teacher_folder), **OUTPUTS), "student.instances.par.init", seed=0)
    assert "\n" not in str(err.value)
