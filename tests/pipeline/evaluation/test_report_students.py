"""Students in the report, its headline, its figures and its CSV (see synthetic.py for the other numbers).

Two students beside the synthetic teacher (BLEU 20.0, perplexity 5.0, decode 10 s):

    sparsefinder  sparsity 0.70, BLEU 19.1, ppl 6.0, decode 12.5 s, train step 0.30 s vs the teacher's 0.20 s
    ssa           sparsity 0.00, BLEU 18.0, ppl 5.5, decode  9.0 s, train step 0.25 s vs the teacher's 0.20 s,
                  self-ensembles S=1 (BLEU 17.5, ppl 5.75, 8 s) and S=4 (BLEU 18.5, ppl 5.25, 30 s)

The highest-BLEU predictor point at sparsity ≥ 0.65 (and so at ≥ −0.05) is distance(threshold=2.0) w=3:
BLEU 19.5 at sparsity 0.83.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from pipeline.errors import UserError
from pipeline.evaluation.report import build_report, load_evaluation
from pipeline.plots import pareto
from pipeline.plots.pareto import plot_quality, write_report_plots
from pipeline.timings import write_metrics
from tests.pipeline.evaluation.synthetic import synthetic_evaluation
from tests.pipeline.plots.test_pareto_plots import assert_picture


def student(name: str, sparsity: float, bleu: float, perplexity: float, decode: float, step: float) -> dict:
    """A student row as the evaluate stage writes it (timings included, as load_evaluation returns them)."""
    return {
        "student": name,
        "bleu": bleu,
        "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0",
        "perplexity": perplexity,
        "sparsity": sparsity,
        "computed_fraction_per_layer": None,
        "examples": ["a hypothesis"],
        "forward_seconds": 1.0,
        "decode_seconds": decode,
        "train_step_seconds": step,
        "teacher_train_step_seconds": 0.2,
    }


def with_students() -> dict:
    evaluation = synthetic_evaluation()
    sparsefinder = student("sparsefinder", 0.7, 19.1, 6.0, 12.5, 0.3)
    sparsefinder["computed_fraction_per_layer"] = [0.26, 0.25]
    ssa = student("ssa", 0.0, 18.0, 5.5, 9.0, 0.25)
    ssa["ensembles"] = [
        {"samples": 1, "bleu": 17.5, "signature": "s", "perplexity": 5.75, "decode_seconds": 8.0},
        {"samples": 4, "bleu": 18.5, "signature": "s", "perplexity": 5.25, "decode_seconds": 30.0},
    ]
    evaluation["students"] = [sparsefinder, ssa]
    return evaluation


def section(markdown: str, title: str) -> str:
    """The body of the section ``## title``, up to the next section."""
    return markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of ``text``: its rows (header and separator left out) as lists of cells."""
    found: list[list[list[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("| "):
            if not previous.startswith("| "):
                found.append([])
            found[-1].append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
        previous = line
    return [table[2:] for table in found]


def test_students_table_compares_each_student_with_the_teacher():
    markdown, _ = build_report(with_students())
    assert (
        markdown.index("## Translation quality")
        < markdown.index("## Students")
        < markdown.index("## Findings")
    )
    header = next(line for line in section(markdown, "Students").splitlines() if line.startswith("| "))
    assert header == (
        "| student | decoding sparsity | computed per layer | BLEU | Δ BLEU | perplexity | Δ ppl "
        "| train step | decode |"
    )
    rows = tables(section(markdown, "Students"))[0]
    # Δ against the teacher's 20.0 / 5.0; train step over the teacher's 0.2 s; decode over its 10 s
    assert rows == [
        ["sparsefinder", "0.700", "0.26 / 0.25", "19.10", "-0.90", "6.00", "+1.00", "1.50×", "1.25×"],
        ["ssa", "0.000", "—", "18.00", "-2.00", "5.50", "+0.50", "1.25×", "0.90×"],
    ]


def test_ensemble_table_compares_each_self_ensemble_with_its_dense_student():
    text = section(build_report(with_students())[0], "Students")
    assert "| student | samples S | BLEU | Δ BLEU vs dense | perplexity | Δ ppl vs dense | decode |" in text
    assert tables(text)[1] == [
        ["ssa", "1", "17.50", "-0.50", "5.75", "+0.25", "0.80×"],
        ["ssa", "4", "18.50", "+0.50", "5.25", "-0.25", "3.00×"],
    ]
    evaluation = with_students()
    del evaluation["students"][1]["ensembles"]
    text = section(build_report(evaluation)[0], "Students")
    assert len(tables(text)) == 1 and "samples S" not in text


def test_student_sentences_name_the_best_student_and_the_predictor_points():
    text = section(build_report(with_students())[0], "Students").strip().splitlines()[-1]
    assert text.startswith(
        "The student with the highest BLEU is sparsefinder (decoding sparsity 0.700); decoding with it gives "
        "BLEU 19.10 (-0.90 vs the teacher's 20.00) and perplexity 6.00 (+1.00 vs the teacher's 5.00)."
    )
    assert "(highest BLEU at sparsity ≥ the student's − 0.05)" in text
    assert (
        "sparsefinder's BLEU 19.10 at sparsity 0.700 vs 19.50 with distance(threshold=2.0) w=3 at 0.830 "
        "(-0.40)" in text
    )
    # ssa decodes densely: it has no sparsity to match a predictor point against
    assert "ssa's BLEU" not in text


def test_the_predictor_comparison_follows_the_students_sparsity():
    evaluation = with_students()
    evaluation["students"] = evaluation["students"][:1]
    evaluation["students"][0]["sparsity"] = 0.9  # only kmeans (0.86) is at sparsity ≥ 0.85 now
    text = section(build_report(evaluation)[0], "Students")
    assert "The only student is sparsefinder (decoding sparsity 0.900)" in text
    assert "vs 19.25 with kmeans(buckets=4, top_k=1) w=3 at 0.860 (-0.15)" in text
    evaluation["students"][0]["sparsity"] = 0.95  # no predictor point that sparse: no comparison
    assert "Against the teacher decoding" not in build_report(evaluation)[0]


def test_headline_holds_each_students_quality_and_no_timings():
    _, head = build_report(with_students())
    assert head["students"] == {
        "sparsefinder": {"bleu": 19.1, "perplexity": 6.0, "sparsity": 0.7},
        "ssa": {"bleu": 18.0, "perplexity": 5.5, "sparsity": 0.0},
    }
    json.dumps(head, allow_nan=False)


def test_an_evaluation_without_students_renders_as_before():
    before = build_report(synthetic_evaluation())
    for students in ([], None):
        evaluation = synthetic_evaluation()
        if students is not None:
            evaluation["students"] = students
        assert build_report(evaluation) == before
    assert "## Students" not in before[0] and "students" not in before[1]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_quality_csv_lists_the_students_after_the_points(tmp_path: Path):
    write_report_plots(with_students(), tmp_path, recall_target=0.95)
    rows = read_csv(tmp_path / "quality.csv")
    assert len(rows) == 6 and rows[0]["method"] == "teacher"
    assert rows[-2:] == [
        {
            "method": "student",
            "label": "sparsefinder",
            "sparsity": "0.7",
            "bleu": "19.1",
            "perplexity": "6.0",
        },
        {"method": "student", "label": "ssa", "sparsity": "0.0", "bleu": "18.0", "perplexity": "5.5"},
    ]


def drawn(monkeypatch: pytest.MonkeyPatch, evaluation: dict, metric: str, path: Path) -> Figure:
    """The figure :func:`plot_quality` draws (it is still saved to ``path``)."""
    figures: list[Figure] = []
    save = pareto.save_png

    def keep(figure: Figure, target: Path) -> None:
        figures.append(figure)
        save(figure, target)

    monkeypatch.setattr(pareto, "save_png", keep)
    plot_quality(evaluation, metric, path)
    return figures[-1]


def legend_labels(figure: Figure) -> list[str]:
    """The legend's entries, in drawing order."""
    return [text.get_text() for text in figure.axes[0].get_legend().get_texts()]


