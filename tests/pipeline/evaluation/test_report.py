"""The generated report on a hand-made evaluation (see synthetic.py for its numbers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import UserError
from pipeline.evaluation.report import build_report, load_evaluation, operating_point
from pipeline.timings import write_metrics
from tests.pipeline.evaluation.synthetic import graph, point, synthetic_evaluation


def table_rows(markdown: str, section: str) -> dict[str, list[str]]:
    """The rows of the table under ``## section``, keyed by their first cell."""
    body = markdown.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in body.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[2:]}


def findings(markdown: str) -> str:
    return markdown.split("## Findings\n", 1)[1].split("\n## ", 1)[0].strip()


def test_facts_name_the_store_and_the_teacher():
    markdown, _ = build_report(synthetic_evaluation())
    assert markdown.startswith("# Learned sparse attention: decoder_self\n")
    assert "test split, 40 sentences, 2 layers × 3 heads" in markdown
    assert "gold sparsity of the teacher's α-entmax graphs: 0.870" in markdown
    assert "BLEU 20.00 (`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0`)" in markdown
    assert "perplexity 5.00" in markdown
    assert "learned projections" not in markdown  # an evaluation without projector facts
    evaluation = synthetic_evaluation()
    evaluation["projector"] = {"n_heads": 3, "head_dim": 8, "rank": 4, "shared": True, "hidden": 32}
    markdown, _ = build_report(evaluation)
    assert (
        "- learned projections: rank 4, one tanh MLP (32 hidden) per head shared by queries and keys"
        in markdown
    )


def test_method_table_holds_the_values_at_each_threshold():
    rows = table_rows(build_report(synthetic_evaluation())[0], "Sparsity and recall per method")
    assert list(rows) == ["window", "bigbird", "distance", "kmeans", "teacher (gold graph)"]
    # recall @ s ≥ 0.8, BLEU / ppl, recall @ s ≥ 0.9, BLEU / ppl, sparsity @ r ≥ 0.95, BLEU / ppl
    assert rows["kmeans"] == [
        "0.960 (kmeans(buckets=4, top_k=1) w=3)",
        "19.25 / 5.50",
        "0.940 (kmeans(buckets=8, top_k=1) w=3)",
        "—",
        "0.850 (kmeans(buckets=4, top_k=1) w=3)",
        "19.25 / 5.50",
    ]
    assert rows["distance"][0::2] == [
        "0.970 (distance(threshold=2.0) w=3)",
        "0.930 (distance(threshold=1.0) w=3)",
        "0.820 (distance(threshold=2.0) w=3)",
    ]
    assert rows["window"] == ["0.600 (window() w=5)", "12.00 / 9.00", "0.400 (window() w=3)", "—", "—", "—"]
    # bigbird's dominated (0.70, 0.80) and its null-recall setting never win
    assert rows["bigbird"][0::2] == [
        "0.850 (bigbird(random=2) w=3)",
        "0.550 (bigbird(random=1) w=3)",
        "0.600 (bigbird(random=3) w=3)",
    ]
    # the gold graph: recall 1 at sparsity 0.87, which does not reach 0.9
    assert rows["teacher (gold graph)"] == [
        "1.000 (gold)",
        "20.00 / 5.00",
        "—",
        "—",
        "0.870 (gold)",
        "20.00 / 5.00",
    ]


def test_other_thresholds_change_the_columns():
    evaluation = synthetic_evaluation()
    markdown, head = build_report(evaluation, sparsity_levels=(0.94,), recall_target=0.9)
    rows = table_rows(markdown, "Sparsity and recall per method")
    assert rows["distance"][0] == "0.700 (distance(threshold=0.5) w=3)"
    assert rows["kmeans"][0] == "—"
    assert rows["kmeans"][2] == "0.920 (kmeans(buckets=8, top_k=1) w=3)"
    assert head["methods"]["distance"] == {"recall_at_sparsity_0.94": 0.70, "sparsity_at_recall_0.9": 0.91}


def test_quality_table_lists_every_point_against_the_teacher():
    rows = table_rows(build_report(synthetic_evaluation())[0], "Translation quality with predicted graphs")
    assert list(rows) == [
        "teacher",
        "window() w=5",
        "distance(threshold=2.0) w=3",
        "kmeans(buckets=4, top_k=1) w=3",
    ]
    # decoding sparsity, graph recall, BLEU, Δ BLEU, perplexity, forward and decode time vs the teacher
    assert rows["kmeans(buckets=4, top_k=1) w=3"] == [
        "0.860",
        "0.960",
        "19.25",
        "-0.75",
        "5.50",
        "1.50×",
        "1.20×",
    ]
    assert rows["window() w=5"][3] == "-8.00"
    assert rows["teacher"][-2:] == ["1.00×", "1.00×"]


