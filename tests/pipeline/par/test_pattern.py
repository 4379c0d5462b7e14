"""PAR patterns (``pipeline.par.pattern``) and the params that hold them (``ParStudent``, ``ParSearch``)."""

from __future__ import annotations

import random

import pytest

from pipeline.errors import UserError
from pipeline.par.pattern import (
    attention_sublayers,
    compact_pattern,
    parse_pattern,
    teacher_pattern,
)
from pipeline.params.sections import validate_section
from pipeline.params.student import ParStudent

OUTPUTS = {"init": "t", "out": "o", "run_dir": "r", "metrics": "m"}


@pytest.mark.parametrize(
    ("text", "stack", "flat"),
    [
        ("(sf)x2 f", "encoder", "sfsff"),
        ("(sff)x2 (f)x2", "encoder", "sffsffff"),
        ("sf", "encoder", "sf"),
        ("s", "encoder", "s"),
        ("ff", "encoder", "ff"),
        ("  (sf) x 2   f  ", "encoder", "sfsff"),  # spaces around items and around 'x' are ignored
        ("(sf)x2f", "encoder", "sfsff"),
        ("sf sf", "encoder", "sfsf"),
        ("(s)x3", "encoder", "sss"),
        ("(sf)x12", "encoder", "sf" * 12),
        ("(scf)x2", "decoder", "scfscf"),
        ("scffssfcf", "decoder", "scffssfcf"),
        ("(sc)x1 (f)x3", "decoder", "scfff"),
        ("cs", "decoder", "cs"),
    ],
)
def test_patterns_flatten(text, stack, flat):
    assert parse_pattern(text, stack) == flat


@pytest.mark.parametrize(
    ("text", "stack", "position", "says"),
    [
        ("sfc", "encoder", 3, "'c'"),  # the decoder's letter, in the encoder
        ("(sf)x2 sc", "encoder", 9, "'c'"),
        ("(sfc)x2", "encoder", 4, "'c'"),
        ("sfa", "decoder", 3, "'a'"),
        ("(sf)x", "encoder", 5, "count"),
        ("(sf)x0", "encoder", 5, "count"),
        ("sf (sf)x", "encoder", 8, "count"),
        ("()x2", "encoder", 1, "empty"),
        ("(sf", "encoder", 4, "')'"),
        ("sf)", "encoder", 3, "')'"),
        ("", "encoder", 1, "no sublayers"),
        ("   ", "encoder", 1, "no sublayers"),
        ("", "decoder", 1, "no sublayers"),
        ("(sf)x2", "decoder", 1, "no 'c'"),
        ("cf", "decoder", 1, "no 's'"),
        ("(cf)x3", "decoder", 1, "no 's'"),
    ],
)
def test_bad_patterns_are_one_line_naming_the_position(text, stack, position, says):
    with pytest.raises(ValueError) as err:
        parse_pattern(text, stack)
    message = str(err.value)
    assert "\n" not in message
    assert f"{stack} pattern {text!r}, position {position}:" in message, message
    assert says in message, message
    assert "allowed:" in message


@pytest.mark.parametrize(
    ("text", "cross", "flat", "says"),
    [
        ("(sf)x2 ff", False, "sfsfff", None),  # a decoder-only LM's decoder: no cross-attention
        ("(sf)x2", None, "sfsf", None),  # params: whether it reads an encoder is the model's
        ("(scf)x2", None, "scfscf", None),
        ("sfc", False, None, "'c' is not a sublayer of the decoder of a decoder-only model"),
        ("ff", False, None, "no 's'"),
        ("ff", None, None, "no 's'"),
    ],
)
def test_decoder_patterns_with_and_without_an_encoder(text, cross, flat, says):
    if says is None:
        assert parse_pattern(text, "decoder", cross=cross) == flat
        return
    with pytest.raises(ValueError, match=says) as err:
        parse_pattern(text, "decoder", cross=cross)
    allowed = "s, f" if cross is False else "s, c, f"
    assert f"allowed: the letters {allowed} and" in str(err.value)