@pytest.mark.parametrize("metric", ["bleu", "perplexity"])
def test_students_are_labelled_points_on_the_quality_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metric: str
):
    figure = drawn(monkeypatch, with_students(), metric, tmp_path / "students.png")
    assert legend_labels(figure) == [
        "window",
        "distance",
        "kmeans",
        "student: sparsefinder",
        "student: ssa",
        "teacher",
        "gold sparsity 0.870",
    ]
    assert [text.get_text() for text in figure.axes[0].texts] == ["sparsefinder", "ssa"]  # beside the points
    assert "and students" in figure.axes[0].get_title()
    plain = drawn(monkeypatch, synthetic_evaluation(), metric, tmp_path / "plain.png")
    assert not any(label.startswith("student") for label in legend_labels(plain))
    assert "and students" not in plain.axes[0].get_title()
    assert (tmp_path / "students.png").read_bytes() != (tmp_path / "plain.png").read_bytes()


def test_students_alone_still_make_a_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    evaluation = with_students()
    evaluation["quality"]["points"] = []
    labels = legend_labels(drawn(monkeypatch, evaluation, "bleu", tmp_path / "students.png"))
    assert labels == ["student: sparsefinder", "student: ssa", "teacher", "gold sparsity 0.870"]
    evaluation["students"] = []
    message = drawn(monkeypatch, evaluation, "bleu", tmp_path / "empty.png")
    assert message.axes[0].texts[0].get_text() == "no quality points"


