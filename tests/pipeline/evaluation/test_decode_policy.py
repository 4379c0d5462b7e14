"""Which models are decoded: with ``evaluate.quality.decode: operating`` the teacher, the students and each
method's operating point are decoded for BLEU, every other point is scored teacher-forced alone; the report
quotes decoded points only, and a point without BLEU is accepted where the evaluation is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.evaluation.evidence import gather_evidence, row_facts
from pipeline.evaluation.quality import operating_labels, translation_quality
from pipeline.evaluation.report import build_report, load_evaluation
from pipeline.evaluation.report.evidence import preamble
from pipeline.evaluation.report.headline import operating_points
from pipeline.metrics.teacher_forced import Scoring, teacher_targets, unit_sums
from pipeline.params.evaluate import Quality
from tests.pipeline.evaluation.synthetic import synthetic_evaluation
from tests.pipeline.evaluation.synthetic_evidence import references, scores
from tests.pipeline.metrics.test_teacher_forced import dataset, model


def graph_row(method: str, label: str, sparsity: float, recall: float) -> tuple[None, dict]:
    return None, {"method": method, "label": label, "sparsity": sparsity, "recall": recall}


def test_the_operating_point_is_the_sparsest_reaching_the_target_else_the_highest_recall():
    points = [
        graph_row("kmeans", "k1", 0.80, 0.97),
        graph_row("kmeans", "k2", 0.85, 0.96),  # the sparsest reaching 0.95
        graph_row("kmeans", "k3", 0.92, 0.90),
        graph_row("window", "w1", 0.85, 0.60),
        graph_row("window", "w2", 0.70, 0.80),  # none reaches 0.95: the highest recall
        graph_row("distance", "d1", 0.90, 0.70),
        graph_row("distance", "d2", 0.95, 0.70),  # equal recall: the sparser
    ]
    assert operating_labels(points, 0.95) == {"k2", "w2", "d2"}
    assert operating_labels(points, float("inf")) == {"k1", "w2", "d2"}


def test_a_point_scored_teacher_forced_alone_has_no_bleu_and_the_same_sums():
    data, teacher, student = dataset(), model(0), model(1)
    scoring = Scoring("translation", 4)
    targets = teacher_targets(teacher, data, scoring)
    row, scores = translation_quality(
        student, None, data, batch_size=4, scoring=scoring, teacher=targets, decode=False
    )
    assert row["decoded"] is False and "bleu" not in row and "decode_seconds" not in row
    assert scores.hypotheses is None
    sums = unit_sums(student, data, scoring, targets)
    for name in ("nll", "tokens", "kl", "agree"):
        assert getattr(scores, name).tolist() == sums[name].tolist(), name
    assert row["kl"] == round(float(sums["kl"].sum() / sums["tokens"].sum()), 4) and row["kl"] > 0.0


def test_the_report_quotes_decoded_points_and_shows_a_dash_for_the_others(tmp_path: Path):
    evaluation = synthetic_evaluation()
    kmeans = next(p for p in evaluation["quality"]["points"] if p["method"] == "kmeans")
    # the sparser kmeans point reaching 0.95 would be the operating point, but it was not decoded
    forced = {**kmeans, "label": "kmeans(buckets=8) w=3", "graph_sparsity": 0.9, "graph_recall": 0.96}
    for key in ("bleu", "signature", "decode_seconds"):
        forced.pop(key)
    forced["decoded"] = False
    evaluation["quality"]["points"].append(forced)
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps(evaluation))
    loaded = load_evaluation(path)
    assert [p["label"] for p in operating_points(loaded, 0.95) if p["method"] == "kmeans"] == [
        kmeans["label"]
    ]
    markdown, _ = build_report(loaded)
    line = next(row for row in markdown.splitlines() if row.startswith("| kmeans(buckets=8) w=3 "))
    assert "| — |" in line


@pytest.mark.parametrize("decoded", [True, False])
def test_a_point_without_bleu_is_refused_unless_scored_teacher_forced(tmp_path: Path, decoded: bool):
    evaluation = synthetic_evaluation()
    point = evaluation["quality"]["points"][0]
    point.pop("bleu")
    point["decoded"] = decoded
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps(evaluation))
    if decoded:
        with pytest.raises(Exception, match=r"quality.points\[0\]"):
            load_evaluation(path)
    else:
        assert load_evaluation(path)["quality"]["points"][0]["decoded"] is False


@pytest.mark.parametrize("decode", ["all", "operating"])
def test_the_evidence_says_which_models_were_decoded(decode: str):
    evaluation = {**synthetic_evaluation(), "students": []}
    refs = references(20)
    produced = {name: scores("same", refs, seed=0) for name in row_facts(evaluation)}
    found = gather_evidence(evaluation, produced, refs, quality=Quality(decode=decode), split_units=20)
    assert found.document["decoding"]["decoded"] == decode
    said = preamble(found.document)
    if decode == "all":
        assert "every model decoded greedily with at most 80 new tokens." in said
    else:
        assert "the teacher, every student and each method's operating point decoded greedily" in said
        assert "the other points are scored teacher-forced alone: they have no BLEU or chrF" in said