def test_teacher_patterns_and_attention_count():
    assert teacher_pattern("encoder", 3) == "sfsfsf"
    assert teacher_pattern("decoder", 2) == "scfscf"
    assert parse_pattern("(sf)x3", "encoder") == teacher_pattern("encoder", 3)
    assert parse_pattern("(scf)x2", "decoder") == teacher_pattern("decoder", 2)
    assert teacher_pattern("decoder", 2, cross=False) == "sfsf"  # a decoder-only LM
    assert attention_sublayers("sffsffff") == 2
    assert attention_sublayers("scffssfcf") == 3
    assert attention_sublayers("ffff") == 0


@pytest.mark.parametrize(
    ("flat", "compact"),
    [
        ("sfsfsfff", "(sf)x3 (f)x2"),
        ("sfsfsfsf", "(sf)x4"),
        ("scfscf", "(scf)x2"),
        ("sffsffff", "(sff)x2 (f)x2"),
        ("s", "s"),
        ("sf", "sf"),
    ],
)
def test_compact_examples(flat, compact):
    assert compact_pattern(flat) == compact


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_compact_patterns_parse_back(stack):
    letters = "sf" if stack == "encoder" else "scf"
    rng = random.Random(7)
    checked = 0
    while checked < 300:
        flat = "".join(rng.choice(letters) for _ in range(rng.randint(1, 24)))
        if stack == "decoder" and not {"s", "c"} <= set(flat):
            continue
        compact = compact_pattern(flat)
        assert parse_pattern(compact, stack) == flat, (flat, compact)
        checked += 1


def student_params(**pattern) -> dict:
    return {"instances": {"par": {"attention": "par", **OUTPUTS, **pattern}}}


def test_par_student_keeps_patterns_as_written():
    section = validate_section("student", student_params(encoder="(sf)x2 f", decoder="(scf)x2"))
    spec = section.instances["par"]
    assert isinstance(spec, ParStudent)
    assert (spec.encoder, spec.decoder) == ("(sf)x2 f", "(scf)x2")
    neither = validate_section("student", student_params()).instances["par"]
    assert (neither.encoder, neither.decoder) == (None, None)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (
            {"encoder": "sfc", "decoder": "(scf)x2"},
            "student.instances.par.par.encoder = 'sfc': encoder pattern 'sfc', position 3:",
        ),
        (
            {"encoder": "(sf)x2", "decoder": "(sf)x0"},
            "student.instances.par.par.decoder = '(sf)x0': decoder pattern '(sf)x0', position 5:",
        ),
        (  # with an encoder the model is an encoder–decoder: its decoder must read the encoder
            {"encoder": "(sf)x2", "decoder": "sff"},
            "decoder = 'sff': decoder pattern 'sff', position 1: no 'c'",
        ),
    ],
)
def test_a_bad_par_pattern_is_a_one_line_user_error(pattern, expected):
    with pytest.raises(UserError) as err:
        validate_section("student", student_params(**pattern))
    assert "\n" not in str(err.value)
    assert expected in str(err.value), str(err.value)


def test_par_student_needs_a_decoder_pattern_with_an_encoder_one():
    with pytest.raises(UserError) as err:
        validate_section("student", student_params(encoder="(sf)x2"))
    assert "\n" not in str(err.value)
    assert "give both encoder and decoder patterns" in str(err.value)


def test_a_decoder_pattern_alone_is_a_decoder_only_models_and_may_leave_out_c():
    spec = validate_section("student", student_params(decoder="(sff)x2")).instances["par"]
    assert (spec.encoder, spec.decoder) == (None, "(sff)x2")


def test_par_search_keeps_a_step_to_search_in():
    section = validate_section(
        "par_search", {"train": {"max_steps": 10}, "architecture": {"frozen_steps": 9}}
    )
    assert section.architecture.frozen_steps == 9
    for frozen in (10, 11):
        with pytest.raises(UserError, match=rf"frozen_steps {frozen} leaves no step of the 10"):
            validate_section(
                "par_search", {"train": {"max_steps": 10}, "architecture": {"frozen_steps": frozen}}
            )