def test_report_plots_write_every_png_with_students(tmp_path: Path):
    files = write_report_plots(with_students(), tmp_path / "report", recall_target=0.95)
    for name in ("sparsity_recall", "sparsity_bleu", "sparsity_perplexity", "recall_heatmap"):
        assert_picture(files[name])


def test_students_survive_the_timings_split(tmp_path: Path):
    """evaluate.json keeps the students' quality; their wall times come back from the timings file."""
    evaluation = with_students()
    write_metrics(tmp_path / "evaluate.json", evaluation, tmp_path / "times.json")
    kept = json.loads((tmp_path / "evaluate.json").read_text())
    assert "train_step_seconds" not in kept["students"][0]
    assert "decode_seconds" not in kept["students"][1]["ensembles"][1]
    assert load_evaluation(tmp_path / "evaluate.json", tmp_path / "times.json") == evaluation
    without = load_evaluation(tmp_path / "evaluate.json", tmp_path / "absent.json")
    rows = tables(section(build_report(without)[0], "Students"))
    assert rows[0][0][-2:] == ["—", "—"] and rows[1][0][-1] == "—"


def test_an_old_evaluation_without_students_loads(tmp_path: Path):
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps(synthetic_evaluation()))
    assert "students" not in load_evaluation(path)


def students_of(e: dict) -> list:
    """The evaluation's student rows (for the mutations below)."""
    return e["students"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.update(students={"ssa": {}}), "'students' must be a list of student rows, got dict"),
        (lambda e: students_of(e).append("ssa"), "students[2] must be a mapping, got str"),
        (lambda e: students_of(e)[1].pop("bleu"), "students[1] lacks the key 'bleu'"),
        (lambda e: students_of(e)[0].pop("student"), "students[0] lacks the key 'student'"),
        (lambda e: students_of(e)[0].update(student=3), "students[0].student = 3 is not a name of its own"),
        (
            lambda e: students_of(e)[1].update(student="sparsefinder"),
            "students[1].student = 'sparsefinder' is not a name of its own",
        ),
        (
            lambda e: students_of(e)[0].update(sparsity="high"),
            "students[0].sparsity = 'high' is not a number",
        ),
        (
            lambda e: students_of(e)[0].update(perplexity=[6.0]),
            "students[0].perplexity = [6.0] is not a number",
        ),
        (lambda e: students_of(e)[1].update(ensembles={}), "students[1].ensembles must be a list"),
        (
            lambda e: students_of(e)[1]["ensembles"][1].pop("perplexity"),
            "students[1].ensembles[1] lacks the key 'perplexity'",
        ),
        (
            lambda e: students_of(e)[1]["ensembles"][0].update(bleu="x"),
            "students[1].ensembles[0].bleu = 'x' is not a number",
        ),
        (
            lambda e: students_of(e)[1]["ensembles"][0].update(samples=0),
            "students[1].ensembles[0].samples = 0 is not a positive integer",
        ),
    ],
)
def test_bad_students_name_the_file_and_the_key(tmp_path: Path, mutate, message: str):
    evaluation = with_students()
    mutate(evaluation)
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps(evaluation))
    with pytest.raises(UserError) as err:
        load_evaluation(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_untrained_twin_and_dense_control_are_reported_beside_the_students():
    evaluation = with_students()
    sparsefinder, ssa = evaluation["students"]
    sparsefinder["attention"], ssa["attention"] = "sparsefinder", "ssa"
    sparsefinder["untrained"] = {"bleu": 17.0, "perplexity": 7.0, "sparsity": 0.72}
    control = student("dense", 0.0, 19.5, 5.2, 10.0, 0.2)
    control["attention"] = "entmax"
    evaluation["students"].append(control)
    body = section(build_report(evaluation)[0], "Students")
    rows = {row[0]: row for row in tables(body)[0]}
    assert rows["sparsefinder, before fine-tuning"][1:6] == ["0.720", "—", "17.00", "-3.00", "7.00"]
    assert "takes sparsefinder from BLEU 17.00 to 19.10 (+2.10) and perplexity 7.00 to 6.00" in body
    assert "Against the dense control (dense: the teacher trained further the same way" in body
    assert "dense's BLEU" not in body
    assert "sparsefinder -0.40 BLEU, +0.80 perplexity; ssa -1.50 BLEU, +0.30 perplexity" in body
    # without a control or a twin neither sentence is written
    plain = section(build_report(with_students())[0], "Students")
    assert "before fine-tuning" not in plain.split("\n\n")[0] and "dense control" not in plain


def with_par_students() -> dict:
    """:func:`with_students` plus a PAR student placed before the dense control (both entmax students)."""
    evaluation = with_students()
    par = student("par", 0.0, 19.0, 5.4, 7.0, 0.15)
    par["attention"] = "entmax"
    par["par"] = {"encoder": "sff sf", "decoder": "scff (cf)x2", "attention_sublayers": 3,
                  "attention_fraction": 0.75}  # fmt: skip
    control = student("dense", 0.0, 19.5, 5.2, 10.0, 0.2)
    control["attention"] = "entmax"
    evaluation["students"] += [par, control]
    return evaluation


def test_par_students_have_a_table_of_their_patterns_beside_the_dense_control():
    body = section(build_report(with_par_students())[0], "Students")
    assert "| student | encoder | decoder | attention kept | BLEU |" in body
    assert tables(body)[2] == [
        ["par", "sff sf", "scff (cf)x2", "0.75", "19.00", "-1.00", "5.40", "+0.40", "0.70×"],
        ["dense", "teacher's", "teacher's", "1.00", "19.50", "-0.50", "5.20", "+0.20", "1.00×"],
    ]
    # the control is the dense student, not the PAR student that also runs α-entmax
    assert "Against the dense control (dense: " in body and "par -0.50 BLEU, +0.20 perplexity" in body
    assert "attention kept" not in section(build_report(with_students())[0], "Students")


def test_the_speed_figure_places_students_by_decoding_time_and_labels_par_students(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    figures: list[Figure] = []
    save = pareto.save_png
    monkeypatch.setattr(
        pareto, "save_png", lambda figure, target: (figures.append(figure), save(figure, target))
    )
    pareto.plot_speed_quality(with_par_students(), tmp_path / "speed.png")
    ax = figures[-1].axes[0]
    assert [text.get_text() for text in ax.texts] == ["sparsefinder", "ssa", "par (attention ×0.75)", "dense"]
    points = [tuple(collection.get_offsets()[0]) for collection in ax.collections]
    assert points == [(1.25, 19.1), (0.9, 18.0), (0.7, 19.0), (1.0, 19.5), (1.0, 20.0)]  # teacher last
    assert_picture(tmp_path / "speed.png")
    evaluation = with_par_students()
    del evaluation["quality"]["teacher"]["decode_seconds"]
    pareto.plot_speed_quality(evaluation, tmp_path / "untimed.png")
    assert figures[-1].axes[0].texts[0].get_text() == "no timed students"
