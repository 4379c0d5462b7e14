"""Students' starting points (``pipeline.students.init``) and their folders, reloaded for evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from pipeline.attention import load_model
from pipeline.attention.configure import configure_sparsefinder
from pipeline.attention.samsa import samsa_heads
from pipeline.attention.sbm import sbm_heads
from pipeline.attention.sparsefinder import sparsefinder_heads
from pipeline.attention.ssa import ssa_heads
from pipeline.checkpoint import save_checkpoint
from pipeline.errors import UserError
from pipeline.evaluation.student_models import (
    load_student,
    student_folders,
    train_step_seconds,
    untrained_twin,
)
from pipeline.params.student import (
    EntmaxStudent,
    SamsaStudent,
    SbmStudent,
    SparsefinderStudent,
    SsaStudent,
    Student,
)
from pipeline.params.training import Training
from pipeline.students.init import DenseFinetune, build_student, student_callbacks
from tests.pipeline.attention.test_configure import fitted  # noqa: F401  (a fixture)

OUTPUTS = {"out": "o", "run_dir": "r", "metrics": "m"}


@pytest.fixture(scope="module")
def folders(fitted, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """The fixture's teacher saved as a checkpoint (with a manifest) and a k-means sparsefinder folder."""
    root = tmp_path_factory.mktemp("students")
    teacher = load_model(fitted["teacher"])
    save_checkpoint(root / "teacher", teacher, AutoTokenizer.from_pretrained(fitted["teacher"]), {})
    configure_sparsefinder(
        str(root / "teacher"),
        root / "sparsefinder",
        method="kmeans",
        knobs={"buckets": 4},
        window=1,
        projections=fitted["projections"],
        state=fitted["state"],
    )
    return {"teacher": root / "teacher", "sparsefinder": root / "sparsefinder", "root": root}


def batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 30, (2, 9), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool), "labels": ids.flip(1)}


def test_sparsefinder_student_trains_the_model_not_its_predictor_and_reloads_alone(folders):
    spec = SparsefinderStudent(init=str(folders["sparsefinder"]), **OUTPUTS)
    model, tokenizer = build_student(spec, "init", seed=0)
    assert model.training and sparsefinder_heads(model)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    frozen -= {name for name, p in load_model(folders["teacher"]).named_parameters() if not p.requires_grad}
    assert frozen and all(".sparsefinder." in name for name in frozen)  # only the predictor is added frozen
    model(**batch()).loss.backward()  # one step's gradients reach the model's weights
    assert all(p.grad is not None for n, p in model.named_parameters() if "self_attn.q_proj" in n)

    save_checkpoint(folders["root"] / "students" / "sparsefinder", model.eval(), tokenizer, {"stage": "t"})
    students = folders["root"] / "students"
    found = student_folders(str(students), {"sparsefinder": [str(students / "sparsefinder")]})
    reloaded = load_student(found["sparsefinder"][0], "student")
    assert sparsefinder_heads(reloaded)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch()).logits, model(**batch()).logits, rtol=0, atol=0)
        # its untrained twin is the folder it started from: the teacher's weights with the same predictor
        twin = untrained_twin(reloaded, str(folders["teacher"]))
        started = load_model(folders["sparsefinder"], attn_implementation="sparsefinder")
        torch.testing.assert_close(twin(**batch()).logits, started(**batch()).logits, rtol=0, atol=0)


def test_ssa_student_samples_in_training_only_and_reloads_alone(folders):
    spec = SsaStudent(init=str(folders["teacher"]), mode="local", windows=2, sigma=[2.0], **OUTPUTS)
    model, tokenizer = build_student(spec, "init", seed=0)
    heads = ssa_heads(model)
    assert heads and model.config.ssa["sigma"] == [2.0]  # one σ: every layer
    teacher = load_model(folders["teacher"])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**batch()).logits, teacher(**batch()).logits)  # dense in eval
    save_checkpoint(folders["root"] / "ssa-students" / "ssa", model, tokenizer, {"stage": "t"})
    reloaded = load_student(folders["root"] / "ssa-students" / "ssa", "student")
    assert reloaded.config.ssa == model.config.ssa and ssa_heads(reloaded)
    student_step, teacher_step = train_step_seconds([reloaded, teacher], [batch(), batch()])
    assert student_step > 0 and teacher_step > 0 and not reloaded.training


