"""The report follows the evidence: a difference is written with its interval, "keeps" only within the
tolerance, "better"/"worse" only when the interval excludes 0, otherwise "not distinguishable on N
sentences"; the Claims section judges each paper's claim the same way."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pipeline.errors import UserError
from pipeline.evaluation.report import attach_evidence, build_report, load_evidence
from pipeline.evaluation.report.claims import FAILS, HOLDS, UNDECIDED, quality_claim
from pipeline.evaluation.report.verdicts import difference_text, judged, reversed_entry, value_text
from tests.pipeline.evaluation.synthetic import synthetic_evaluation
from tests.pipeline.evaluation.synthetic_evidence import synthetic_evidence
from tests.pipeline.evaluation.test_report_students import section, with_students

TOLERANCES = {"bleu": 0.5, "chrf": 0.5, "perplexity": 0.01, "kl": 0.01, "agreement": 0.01, "accuracy": 0.01}
KMEANS, DISTANCE, WINDOW = "kmeans(buckets=4, top_k=1) w=3", "distance(threshold=2.0) w=3", "window() w=5"


def dense_student(name: str = "dense") -> dict:
    row = copy.deepcopy(with_students()["students"][1])
    row.pop("ensembles")
    return {**row, "student": name, "attention": "entmax"}


def evaluation_with_evidence(**kinds) -> dict:
    evaluation = with_students()
    evaluation["students"][0]["attention"] = "sparsefinder"
    evaluation["students"][1]["attention"] = "ssa"
    evaluation["students"].append(dense_student())
    document, _ = synthetic_evidence(evaluation, **kinds)
    return attach_evidence(evaluation, document)


def row_of(evaluation: dict, name: str) -> dict:
    return next(row for row in evaluation["evidence"]["rows"] if row["name"] == name)


def test_identical_outputs_keep_the_teachers_quality():
    evaluation = evaluation_with_evidence()
    entry = row_of(evaluation, KMEANS)["vs_teacher"]["bleu"]
    assert entry == {"diff": 0.0, "ci95": [0.0, 0.0], "significant": False}
    assert judged(entry, "bleu", TOLERANCES, "120 sentences").startswith("keeps BLEU (+0.00 [+0.00, +0.00]")


def test_a_noisy_row_is_not_distinguishable_and_the_report_says_so():
    evaluation = evaluation_with_evidence(noisy=(WINDOW, "ssa"))
    entry = row_of(evaluation, WINDOW)["vs_teacher"]["bleu"]
    low, high = entry["ci95"]
    assert low < 0 < high and (low < -0.5 or high > 0.5)  # holds 0, reaches past the tolerance
    markdown, _ = build_report(evaluation, tolerances=TOLERANCES)
    assert f"| {WINDOW} | predicted graph |" in markdown
    evidence = section(markdown, "Evidence")
    window_line = next(line for line in evidence.splitlines() if line.startswith(f"| {WINDOW} "))
    assert window_line.endswith("BLEU n.d., perplexity n.d., KL keeps |")
    # the students' sentences: ssa against the dense control, in words and with its interval
    students = section(markdown, "Students")
    assert "ssa is not distinguishable in BLEU on 120 sentences (" in students
    claims = section(markdown, "Claims")
    ssa_claim = next(line for line in claims.splitlines() if line.startswith("| SSA "))
    assert f"**{UNDECIDED}**" in ssa_claim and "not distinguishable in BLEU on 120 sentences" in ssa_claim
    # Sparsefinder's own predictors are judged at the teacher's sparsity by their best decoded point (here
    # distance, recall 0.97, decoded at 0.83 ≥ 0.87 − 0.1, identical to the teacher); no τ-indexer point
    lines = claims.splitlines()
    at_gold = next(line for line in lines if "near-teacher quality" in line)
    assert f"**{HOLDS}**" in at_gold and f"{DISTANCE} (sparsity 0.830, graph recall 0.970)" in at_gold
    indexer = next(line for line in lines if line.startswith("| τ-indexer"))
    assert "**not tested**" in indexer and "no point of indexer was decoded" in indexer


def test_a_worse_row_is_worse_and_its_claim_does_not_hold():
    evaluation = evaluation_with_evidence(worse=("ssa",))
    compared = row_of(evaluation, "ssa")["vs_dense"]
    assert compared["bleu"]["significant"] and compared["bleu"]["ci95"][1] < 0
    assert compared["perplexity"]["ci95"][0] > 0.2  # 30 % more NLL per token: far more perplexity
    assert judged(compared["bleu"], "bleu", TOLERANCES, "120 sentences").startswith("has worse BLEU (−")
    markdown, _ = build_report(evaluation, tolerances=TOLERANCES)
    ssa_claim = next(line for line in section(markdown, "Claims").splitlines() if line.startswith("| SSA "))
    assert f"**{FAILS}**" in ssa_claim
    # the sparsefinder student matches the dense control exactly: SSA's outcome is its own
    assert (
        quality_claim(row_of(evaluation, "sparsefinder")["vs_dense"], ["bleu"], TOLERANCES, "n")[0] == HOLDS
    )


def test_tables_show_paired_differences_with_their_intervals():
    evaluation = evaluation_with_evidence(worse=(DISTANCE,))
    markdown, _ = build_report(evaluation, tolerances=TOLERANCES)
    quality = section(markdown, "Translation quality with predicted graphs")
    distance = next(line for line in quality.splitlines() if line.startswith(f"| {DISTANCE} "))
    shown = difference_text(row_of(evaluation, DISTANCE)["vs_teacher"]["bleu"], "bleu")
    assert f"| {shown} |" in distance and shown.startswith("−")
    # without evidence the same table shows the point difference, as before
    plain, _ = build_report(synthetic_evaluation())
    assert "## Evidence" not in plain and "## Claims" not in plain


def test_a_claim_fails_only_when_the_interval_lies_past_the_tolerance():
    """Worse than the reference (the interval excludes 0) is not yet "not as good as": only an interval
    wholly past the tolerance rules that out."""
    reaching = {"bleu": {"diff": -0.7, "ci95": [-1.26, -0.12], "significant": True}}
    assert quality_claim(reaching, ["bleu"], TOLERANCES, "516 sentences")[0] == UNDECIDED
    past = {"bleu": {"diff": -1.2, "ci95": [-1.7, -0.6], "significant": True}}
    assert quality_claim(past, ["bleu"], TOLERANCES, "516 sentences")[0] == FAILS
    higher = {"perplexity": {"diff": 0.03, "ci95": [0.02, 0.04], "significant": True}}  # lower is better
    assert quality_claim(higher, ["perplexity"], TOLERANCES, "516 sentences")[0] == FAILS


def test_differences_read_both_ways():
    relative = {"diff": 0.25, "ci95": [0.0, 1.0], "significant": False}
    flipped = reversed_entry(relative, "perplexity")  # b / a − 1 when a / b − 1 = 0.25
    assert flipped["diff"] == pytest.approx(-0.2) and flipped["ci95"] == pytest.approx([-0.5, 0.0])
    assert difference_text(relative, "perplexity") == "+25.0 % [+0.0, +100.0]"
    # a float a hair below zero (two sums of the same outputs in another order) is written as zero
    tiny = {"diff": -1e-13, "ci95": [-2e-13, 0.0], "significant": True}
    assert difference_text(tiny, "bleu") == "+0.00 [+0.00, +0.00]"
    assert reversed_entry({"diff": 1.0, "ci95": [0.5, 2.0], "significant": True}, "bleu")["ci95"] == [
        -2.0,
        -0.5,
    ]


def test_a_mean_over_seeds_shows_its_spread_and_the_report_says_how_many_seeds():
    evaluation = evaluation_with_evidence()
    markdown, _ = build_report(evaluation, tolerances=TOLERANCES)
    assert "one training seed per student" in markdown and "Each student was trained once" in markdown
    ssa = row_of(evaluation, "ssa")
    ssa["seeds"] = ["seed-0", "seed-1", "seed-2"]
    ssa["bleu"]["spread"] = {"seeds": [17.0, 18.0, 19.0], "sd": 1.0}
    assert value_text(ssa["bleu"], "bleu").endswith("] sd 1.00")
    assert value_text(row_of(evaluation, "teacher")["bleu"], "bleu").endswith("]")
    markdown, _ = build_report(evaluation, tolerances=TOLERANCES)
    assert "3 training seeds per student (their mean; sd: their spread)" in section(markdown, "Claims")
    assert "Each student was trained 3 times (one seed each): its row is the mean over the seeds" in markdown
    ssa_line = next(
        line for line in section(markdown, "Headline").splitlines() if line.startswith("| student: ssa")
    )
    assert "sd 1.00" in ssa_line


def test_evidence_file_is_checked_where_it_is_read(tmp_path: Path):
    document, _ = synthetic_evidence(synthetic_evaluation())
    path = tmp_path / "quality.json"
    path.write_text(json.dumps(document))
    assert load_evidence(path)["rows"][0]["name"] == "teacher"
    broken = copy.deepcopy(document)
    broken["rows"][1]["vs_teacher"]["bleu"]["ci95"] = [1.0, -1.0]
    path.write_text(json.dumps(broken))
    with pytest.raises(UserError, match=r"rows\[1\]\.vs_teacher\.bleu must hold a number and ci95"):
        load_evidence(path)
    broken = copy.deepcopy(document)
    broken["rows"][1]["vs_teacher"]["bleu"]["significant"] = True  # its interval is [0, 0]
    path.write_text(json.dumps(broken))
    with pytest.raises(UserError, match=r"rows\[1\]\.vs_teacher\.bleu\.significant must say"):
        load_evidence(path)
    broken = copy.deepcopy(document)
    broken["rows"][3]["sentences"] = 119
    path.write_text(json.dumps(broken))
    with pytest.raises(UserError, match=r"rows\[3\]\.sentences = 119, not the teacher's 120"):
        load_evidence(path)
    stale = synthetic_evaluation()
    stale["quality"]["sentences"] = 100
    with pytest.raises(UserError, match="the evidence covers 120 sentences, the evaluation 100"):
        attach_evidence(stale, document)
    broken = copy.deepcopy(document)
    broken["rows"][2]["name"] = "teacher"
    path.write_text(json.dumps(broken))
    with pytest.raises(UserError, match=r"rows\[2\]\.name = 'teacher' is not a name of its own"):
        load_evidence(path)
