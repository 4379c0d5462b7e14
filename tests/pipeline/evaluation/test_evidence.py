"""The evaluate stage's evidence: one row per model with its intervals and paired differences (from the
teacher, the dense control, and for a twin or self-ensemble its own student), and the files behind them,
from which anyone recomputes each row's BLEU and its paired interval."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from pipeline.errors import UserError
from pipeline.evaluation.evidence import REFERENCES, file_name, gather_evidence, row_facts, write_evidence
from pipeline.evaluation.intervals import SystemScores, quality_rows
from pipeline.params.evaluate import Quality
from tests.pipeline.evaluation.synthetic_evidence import references, scores, synthetic_evidence
from tests.pipeline.evaluation.test_report_evidence import dense_student
from tests.pipeline.evaluation.test_report_students import with_students


def evaluation_with_students() -> dict:
    evaluation = with_students()
    evaluation["students"][0]["untrained"] = {"bleu": 18.0, "perplexity": 6.5, "sparsity": 0.71}
    evaluation["students"][0]["attention"] = "sparsefinder"
    evaluation["students"].append(dense_student("control"))
    return evaluation


def test_file_names_are_plain_and_never_shared():
    taken: set[str] = set()
    assert (
        file_name("indexer(rank=16, margin=0.0) w=0 g=0", taken) == "indexer_rank=16_margin=0.0_w=0_g=0.txt"
    )
    assert (
        file_name("indexer(rank=16, margin=0.0) w=0 g=0", taken) == "indexer_rank=16_margin=0.0_w=0_g=0_2.txt"
    )
    assert file_name("../../etc/passwd", taken) == ".._.._etc_passwd.txt"  # no separator survives
    assert file_name("references", taken) == "references_2.txt"  # the references' own name is kept apart


def test_every_model_is_a_row_compared_with_the_teacher_the_control_and_its_student():
    evaluation = evaluation_with_students()
    facts = row_facts(evaluation)
    assert list(facts) == [
        "teacher",
        "kmeans(buckets=4, top_k=1) w=3",
        "distance(threshold=2.0) w=3",
        "window() w=5",
        "sparsefinder",
        "sparsefinder untrained",
        "ssa",
        "ssa S=1",
        "ssa S=4",
        "control",
    ]
    document, _ = synthetic_evidence(evaluation, worse=("ssa",))
    rows = {row["name"]: row for row in document["rows"]}
    assert document["dense_control"] == "control"
    assert "vs_teacher" not in rows["teacher"] and "vs_dense" not in rows["control"]
    assert set(rows["ssa"]) >= {"vs_teacher", "vs_dense"} and "vs_student" not in rows["ssa"]
    # a self-ensemble against its own student: ssa is worse, so the ensemble (the teacher's outputs) is better
    assert rows["ssa S=4"]["vs_student"]["bleu"]["ci95"][0] > 0
    assert rows["sparsefinder untrained"]["vs_student"]["bleu"]["diff"] == 0.0
    assert rows["sparsefinder untrained"]["sparsity"] == 0.71 and rows["window() w=5"]["recall"] == 0.6
    assert {row["sentences"] for row in rows.values()} == {120}


def test_the_saved_files_recompute_each_rows_bleu_and_its_interval(tmp_path: Path):
    evaluation = evaluation_with_students()
    document, files = synthetic_evidence(evaluation, worse=("ssa", "window() w=5"), resamples=300)
    write_evidence(
        type("Found", (), {"document": document, "files": files})(), tmp_path / "q.json", tmp_path / "h"
    )
    saved = json.loads((tmp_path / "q.json").read_text())
    assert saved == document
    folder = tmp_path / "h"
    references = (folder / REFERENCES).read_text().splitlines()
    assert len(references) == 120
    teacher = (folder / saved["rows"][0]["hypotheses"]).read_text().splitlines()
    for row in saved["rows"]:
        hypotheses = (folder / row["hypotheses"]).read_text().splitlines()
        assert len(hypotheses) == len(references)
        # sacreBLEU itself, from the files alone
        assert abs(BLEU().corpus_score(hypotheses, [references]).score - row["bleu"]["value"]) < 1e-9
        if row["name"] == "teacher":
            continue
        again = quality_rows(
            {"teacher": SystemScores(teacher), "row": SystemScores(hypotheses)},
            references,
            count=saved["resamples"],
            seed=saved["bootstrap_seed"],
        )[1]["vs_teacher"]["bleu"]
        assert again["ci95"] == row["vs_teacher"]["bleu"]["ci95"]


@pytest.mark.parametrize("name", ["teacher", "window() w=5", "sparsefinder untrained"])
def test_a_student_named_like_another_row_is_refused(name: str):
    evaluation = evaluation_with_students()
    evaluation["students"][1]["student"] = name  # the ssa student
    with pytest.raises(UserError, match=f"its evidence row '{re.escape(name)}' is already another model's"):
        synthetic_evidence(evaluation)


def test_a_student_trained_on_several_seeds_is_one_row_with_a_file_per_seed(tmp_path: Path):
    evaluation = evaluation_with_students()
    evaluation["students"][1]["seeds"] = {"seed-0": {"bleu": 1.0}, "seed-1": {"bleu": 2.0}}  # the ssa student
    refs = references(120)
    produced = {name: scores("same", refs, seed=0) for name in row_facts(evaluation)}
    produced["ssa"] = [scores("same", refs, seed=0), scores("worse", refs, seed=0)]
    found = gather_evidence(evaluation, produced, refs, quality=Quality(resamples=200), split_units=120)
    write_evidence(found, tmp_path / "q.json", tmp_path / "h")
    rows = {row["name"]: row for row in found.document["rows"]}
    ssa = rows["ssa"]
    assert ssa["seeds"] == ["seed-0", "seed-1"] and ssa["hypotheses"] == ["ssa_seed-0.txt", "ssa_seed-1.txt"]
    seed_bleu = [
        BLEU().corpus_score((tmp_path / "h" / name).read_text().splitlines(), [refs]).score
        for name in ssa["hypotheses"]
    ]
    assert ssa["bleu"]["spread"]["seeds"] == pytest.approx(seed_bleu, abs=1e-9)
    assert ssa["bleu"]["value"] == pytest.approx(sum(seed_bleu) / 2, abs=1e-9)
    # one seed is the teacher's own outputs, the other worse: the mean is worse, the spread wide
    assert ssa["vs_teacher"]["bleu"]["significant"] and ssa["vs_teacher"]["bleu"]["diff"] < 0
    assert ssa["bleu"]["spread"]["sd"] > 1.0
    # the twin and ensembles of that student, and every other row, keep one file each
    assert isinstance(rows["ssa S=4"]["hypotheses"], str) and "seeds" not in rows["teacher"]