def test_without_quality_points_the_report_says_so():
    evaluation = synthetic_evaluation()
    evaluation["quality"]["points"] = []
    markdown, head = build_report(evaluation)
    assert "No setting was decoded with its predicted graphs." in markdown
    assert table_rows(markdown, "Sparsity and recall per method")["kmeans"][1] == "—"
    assert "was not decoded with its predicted graph" in findings(markdown)
    assert head["best"]["bleu"] is None and head["best"]["label"] == "kmeans(buckets=4, top_k=1) w=3"


def test_findings_name_the_winners_from_the_numbers():
    text = findings(build_report(synthetic_evaluation())[0])
    assert "The best recall at sparsity ≥ 0.8 is distance's (0.970" in text
    assert "at sparsity ≥ 0.9 it is kmeans's (0.940" in text
    # kmeans has nothing as sparse as window's 0.93 setting; distance has (0.95, 0.70)
    assert "Every baseline's sparsity–recall front is Pareto-dominated" in text
    assert "window by distance;" in text and "bigbird by distance, kmeans" in text
    assert "At recall ≥ 0.95 the sparsest setting is kmeans's: sparsity 0.850" in text
    assert "BLEU 19.25 (-0.75 vs the teacher's 20.00)" in text
    assert "perplexity 5.50 (+0.50 vs the teacher's 5.00)" in text
    assert 2 <= text.count(". ") + 1 <= 4


def test_findings_follow_the_numbers_when_they_change():
    evaluation = synthetic_evaluation()
    for row in evaluation["graphs"]:
        if row["method"] == "window":
            row["recall"] = min(1.0, row["recall"] + 0.3)  # window now beats both learned fronts somewhere
        if row["method"] == "kmeans":
            row["method"] = "kmeans_renamed"  # a method the report has never heard of counts as a baseline
    text = findings(build_report(evaluation)[0])
    assert "The best recall at sparsity ≥ 0.8 is distance's" in text
    assert "at sparsity ≥ 0.9 it is kmeans_renamed's" in text
    assert (
        "The sparsity–recall fronts of bigbird are Pareto-dominated by a learned method (bigbird by distance)"
        in text
    )
    assert "those of window, kmeans_renamed are not" in text


def test_no_setting_reaching_the_target():
    markdown, head = build_report(synthetic_evaluation(), recall_target=1.0)
    assert "No setting reaches recall ≥ 1; the highest recall is kmeans's 0.990 at sparsity 0.750" in markdown
    assert head["best"] == dict.fromkeys(("method", "label", "sparsity", "recall", "bleu", "perplexity"))
    assert all(m["sparsity_at_recall_1"] is None for m in head["methods"].values())


def test_headline_json():
    _, head = build_report(synthetic_evaluation())
    assert (
        head["gold_sparsity"] == 0.87 and head["teacher_bleu"] == 20.0 and head["teacher_perplexity"] == 5.0
    )
    assert head["methods"]["kmeans"] == {
        "recall_at_sparsity_0.8": 0.96,
        "recall_at_sparsity_0.9": 0.94,
        "sparsity_at_recall_0.95": 0.85,
    }
    assert head["methods"]["window"]["sparsity_at_recall_0.95"] is None
    assert head["best"] == {
        "method": "kmeans",
        "label": "kmeans(buckets=4, top_k=1) w=3",
        "sparsity": 0.85,
        "recall": 0.96,
        "bleu": 19.25,
        "perplexity": 5.5,
    }
    json.dumps(head, allow_nan=False)  # a DVC metric: plain JSON


def test_operating_point_prefers_learned_methods():
    evaluation = synthetic_evaluation()
    assert operating_point(evaluation, 0.95)["label"] == "kmeans(buckets=4, top_k=1) w=3"
    # nothing learned reaches 0.995: the learned setting with the highest recall
    assert operating_point(evaluation, 0.995)["label"] == "kmeans(buckets=2, top_k=1) w=3"
    baselines_only = {
        **evaluation,
        "graphs": [r for r in evaluation["graphs"] if r["method"] in ("window", "bigbird")],
    }
    assert operating_point(baselines_only, 0.95)["label"] == "bigbird(random=3) w=3"


def test_figures_are_linked():
    markdown, _ = build_report(
        synthetic_evaluation(), figures=[("Fronts", "plots/report/sparsity_recall.png")]
    )
    assert "## Figures\n\n![Fronts](plots/report/sparsity_recall.png)" in markdown


def write(path: Path, obj) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def test_load_evaluation_reads_a_valid_file(tmp_path: Path):
    evaluation = synthetic_evaluation()
    assert load_evaluation(write(tmp_path / "evaluate.json", evaluation)) == evaluation


