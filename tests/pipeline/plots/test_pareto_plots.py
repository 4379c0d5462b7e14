"""The report's figures and CSV tables, drawn from a hand-made evaluation."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from matplotlib.image import imread

from pipeline.plots.pareto import FILES, plot_quality, plot_recall_heatmap, write_report_plots
from tests.pipeline.evaluation.synthetic import synthetic_evaluation


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def assert_picture(path: Path, min_height: int = 150, min_width: int = 300) -> np.ndarray:
    """The PNG decodes to an RGB(A) image of a useful size that is not one flat colour."""
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] >= min_height and image.shape[1] >= min_width, image.shape
    assert image[..., :3].std() > 0.02
    return image


def test_every_file_is_written(tmp_path: Path):
    files = write_report_plots(synthetic_evaluation(), tmp_path / "report", recall_target=0.95)
    # no speed rows in the synthetic evaluation: no speed-up figure
    translation = {name: file for name, file in FILES.items() if name not in ("sparsity_accuracy", "speedup")}
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == sorted(translation.values())
    assert set(files) == set(translation)
    for path in files.values():
        assert path.is_file() and path.parent == tmp_path / "report"
        if path.suffix == ".png":
            assert_picture(path)
    # nothing temporary is left beside the folder
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_an_mqar_evaluation_gets_accuracy_against_sparsity_and_no_bleu(tmp_path: Path):
    evaluation = synthetic_evaluation()
    evaluation["task"] = "mqar"
    for rank, point in enumerate(evaluation["quality"]["points"]):
        point["accuracy"] = 0.9 - 0.05 * rank
    evaluation["quality"]["teacher"]["accuracy"] = 0.95
    files = write_report_plots(evaluation, tmp_path / "report", recall_target=0.95)
    assert "sparsity_accuracy" in files and not any("bleu" in name for name in files)
    drawn = assert_picture(files["sparsity_accuracy"], min_height=100, min_width=200)
    empty = tmp_path / "empty.png"
    evaluation["quality"]["points"] = []
    plot_quality(evaluation, "accuracy", empty)
    assert drawn.shape[0] * drawn.shape[1] > imread(empty).shape[0] * imread(empty).shape[1]


def test_rewriting_replaces_the_folder(tmp_path: Path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "stale.png").write_bytes(b"old")
    write_report_plots(synthetic_evaluation(), out, recall_target=0.95)
    assert not (out / "stale.png").exists()


def test_pareto_recall_csv_rows_and_front_flags(tmp_path: Path):
    write_report_plots(synthetic_evaluation(), tmp_path, recall_target=0.95)
    rows = read_csv(tmp_path / "pareto_recall.csv")
    assert list(rows[0]) == ["method", "label", "sparsity", "recall", "on_front"]
    # 15 settings, one with a null recall left out; methods in the fixed order, then by sparsity
    assert len(rows) == 14
    assert [r["method"] for r in rows] == ["window"] * 3 + ["bigbird"] * 4 + ["distance"] * 3 + ["kmeans"] * 4
    kmeans = [(r["label"], float(r["sparsity"]), r["on_front"]) for r in rows if r["method"] == "kmeans"]
    assert kmeans == [
        ("kmeans(buckets=2, top_k=1) w=3", 0.75, "true"),
        ("kmeans(buckets=6, top_k=1) w=3", 0.80, "false"),
        ("kmeans(buckets=4, top_k=1) w=3", 0.85, "true"),
        ("kmeans(buckets=8, top_k=1) w=3", 0.92, "true"),
    ]
    off_front = sorted(r["label"] for r in rows if r["on_front"] == "false")
    assert off_front == ["bigbird(random=4) w=1", "kmeans(buckets=6, top_k=1) w=3"]


def test_quality_csv_rows(tmp_path: Path):
    write_report_plots(synthetic_evaluation(), tmp_path, recall_target=0.95)
    rows = read_csv(tmp_path / "quality.csv")
    assert [(r["method"], r["label"]) for r in rows] == [
        ("teacher", "teacher"),
        ("window", "window() w=5"),
        ("distance", "distance(threshold=2.0) w=3"),
        ("kmeans", "kmeans(buckets=4, top_k=1) w=3"),
    ]
    assert rows[3] == {
        "method": "kmeans",
        "label": "kmeans(buckets=4, top_k=1) w=3",
        "sparsity": "0.86",
        "bleu": "19.25",
        "perplexity": "5.5",
    }


def test_quality_figures_without_points_still_say_so(tmp_path: Path):
    evaluation = synthetic_evaluation()
    evaluation["quality"]["points"] = []
    write_report_plots(evaluation, tmp_path, recall_target=0.95)
    with_points = tmp_path / "with.png"
    plot_quality(synthetic_evaluation(), "bleu", with_points)
    empty = assert_picture(tmp_path / "sparsity_bleu.png", min_height=100, min_width=200)
    assert_picture(tmp_path / "sparsity_perplexity.png", min_height=100, min_width=200)
    assert empty.shape[0] * empty.shape[1] < imread(with_points).shape[0] * imread(with_points).shape[1]
    assert read_csv(tmp_path / "quality.csv") == [
        {"method": "teacher", "label": "teacher", "sparsity": "0.87", "bleu": "20.0", "perplexity": "5.0"}
    ]


def test_heatmap_shows_the_grid_or_says_why_not(tmp_path: Path):
    evaluation = synthetic_evaluation()
    setting = evaluation["graphs"][9]
    plot_recall_heatmap(evaluation, setting, tmp_path / "grid.png")
    plot_recall_heatmap(evaluation, {**setting, "per_layer_head": None}, tmp_path / "none.png")
    plot_recall_heatmap(evaluation, None, tmp_path / "nothing.png")
    grid = assert_picture(tmp_path / "grid.png", min_height=200, min_width=300)
    none = assert_picture(tmp_path / "none.png", min_height=100, min_width=200)
    assert_picture(tmp_path / "nothing.png", min_height=100, min_width=200)
    # coloured cells and colour bar cover a good part of the grid figure; the message is black on white
    assert coloured_share(grid) > 0.2
    assert coloured_share(none) == 0.0


def coloured_share(image: np.ndarray) -> float:
    """The share of pixels that are clearly not grey (their RGB channels differ by more than 0.2)."""
    rgb = image[..., :3]
    return float((rgb.max(-1) - rgb.min(-1) > 0.2).mean())
