"""``python -m stages.report``: every output from a synthetic evaluation; a missing input is one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.pipeline.evaluation.synthetic import synthetic_evaluation
from tests.pipeline.evaluation.synthetic_evidence import synthetic_evidence
from tests.stage_runner import run_module


def run_report(tmp_path: Path, evaluation: Path, evidence: Path | None = None) -> subprocess.CompletedProcess:
    report = {
        "evaluation": str(evaluation),
        "evidence": str(evidence or tmp_path / "quality.json"),
        "sparsity_levels": [0.8, 0.9],
        "recall_target": 0.95,
        "out": str(tmp_path / "out" / "report.md"),
        "plots": str(tmp_path / "out" / "plots" / "report"),
        "metrics": str(tmp_path / "out" / "metrics" / "report.json"),
        "results": str(tmp_path / "out" / "metrics" / "results"),
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"report": report}))
    # run in tmp_path, the project folder its outputs must lie in
    return run_module("stages.report", "--params", str(tmp_path / "params.yaml"), cwd=tmp_path)


def test_stage_writes_report_metrics_and_plots(tmp_path: Path):
    evaluation = tmp_path / "evaluate.json"
    evaluation.write_text(json.dumps(synthetic_evaluation()))
    document, _ = synthetic_evidence(synthetic_evaluation(), noisy=("window() w=5",))
    (tmp_path / "quality.json").write_text(json.dumps(document))
    result = run_report(tmp_path, evaluation)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    plots = sorted(p.name for p in (out / "plots" / "report").iterdir())
    assert plots == [
        "pareto_recall.csv",
        "quality.csv",
        "recall_heatmap.png",
        "sparsity_bleu.png",
        "sparsity_perplexity.png",
        "sparsity_recall.png",
        "speed_bleu.png",
    ]
    markdown = (out / "report.md").read_text()
    assert "| kmeans | 0.960 (kmeans(buckets=4, top_k=1) w=3) |" in markdown
    # figures are linked relative to the report, and each link resolves
    links = [line[line.index("](") + 2 : -1] for line in markdown.splitlines() if line.startswith("![")]
    assert "plots/report/sparsity_recall.png" in links and len(links) == 5
    assert all((out / link).is_file() for link in links)
    headline = json.loads((out / "metrics" / "report.json").read_text())
    assert headline["best"]["method"] == "kmeans" and headline["best"]["bleu"] == 19.25
    # the evidence: its sections, and the headline's operating points with their intervals
    assert "## Claims" in markdown and "## Evidence" in markdown
    assert "window() w=5 | predicted graph" in markdown
    # the Results table, one file per row in the report's order, each value with its interval
    results = out / "metrics" / "results"
    rows = {path.stem: json.loads(path.read_text()) for path in sorted(results.iterdir())}
    assert list(rows) == ["00-teacher", "01-kmeans", "02-distance", "03-window"]
    assert rows["00-teacher"] == {
        "sparsity": 0.87, "recall": 1.0, "sentences": 120,
        "bleu": "70.52 [69.62, 71.31]", "perplexity": "5.13 [4.95, 5.33]",
    }  # fmt: skip
    assert rows["01-kmeans"]["d_bleu"] == "+0.00 [+0.00, +0.00]" and rows["01-kmeans"]["recall"] == 0.96
    # the noisy point: a difference whose interval holds 0, and KL above 0
    assert rows["03-window"]["d_bleu"] == "−0.43 [−7.39, +5.18]"
    assert rows["03-window"]["kl"] == "0.0010 [0.0010, 0.0010]" and "d_kl" not in rows["03-window"]


def test_missing_evidence_is_one_line_and_writes_nothing(tmp_path: Path):
    evaluation = tmp_path / "evaluate.json"
    evaluation.write_text(json.dumps(synthetic_evaluation()))
    result = run_report(tmp_path, evaluation, tmp_path / "absent.json")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'absent.json'}: evidence file not found (run the evaluate stage first)"
    ]
    assert not (tmp_path / "out").exists()


def test_missing_evaluation_is_one_line_and_writes_nothing(tmp_path: Path):
    result = run_report(tmp_path, tmp_path / "absent.json")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert (
        len(lines) == 1
        and lines[0].startswith("error:")
        and "absent.json: evaluation file not found" in lines[0]
    )
    assert not (tmp_path / "out").exists()
