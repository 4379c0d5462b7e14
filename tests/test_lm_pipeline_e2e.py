"""The long-context profile end to end: ``dvc repro`` of ``configs/lm.yaml`` shrunk to micro sizes (a few
books, 64-token blocks, a two-layer Llama, a handful of steps) in a temporary copy of the project, through
the report: block corpus, softmax then α-entmax LM, decoder self-attention graphs, predictors, PAR and the
other students, perplexity at each method's points and the speed table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tests.test_pipeline_e2e import MICRO_PREDICTORS, dvc, load, project_copy, shrunk_profile

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(
            Path(f"/usr/share/sword/mods.d/{m}.conf").is_file() for m in ("engWEB2015eb", "engKJV2006eb")
        ),
        reason="SWORD modules not installed",
    ),
]

CONTEXT = 64
# configs/lm.yaml's keys changed for micro sizes, as (section path, values)
MICRO = [
    (("prepare",), {"context": CONTEXT, "vocab_size": 300, "valid_fraction": 0.1, "test_fraction": 0.1}),
    (("prepare", "sword"), {"books": ["Ruth", "Jonah", "Obad", "Phlm", "Jude"]}),
    (
        ("pretrain", "model"),
        {"d_model": 32, "decoder_layers": 2, "heads": 2, "ffn_dim": 64, "max_positions": CONTEXT},
    ),
    # enough steps at a high enough rate for the α-entmax teacher's attention to be sparse
    (
        ("pretrain", "train"),
        {"max_steps": 150, "lr": 0.01, "warmup_steps": 5, "eval_steps": 150, "save_steps": 150},
    ),
    (("pretrain", "eval"), {"test_examples": 4, "sparsity_examples": 2}),
    (
        ("teacher", "train"),
        {"max_steps": 10, "lr": 0.001, "warmup_steps": 1, "eval_steps": 10, "save_steps": 10},
    ),
    (("teacher", "eval"), {"test_examples": 4, "sparsity_examples": 2}),
    *MICRO_PREDICTORS,
    (("evaluate", "quality"), {"examples": 2}),
    (("evaluate", "speed"), {"contexts": [CONTEXT, 2 * CONTEXT], "repeats": 1}),
    (("par_search", "train"), {"max_steps": 4, "eval_steps": 4, "save_steps": 4, "logging_steps": 2}),
    (("par_search", "architecture"), {"frozen_steps": 2}),
    (("par_search", "eval"), {"test_examples": 2, "sparsity_examples": 2}),
    (("student", "train"), {"max_steps": 3, "eval_steps": 3, "save_steps": 3, "logging_steps": 3}),
    (("student", "eval"), {"test_examples": 2, "sparsity_examples": 2}),
    (("student", "instances", "ssa"), {"keys": 8}),
]
STUDENTS = ("sparsefinder", "ssa", "dense", "par", "par-sfff")


def micro_lm_params() -> dict:
    return shrunk_profile("lm.yaml", MICRO)


@pytest.fixture(scope="module")
def lm_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project whose params.yaml is the micro-sized lm profile."""
    params = yaml.safe_dump(micro_lm_params(), sort_keys=False)
    return project_copy(tmp_path_factory.mktemp("lm-project"), params)


def test_dvc_repro_of_the_lm_profile_runs_through_the_report(lm_project: Path) -> None:
    dvc(lm_project, "repro")

    card = load(lm_project, "artifacts/data/corpus.json")
    assert card["task"] == "lm" and card["context"] == CONTEXT
    teacher = load(lm_project, "artifacts/metrics/teacher.json")
    assert math.isfinite(teacher["test"]["perplexity"]) and teacher["test"]["perplexity"] > 1.0
    assert "bleu" not in teacher["test"]

    evaluation = load(lm_project, "artifacts/evaluation/evaluate.json")
    assert evaluation["task"] == "lm" and evaluation["kind"] == "decoder_self"
    assert 0.0 < evaluation["gold_sparsity"] < 1.0
    points = evaluation["quality"]["points"]
    assert "kmeans" in {p["method"] for p in points}
    assert all(math.isfinite(p["perplexity"]) for p in points)
    assert {row["student"] for row in evaluation["students"]} == set(STUDENTS)
    # evidence over the test blocks: no decoding, no references, the teacher-forced measures with intervals
    evidence = load(lm_project, "artifacts/evaluation/quality.json")
    assert evidence["units"] == "blocks" and evidence["references"] is None
    teacher_row, *others = evidence["rows"]
    teacher_perplexity = evaluation["quality"]["teacher"]["perplexity"]
    assert teacher_row["name"] == "teacher"
    assert teacher_row["perplexity"]["value"] == pytest.approx(teacher_perplexity, rel=1e-3)
    assert all("kl" in row and "bleu" not in row and row["hypotheses"] is None for row in others)

    # the speed table: five models (SDPA, dense entmax, k-means, indexer, indexer certified) at each context,
    # predictors at their sparsest point within 5 % of the teacher's perplexity, or by recall
    speed = evaluation["speed"]
    assert [row["context"] for row in speed] == [n for n in (CONTEXT, 2 * CONTEXT) for _ in range(5)]
    teacher_perplexity = evaluation["quality"]["teacher"]["perplexity"]
    for row in speed[2:4]:
        assert row["chosen_by"] in ("perplexity", "recall")
        if row["chosen_by"] == "perplexity":
            assert row["perplexity"] <= 1.05 * teacher_perplexity
    timings = load(lm_project, "artifacts/evaluation/evaluate.timings.json")
    assert all(t["forward_seconds"] > 0 for t in timings["speed"])

    report = (lm_project / "artifacts" / "report.md").read_text()
    assert "## Speed inside the model" in report and "perplexity" in report
    assert "up to date" in dvc(lm_project, "status").stdout