def test_a_student_must_start_from_the_attention_it_fine_tunes(folders):
    with pytest.raises(UserError, match=r"sparsefinder attention; allowed: a folder with entmax attention"):
        build_student(
            SsaStudent(init=str(folders["sparsefinder"]), **OUTPUTS), "student.instances.ssa.init", seed=0
        )
    with pytest.raises(UserError, match=r"entmax attention; allowed: a folder with sparsefinder attention"):
        build_student(SparsefinderStudent(init=str(folders["teacher"]), **OUTPUTS), "init", seed=0)


def test_dense_finetune_takes_the_last_fraction_of_the_steps():
    params = Student(train=Training(max_steps=50)).run("ssa")
    assert student_callbacks(params) == []  # the default: no +FT
    spec = params.spec.model_copy(update={"dense_fraction": 0.1})
    callbacks = student_callbacks(params.model_copy(update={"spec": spec}))
    assert len(callbacks) == 1 and isinstance(callbacks[0], DenseFinetune) and callbacks[0].start == 45


def test_the_dense_control_is_the_teacher_itself(folders):
    model, _ = build_student(EntmaxStudent(init=str(folders["teacher"]), **OUTPUTS), "init", seed=0)
    teacher = load_model(folders["teacher"])

    def trainable(m):
        return {name for name, p in m.named_parameters() if p.requires_grad}

    assert model.training and trainable(model) == trainable(teacher)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**batch()).logits, teacher(**batch()).logits, rtol=0, atol=0)
    assert untrained_twin(model, str(folders["teacher"])) is None


@pytest.mark.parametrize(
    ("spec", "heads_of"),
    [
        (SbmStudent(init="", clusters=3, **OUTPUTS), sbm_heads),
        (SamsaStudent(init="", keys=3, **OUTPUTS), samsa_heads),
    ],
    ids=["sbm", "samsa"],
)
def test_students_with_learned_heads_start_seeded_train_them_and_reload_alone(folders, spec, heads_of):
    spec = spec.model_copy(update={"init": str(folders["teacher"])})
    model, tokenizer = build_student(spec, "init", seed=3)
    again, _ = build_student(spec, "init", seed=3)
    other, _ = build_student(spec, "init", seed=4)
    added = {name for name, _ in model.named_parameters()} - {
        name for name, _ in load_model(folders["teacher"]).named_parameters()
    }
    assert heads_of(model) and added and all(f".{spec.attention}." in name for name in added)
    parameters, repeated, drawn = (dict(m.named_parameters()) for m in (model, again, other))
    assert all(torch.equal(parameters[name], repeated[name]) for name in added)  # the seed decides
    assert any(not torch.equal(parameters[name], drawn[name]) for name in added)

    torch.manual_seed(0)
    model(**batch()).loss.backward()  # gradients reach the heads' own parameters through the loss
    assert any(parameters[name].grad is not None and parameters[name].grad.abs().sum() > 0 for name in added)

    folder = folders["root"] / f"{spec.attention}-students" / spec.attention
    save_checkpoint(folder, model.eval(), tokenizer, {"stage": "t"})
    reloaded = load_student(folder, "student")
    assert reloaded.config._attn_implementation == spec.attention and heads_of(reloaded)
    assert getattr(reloaded.config, spec.attention) == getattr(model.config, spec.attention)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch()).logits, model(**batch()).logits, rtol=0, atol=0)


def test_a_folder_with_no_student_attention_is_refused(folders, tmp_path):
    model = load_model(folders["teacher"])
    save_checkpoint(tmp_path / "odd", model, AutoTokenizer.from_pretrained(folders["teacher"]), {})
    manifest = tmp_path / "odd" / "manifest.json"
    manifest.write_text(
        manifest.read_text().replace('"attn_implementation": "entmax"', '"attn_implementation": "x"')
    )
    with pytest.raises(
        UserError, match=r"attn_implementation 'x' is no student's; allowed: sparsefinder, entmax"
    ):
        load_student(tmp_path / "odd", "student")
