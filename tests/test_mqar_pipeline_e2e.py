"""The associative-recall profile end to end: ``dvc repro report`` of ``configs/mqar.yaml`` shrunk to micro
sizes (64-token examples of 8 pairs, a two-layer Llama, a handful of steps) in a temporary copy of the
project: generated corpus, softmax then α-entmax decoder, graphs, predictors, students, accuracy at the
answers near and far with intervals, the report's associative-recall table; then the saved teacher scored
on fresh examples from the ``mqar.json`` it carries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.test_pipeline_e2e import MICRO_PREDICTORS, dvc, load, project_copy, run, shrunk_profile

pytestmark = pytest.mark.slow

LENGTH, PAIRS = 64, 8
# configs/mqar.yaml's keys changed for micro sizes, as (section path, values)
MICRO = [
    (
        ("prepare", "mqar"),
        {
            "vocab_size": 128,
            "input_seq_len": LENGTH,
            "num_kv_pairs": PAIRS,
            "train_mixture": [
                {"input_seq_len": 32, "num_kv_pairs": 4, "examples": 48},
                {"input_seq_len": LENGTH, "num_kv_pairs": PAIRS, "examples": 16},
            ],
            "valid_examples": 8,
            "test_examples": 8,
        },
    ),
    (
        ("pretrain", "model"),
        {"d_model": 32, "decoder_layers": 2, "heads": 2, "ffn_dim": 64, "max_positions": LENGTH},
    ),
    # a handful of steps learn nothing: the plateau guard is off here (its own tests refuse such models)
    (("pretrain",), {"unigram_margin": None}),
    (("teacher",), {"unigram_margin": None}),
    (
        ("pretrain", "train"),
        {"max_steps": 20, "batch_size": 8, "lr": 0.01, "warmup_steps": 2, "eval_steps": 20, "save_steps": 20}
        | {"restarts": [{"step": 12, "lr": 0.005}]},
    ),
    (("pretrain", "eval"), {"batch_size": 4, "test_examples": 4, "sparsity_examples": 2}),
    (
        ("teacher", "train"),
        {"max_steps": 4, "batch_size": 4, "warmup_steps": 1, "eval_steps": 4, "save_steps": 4},
    ),
    (("teacher", "eval"), {"batch_size": 4, "test_examples": 4, "sparsity_examples": 2}),
    *MICRO_PREDICTORS,
    (("evaluate", "quality"), {"examples": 4, "batch_size": 2, "resamples": 200}),
    (("evaluate", "speed"), {"contexts": [LENGTH], "repeats": 1}),
    (("student", "train"), {"max_steps": 3, "eval_steps": 3, "save_steps": 3, "logging_steps": 3}),
    (("student", "eval"), {"test_examples": 2, "sparsity_examples": 2}),
    (("student", "instances", "ssa"), {"keys": 8}),
]
STUDENTS = ("sparsefinder", "ssa", "dense")


@pytest.fixture(scope="module")
def mqar_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project whose params.yaml is the micro-sized mqar profile."""
    params = yaml.safe_dump(shrunk_profile("mqar.yaml", MICRO), sort_keys=False)
    return project_copy(tmp_path_factory.mktemp("mqar-project"), params)


def test_dvc_repro_of_the_mqar_profile_runs_through_the_report(mqar_project: Path) -> None:
    dvc(mqar_project, "repro", "report")

    card = load(mqar_project, "artifacts/data/corpus.json")
    assert card == {"task": "mqar", "context": LENGTH}
    task = load(mqar_project, "artifacts/data/mqar.json")
    assert (task["input_seq_len"], task["num_kv_pairs"], task["token_offset"]) == (LENGTH, PAIRS, 0)
    # the teacher and every model configured or distilled from it say what task they solve
    for folder in ("models/pretrain", "models/teacher", "models/sparsefinder", "students/dense/seed-0"):
        assert load(mqar_project, f"artifacts/{folder}/mqar.json") == task
    teacher = load(mqar_project, "artifacts/metrics/teacher.json")
    assert teacher["valid"]["tokens"] == 8 * PAIRS  # the answers alone are scored
    assert 0.0 <= teacher["valid"]["accuracy"] <= 1.0

    evaluation = load(mqar_project, "artifacts/evaluation/evaluate.json")
    assert evaluation["task"] == "mqar" and evaluation["kind"] == "decoder_self"
    assert 2 <= evaluation["far_gap"] <= LENGTH
    assert {row["student"] for row in evaluation["students"]} == set(STUDENTS)
    evidence = load(mqar_project, "artifacts/evaluation/quality.json")
    for row in evidence["rows"]:
        for key in ("accuracy", "accuracy_near", "accuracy_far"):
            low, high = row[key]["ci95"]
            assert low <= row[key]["value"] <= high
    report = (mqar_project / "artifacts" / "report.md").read_text()
    assert "## Associative recall by query distance" in report
    assert f"near (key ≤ {evaluation['far_gap']} back)" in report
    assert (mqar_project / "artifacts" / "plots" / "report" / "sparsity_accuracy.png").is_file()
    assert "(plots/report/sparsity_accuracy.png)" in report
    assert "up to date" in dvc(mqar_project, "status", "report").stdout

    scored = mqar_project / "score.json"
    run(
        mqar_project,
        "python",
        "-m",
        "pipeline",
        "score",
        "artifacts/models/teacher",
        "--examples",
        "16",
        "--json",
        str(scored),
    )
    scores = json.loads(scored.read_text())
    assert scores["examples"] == 16 and scores["answers"] == 16 * PAIRS