def test_load_evaluation_puts_the_wall_times_of_the_timings_file_back(tmp_path: Path):
    """The evaluate stage writes times apart (evaluate.json stays reproducible); the report reads both."""
    evaluation = synthetic_evaluation()
    write_metrics(tmp_path / "evaluate.json", evaluation, tmp_path / "times.json")
    kept = json.loads((tmp_path / "evaluate.json").read_text())
    assert "decode_seconds" not in kept["quality"]["teacher"]
    assert load_evaluation(tmp_path / "evaluate.json", tmp_path / "times.json") == evaluation
    without = load_evaluation(tmp_path / "evaluate.json", tmp_path / "absent.json")
    assert "| teacher | 0.870 | 1.000 | 20.00 | +0.00 | 5.00 | — | — |" in build_report(without)[0]
    write(tmp_path / "times.json", '{"quality": ')
    with pytest.raises(UserError, match=r"times\.json: not valid JSON"):
        load_evaluation(tmp_path / "evaluate.json", tmp_path / "times.json")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.pop("graphs"), "top level lacks the key 'graphs'"),
        (lambda e: e.pop("gold_sparsity"), "top level lacks the key 'gold_sparsity'"),
        (lambda e: e["graphs"][3].pop("recall"), "graphs[3] lacks the key 'recall'"),
        (lambda e: e["graphs"][0].pop("method"), "graphs[0] lacks the key 'method'"),
        (lambda e: e["graphs"][1].update(sparsity="high"), "graphs[1].sparsity = 'high' is not a number"),
        (lambda e: e.update(graphs=[]), "'graphs' must be a non-empty list"),
        (lambda e: e["quality"].pop("points"), "quality lacks the key 'points'"),
        (lambda e: e["quality"]["points"][0].pop("bleu"), "quality.points[0] lacks the key 'bleu'"),
    ],
)
def test_load_evaluation_names_the_missing_key_and_the_file(tmp_path: Path, mutate, message: str):
    evaluation = synthetic_evaluation()
    mutate(evaluation)
    path = write(tmp_path / "evaluate.json", evaluation)
    with pytest.raises(UserError) as err:
        load_evaluation(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_load_evaluation_missing_file_and_bad_json(tmp_path: Path):
    with pytest.raises(UserError, match="evaluation file not found"):
        load_evaluation(tmp_path / "absent.json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_evaluation(write(tmp_path / "broken.json", '{"kind": '))
    with pytest.raises(UserError, match="top level must be a mapping, got list"):
        load_evaluation(write(tmp_path / "list.json", [1, 2]))


def test_indexer_table_compares_the_fittings_per_rank():
    evaluation = synthetic_evaluation()  # gold sparsity 0.87: the goal is recall ≥ 0.99 at sparsity ≥ 0.84
    assert "τ-indexer" not in build_report(evaluation)[0]

    def indexer(rank: int, fitting: str, margin: float, sparsity: float, recall: float) -> dict:
        return graph("indexer", {"rank": rank, "fitting": fitting, "margin": margin}, 0, sparsity, recall)

    rows = [
        indexer(8, "pca", 0.0, 0.86, 0.985),
        indexer(8, "pca", 0.1, 0.83, 0.995),  # sparser than the level allows
        indexer(8, "distill", 0.0, 0.85, 0.993),
        indexer(2, "distill", 0.0, 0.85, 0.96),
        indexer(2, "pca", 0.0, 0.86, 0.93),
    ]
    evaluation["graphs"] += rows
    evaluation["quality"]["points"].append(point(rows[2], 0.85, 19.95, 5.02, 1.0, 10.0))
    markdown, _ = build_report(evaluation)
    table = markdown.split("## τ-indexer: rank and fitting\n", 1)[1]
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| rank | fitting | recall @ sparsity ≥ 0.840 |")
    assert [line.split(" | ")[:3] for line in lines[2:]] == [
        ["| 2", "distill", "0.960 (indexer(rank=2, fitting=distill, margin=0.0) w=0)"],
        ["| 2", "pca", "0.930 (indexer(rank=2, fitting=pca, margin=0.0) w=0)"],
        ["| 8", "distill", "0.993 (indexer(rank=8, fitting=distill, margin=0.0) w=0)"],
        ["| 8", "pca", "0.985 (indexer(rank=8, fitting=pca, margin=0.0) w=0)"],
    ]
    assert "19.95 / 5.02" in lines[4]  # the decoded distilled rank-8 point
    assert lines[5].split(" | ")[4] == "0.830 (indexer(rank=8, fitting=pca, margin=0.1) w=0)"
    assert "(gold − 0.03): rank 2: distill, rank 8: distill." in table


def test_speed_rows_out_of_memory_say_so():
    evaluation = synthetic_evaluation()
    evaluation["speed"] = [
        {"context": 1024, "model": "softmax (sdpa)", "forward_seconds": 0.5},
        {"context": 1024, "model": "entmax (dense)", "status": "out of memory"},
    ]
    markdown, _ = build_report(evaluation)
    table = markdown.split("## Speed inside the model")[1]
    assert "| 1024 | entmax (dense) | — | — | — | out of memory | — |" in table
    assert "| 1024 | softmax (sdpa) | — | — | — | 2,048 | — | 1.00× |" in table  # 1024 tokens in 0.5 s
