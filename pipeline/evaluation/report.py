"""The evaluation's report: per-method sparsity–recall summaries, quality at those settings (BLEU and
perplexity for translation; perplexity, and accuracy for mlm, for the block tasks), the speed table of the
block tasks, and a few sentences generated from the numbers, plus the small headline JSON declared as a DVC
metric.

Definitions used throughout:

- *recall at sparsity ≥ s*: the best recall among a method's settings whose graph sparsity is at least s;
- *sparsity at recall ≥ r*: the highest graph sparsity among a method's settings whose recall is at least r;
- a *setting* is a method with its knobs, window and global tokens; a quality point belongs to a graph setting
  when all four agree;
- a *student* is the teacher fine-tuned with a sparse attention and distilled from the teacher; its decoding
  sparsity is that of the graphs it computes (0 for a student evaluated densely, such as SSA).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from pipeline.evaluation.pareto import best_at_least, finite_number, front_dominates
from pipeline.timings import merge_timings, timings_path

# Sparsefinder's predictors on the learned projections; every other method is a baseline.
LEARNED = ("distance", "quantization", "kmeans", "indexer")
# A stable order for tables, colours and markers; methods not listed follow, alphabetically.
METHOD_ORDER = (
    "window",
    "bigbird",
    "longformer",
    "reformer",
    "routing",
    "distance",
    "quantization",
    "kmeans",
    "indexer",
)

REQUIRED_KEYS = ("kind", "store", "gold_sparsity", "graphs", "quality")
GRAPH_KEYS = ("method", "sparsity", "recall")
QUALITY_KEYS = ("teacher", "points")
DASH = "—"


@dataclass(frozen=True)
class Score:
    """A quality measure of the evaluation's task: its key in the rows, its name, digits and direction."""

    key: str
    name: str
    short: str
    digits: int
    higher_is_better: bool


BLEU = Score("bleu", "BLEU", "BLEU", 2, True)
PERPLEXITY = Score("perplexity", "perplexity", "ppl", 2, False)
ACCURACY = Score("accuracy", "accuracy", "acc", 3, True)
# per task, its measures, the one that ranks first (an evaluation without a task is a translation one)
TASK_SCORES = {"translation": (BLEU, PERPLEXITY), "lm": (PERPLEXITY,), "mlm": (PERPLEXITY, ACCURACY)}


def task_scores(evaluation: dict) -> tuple[Score, ...]:
    """The measures of the evaluation's task (:data:`TASK_SCORES`)."""
    return TASK_SCORES[evaluation.get("task", "translation")]


def _verbs(scores: Sequence[Score]) -> tuple[str, str]:
    """How a model is run for its measures: ("decoding", "decoded") by beam search when BLEU is measured,
    else ("running", "run"), a forward over the test blocks."""
    return ("decoding", "decoded") if BLEU in scores else ("running", "run")


# The τ-indexer's goal: recall ≥ INDEXER_RECALL at sparsity ≥ gold − INDEXER_SLACK.
INDEXER_RECALL, INDEXER_SLACK = 0.99, 0.03
# A student is compared with the predictor points at sparsity ≥ its own − STUDENT_SLACK.
STUDENT_SLACK = 0.05


# ----------------------------------------------------------------------------------------------------------
# reading


def load_evaluation(path: str | os.PathLike, timings: str | os.PathLike | None = None) -> dict:
    """Read the evaluate stage's JSON, with the wall times of its ``timings`` file (by default
    :func:`~pipeline.timings.timings_path`) put back in; raise :class:`UserError`, one line naming file and
    key, if unusable. Without a timings file the speed columns show a dash."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: evaluation file not found (run the evaluate stage first)")
    try:
        evaluation = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
    _check_mapping(path, evaluation, "top level", REQUIRED_KEYS)
    task = evaluation.get("task", "translation")
    if task not in TASK_SCORES:
        raise UserError(f"{path}: task = {task!r} is not one of {', '.join(TASK_SCORES)}")
    scored = tuple(score.key for score in TASK_SCORES[task])
    graphs = evaluation["graphs"]
    if not isinstance(graphs, list) or not graphs:
        raise UserError(f"{path}: 'graphs' must be a non-empty list of graph settings")
    for i, row in enumerate(graphs):
        _check_row(path, row, f"graphs[{i}]", GRAPH_KEYS)
    quality = evaluation["quality"]
    _check_mapping(path, quality, "quality", QUALITY_KEYS)
    if not isinstance(quality["points"], list):
        raise UserError(f"{path}: 'quality.points' must be a list")
    for i, row in enumerate(quality["points"]):
        _check_row(path, row, f"quality.points[{i}]", ("method", "sparsity", *scored))
    if "students" in evaluation:
        _check_students(path, evaluation["students"], scored)
    timings = Path(timings or timings_path(path))
    if not timings.is_file():
        return evaluation
    try:
        return merge_timings(evaluation, json.loads(timings.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{timings}: not valid JSON ({err})") from None


def _check_mapping(path: Path, value: Any, where: str, keys: Sequence[str]) -> None:
    if not isinstance(value, dict):
        raise UserError(f"{path}: {where} must be a mapping, got {type(value).__name__}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise UserError(f"{path}: {where} lacks the key {missing[0]!r}")


def _check_row(path: Path, row: Any, where: str, keys: Sequence[str]) -> None:
    """A row has every key; its numbers are numbers or null (an undefined value)."""
    _check_mapping(path, row, where, keys)
    for key in keys[1:]:
        value = row[key]
        if value is not None and finite_number(value) is None:
            raise UserError(f"{path}: {where}.{key} = {value!r} is not a number")


def _check_students(path: Path, students: Any, scored: Sequence[str]) -> None:
    """Each student row has a name of its own and its quality numbers; its self-ensembles, if any, theirs."""
    if not isinstance(students, list):
        raise UserError(f"{path}: 'students' must be a list of student rows, got {type(students).__name__}")
    names: set[str] = set()
    for i, row in enumerate(students):
        where = f"students[{i}]"
        _check_row(path, row, where, ("student", "sparsity", *scored))
        name = row["student"]
        if not isinstance(name, str) or not name or name in names:
            raise UserError(f"{path}: {where}.student = {name!r} is not a name of its own")
        names.add(name)
        if "ensembles" not in row:
            continue
        if not isinstance(row["ensembles"], list):
            raise UserError(f"{path}: {where}.ensembles must be a list of self-ensemble rows")
        for j, ensemble in enumerate(row["ensembles"]):
            _check_row(path, ensemble, f"{where}.ensembles[{j}]", ("samples", *scored))
            samples = ensemble["samples"]
            if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
                raise UserError(
                    f"{path}: {where}.ensembles[{j}].samples = {samples!r} is not a positive integer"
                )


# ----------------------------------------------------------------------------------------------------------
# settings and selections


def method_order(methods: Iterable[str]) -> list[str]:
    """The distinct ``methods`` in :data:`METHOD_ORDER`, then the unknown ones alphabetically."""
    distinct = set(methods)
    known = [m for m in METHOD_ORDER if m in distinct]
    return known + sorted(distinct - set(METHOD_ORDER))


def rows_by_method(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """The rows grouped by ``method``, methods in :func:`method_order`, rows in their original order."""
    rows = list(rows)
    return {m: [row for row in rows if row["method"] == m] for m in method_order(r["method"] for r in rows)}


def finite_points(rows: Iterable[dict], x: str, y: str) -> tuple[list[tuple[float, float]], list[dict]]:
    """The (x, y) points of the rows where both are finite numbers, and those rows, in the same order."""
    kept = [
        row for row in rows if finite_number(row.get(x)) is not None and finite_number(row.get(y)) is not None
    ]
    return [(float(row[x]), float(row[y])) for row in kept], kept


def setting_key(row: dict) -> tuple[str, str, int, int]:
    """What identifies a setting: method, knobs, window size and global tokens."""
    knobs = json.dumps(row.get("knobs") or {}, sort_keys=True)
    return row["method"], knobs, int(row.get("window") or 0), int(row.get("global_tokens") or 0)


def quality_at(evaluation: dict, row: dict | None) -> dict | None:
    """The quality point decoded with exactly ``row``'s setting, or None when it was not decoded."""
    if row is None:
        return None
    key = setting_key(row)
    return next((p for p in evaluation["quality"]["points"] if setting_key(p) == key), None)


def teacher_quality(evaluation: dict) -> dict:
    """The teacher's own quality numbers (empty when the evaluation has none)."""
    return evaluation["quality"].get("teacher") or {}


def student_rows(evaluation: dict) -> list[dict]:
    """The students' quality rows, in the evaluation's order (none in an evaluation from before students)."""
    return evaluation.get("students") or []


def recall_at_sparsity(rows: Sequence[dict], level: float) -> dict | None:
    """The setting with the best recall among those with sparsity ≥ ``level`` (ties: the sparser)."""
    return best_at_least(rows, x="sparsity", y="recall", x_min=level)


def sparsity_at_recall(rows: Sequence[dict], target: float) -> dict | None:
    """The sparsest setting among those with recall ≥ ``target`` (ties: the higher recall)."""
    return best_at_least(rows, x="recall", y="sparsity", x_min=target)


def highest_recall(rows: Sequence[dict]) -> dict | None:
    """The setting with the highest recall (ties: the sparser)."""
    return best_at_least(rows, x="sparsity", y="recall", x_min=-math.inf)


def operating_point(evaluation: dict, recall_target: float) -> dict | None:
    """The setting the per-layer/head figure shows.

    The sparsest setting of a learned method (:data:`LEARNED`) with recall ≥ ``recall_target``; when none
    reaches it, the learned setting with the highest recall; without learned methods, the highest-recall
    setting of any method. None only when no setting has both a sparsity and a recall.
    """
    learned = [row for row in evaluation["graphs"] if row["method"] in LEARNED]
    return (
        sparsity_at_recall(learned, recall_target)
        or highest_recall(learned)
        or highest_recall(evaluation["graphs"])
    )


# ----------------------------------------------------------------------------------------------------------
# headline JSON


def headline(evaluation: dict, *, sparsity_levels: Sequence[float], recall_target: float) -> dict:
    """The small metrics JSON: gold and teacher numbers, per-method threshold values, the best setting, and
    each student's quality when there are students.

    ``best`` is the sparsest setting of any method with recall ≥ ``recall_target`` (its fields are null when
    no setting reaches it), with the task's measures (:func:`task_scores`) of running with it when they
    were measured. ``students`` maps each student's name to its measures and sparsity; no wall times, so
    the headline stays a function of the inputs.
    """
    teacher = teacher_quality(evaluation)
    keys = [score.key for score in task_scores(evaluation)]
    methods = {}
    for method, rows in rows_by_method(evaluation["graphs"]).items():
        values = {
            f"recall_at_sparsity_{level:g}": _field(recall_at_sparsity(rows, level), "recall")
            for level in sparsity_levels
        }
        values[f"sparsity_at_recall_{recall_target:g}"] = _field(
            sparsity_at_recall(rows, recall_target), "sparsity"
        )
        methods[method] = values
    best = sparsity_at_recall(evaluation["graphs"], recall_target)
    point = quality_at(evaluation, best)
    summary = {
        "gold_sparsity": finite_number(evaluation["gold_sparsity"]),
        **{f"teacher_{key}": finite_number(teacher.get(key)) for key in keys},
        "methods": methods,
        "best": {
            "method": best["method"] if best else None,
            "label": _label(best) if best else None,
            "sparsity": _field(best, "sparsity"),
            "recall": _field(best, "recall"),
            **{key: _field(point, key) for key in keys},
        },
    }
    students = student_rows(evaluation)
    if students:
        summary["students"] = {
            row["student"]: {key: _field(row, key) for key in (*keys, "sparsity")} for row in students
        }
    return summary


def _field(row: dict | None, key: str) -> float | None:
    return None if row is None else finite_number(row.get(key))


def _label(row: dict) -> str:
    return row.get("label") or row["method"]


# ----------------------------------------------------------------------------------------------------------
# markdown


def build_report(
    evaluation: dict,
    *,
    sparsity_levels: Sequence[float] = (0.8, 0.9),
    recall_target: float = 0.95,
    figures: Sequence[tuple[str, str]] = (),
) -> tuple[str, dict]:
    """The markdown report and the headline JSON of an evaluation.

    ``figures`` are (caption, path relative to the report) pairs shown at the end of the report.
    """
    task = evaluation.get("task", "translation")
    sections = [
        f"# Learned sparse attention: {evaluation['kind']}",
        _facts(evaluation),
        "## Sparsity and recall per method",
        _method_table(evaluation, sparsity_levels, recall_target),
        f"## {'Translation' if task == 'translation' else 'Language-model'} quality with predicted graphs",
        _quality_table(evaluation),
    ]
    if evaluation.get("speed"):
        sections += ["## Speed inside the model", _speed_table(evaluation)]
    if student_rows(evaluation):
        sections += ["## Students", _students_section(evaluation)]
    sections += [
        "## Findings",
        _findings(evaluation, sparsity_levels, recall_target),
    ]
    indexer = _indexer_table(evaluation)
    if indexer:
        sections += ["## τ-indexer: rank and fitting", indexer]
    if figures:
        sections += ["## Figures", "\n\n".join(f"![{caption}]({path})" for caption, path in figures)]
    markdown = "\n\n".join(sections) + "\n"
    return markdown, headline(evaluation, sparsity_levels=sparsity_levels, recall_target=recall_target)


def _num(value: Any, digits: int) -> str:
    number = finite_number(value)
    return DASH if number is None else f"{number:.{digits}f}"


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def _facts(evaluation: dict) -> str:
    store = evaluation["store"] or {}
    teacher = teacher_quality(evaluation)
    shape = (
        f", {store['layers']} layers × {store['heads']} heads"
        if "layers" in store and "heads" in store
        else ""
    )
    signature = f" (`{teacher['signature']}`)" if teacher.get("signature") else ""
    measures = ", ".join(
        f"{score.name} {_num(teacher.get(score.key), score.digits)}" + (signature if score is BLEU else "")
        for score in task_scores(evaluation)
    )
    unit = "sentences" if evaluation.get("task", "translation") == "translation" else "blocks"
    gerund = _verbs(task_scores(evaluation))[0]
    lines = [
        f"- attention: **{evaluation['kind']}**, graphs from `{store.get('path', DASH)}` "
        f"({store.get('split', DASH)} split, {store.get('sentences', DASH)} {unit}{shape})",
        f"- gold sparsity of the teacher's α-entmax graphs: {_num(evaluation['gold_sparsity'], 3)}",
        f"- teacher: {measures}, {gerund} sparsity {_num(teacher.get('sparsity'), 3)}",
    ]
    if evaluation.get("projector"):
        lines.append(f"- learned projections: {_projector(evaluation['projector'])}")
    return "\n".join(lines)


def _projector(config: dict) -> str:
    """``rank 4, one tanh MLP (32 hidden) shared by queries and keys``."""
    hidden = config.get("hidden")
    kind = "linear map" if hidden is None else f"tanh MLP ({hidden} hidden)"
    if config.get("shared"):
        return f"rank {config.get('rank')}, one {kind} per head shared by queries and keys"
    return f"rank {config.get('rank')}, a {kind} per head for queries and another for keys"


def _score_header(evaluation: dict) -> str:
    """``BLEU / ppl`` (translation), ``ppl`` (lm), ``ppl / acc`` (mlm)."""
    return " / ".join(score.short for score in task_scores(evaluation))


def _method_table(evaluation: dict, levels: Sequence[float], target: float) -> str:
    scores = _score_header(evaluation)
    header = ["method"]
    for level in levels:
        header += [f"recall @ sparsity ≥ {level:g}", scores]
    header += [f"sparsity @ recall ≥ {target:g}", scores]
    lines = [_table_row(header), _table_row(["---"] * len(header))]
    for method, rows in rows_by_method(evaluation["graphs"]).items():
        cells = [method]
        for level in levels:
            row = recall_at_sparsity(rows, level)
            cells += [_setting_cell(row, "recall"), _quality_cell(evaluation, quality_at(evaluation, row))]
        row = sparsity_at_recall(rows, target)
        cells += [_setting_cell(row, "sparsity"), _quality_cell(evaluation, quality_at(evaluation, row))]
        lines.append(_table_row(cells))
    lines.append(_table_row(_teacher_cells(evaluation, levels)))
    return "\n".join(lines)


def _teacher_cells(evaluation: dict, levels: Sequence[float]) -> list[str]:
    """The gold graph has recall 1 at the gold sparsity; the teacher decodes with it."""
    gold = finite_number(evaluation["gold_sparsity"])
    quality = _quality_cell(evaluation, teacher_quality(evaluation))
    cells = ["teacher (gold graph)"]
    for level in levels:
        reached = gold is not None and gold >= level
        cells += ["1.000 (gold)", quality] if reached else [DASH, DASH]
    cells += [f"{_num(gold, 3)} (gold)", quality]
    return cells


def _table_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _setting_cell(row: dict | None, key: str) -> str:
    return DASH if row is None else f"{_num(row[key], 3)} ({_cell(_label(row))})"


def _quality_cell(evaluation: dict, point: dict | None) -> str:
    """The task's measures of ``point``, ``18.33 / 25.20``; a dash when it has none."""
    scores = task_scores(evaluation)
    if point is None or all(finite_number(point.get(score.key)) is None for score in scores):
        return DASH
    return " / ".join(_num(point.get(score.key), score.digits) for score in scores)


def _quality_table(evaluation: dict) -> str:
    teacher = teacher_quality(evaluation)
    points = evaluation["quality"]["points"]
    if not points:
        return "No setting was decoded with its predicted graphs."
    scores = task_scores(evaluation)
    primary = scores[0]
    decodes = evaluation.get("task", "translation") == "translation"
    header = [
        "setting",
        f"{_verbs(scores)[0]} sparsity",
        "graph recall",
        primary.name,
        f"Δ {primary.name}",
        *(score.name for score in scores[1:]),
        "forward",
        *(["decode"] if decodes else []),
    ]
    lines = [_table_row(header), _table_row(["---"] * len(header))]

    def numbers(point: dict, recall: Any) -> list[str]:
        cells = [_num(point.get("sparsity"), 3), _num(recall, 3), *_versus(point, teacher, scores, deltas=1)]
        cells.append(_ratio(point.get("forward_seconds"), teacher.get("forward_seconds")))
        if decodes:
            cells.append(_ratio(point.get("decode_seconds"), teacher.get("decode_seconds")))
        return cells

    if teacher:
        lines.append(_table_row(["teacher", *numbers(teacher, 1.0)]))
    for rows in rows_by_method(points).values():
        for point in sorted(rows, key=lambda p: (finite_number(p["sparsity"]) or 0.0, _label(p))):
            lines.append(_table_row([_cell(_label(point)), *numbers(point, point.get("graph_recall"))]))
    lines.append("")
    times = (
        "forward and decode are times" if decodes else "forward is the time of a pass over the test blocks"
    )
    lines.append(f"Δ {primary.name} is against the teacher; {times} relative to the teacher's.")
    return "\n".join(lines)


def _speed_table(evaluation: dict) -> str:
    """Tokens per second of each model at each context, side by side, with its ratios to the dense α-entmax
    teacher and to softmax SDPA, and the share of its forward spent in attention."""
    header = [
        "n",
        "model",
        "graph sparsity",
        "graph recall",
        "perplexity",
        "forward tokens/s",
        "× dense entmax",
        "× softmax SDPA",
        "forward + backward tokens/s",
        "× dense entmax",
        "attention share",
    ]
    lines = [_table_row(header), _table_row(["---"] * len(header))]
    rows = evaluation["speed"]
    for n in sorted({row["context"] for row in rows}):
        at_n = {row["model"]: row for row in rows if row["context"] == n}
        entmax, sdpa = at_n.get("entmax (dense)", {}), at_n.get("softmax (sdpa)", {})
        for name, row in at_n.items():
            forward, both = row.get("forward_seconds"), row.get("forward_backward_seconds")
            lines.append(
                _table_row(
                    [
                        str(n),
                        _cell(name),
                        _num(row.get("graph_sparsity"), 3),
                        _num(row.get("graph_recall"), 3),
                        _num(row.get("perplexity"), 2),
                        _cell(row["status"]) if "status" in row else _per_second(n, forward),
                        _ratio(entmax.get("forward_seconds"), forward),
                        _ratio(sdpa.get("forward_seconds"), forward),
                        _per_second(n, both),
                        _ratio(entmax.get("forward_backward_seconds"), both),
                        _num(_share(row.get("attention_seconds"), row.get("attention_pass_seconds")), 2),
                    ]
                )
            )
    lines += [
        "",
        "One sequence of n test tokens, medians of timed passes, the models taking turns at each n; × is "
        "how many times faster than the dense α-entmax teacher or the same weights with softmax SDPA; the "
        "attention share is the part of a forward spent inside the attention function. Perplexity is the "
        "quality sweep's on the test blocks (the teacher's for dense and certified entmax; softmax SDPA's is "
        "not measured).",
    ]
    reasons = {row["chosen_by"] for row in rows if "chosen_by" in row}
    if "perplexity" in reasons:
        lines.append(
            "Each predictor runs at its sparsest quality point within the perplexity gap of the teacher's"
            + (" (or, where none is that close, by recall)." if "recall" in reasons else ".")
        )
    elif reasons:
        lines.append("Each predictor runs at its sparsest setting reaching the speed recall target.")
    return "\n".join(lines)


def _per_second(tokens: int, seconds: Any) -> str:
    value = finite_number(seconds)
    return DASH if value is None or value <= 0 else f"{tokens / value:,.0f}"


def _share(part: Any, whole: Any) -> float | None:
    a, b = finite_number(part), finite_number(whole)
    return None if a is None or b is None or b <= 0 else a / b


def _difference(value: Any, reference: Any) -> float | None:
    a, b = finite_number(value), finite_number(reference)
    return None if a is None or b is None else a - b


def _signed(value: float | None, digits: int) -> str:
    return DASH if value is None else f"{value:+.{digits}f}"


def _ratio(value: Any, reference: Any) -> str:
    a, b = finite_number(value), finite_number(reference)
    return DASH if a is None or b is None or b <= 0 else f"{a / b:.2f}×"


def _indexer_table(evaluation: dict) -> str:
    """Per rank and fitting of the τ-indexer: recall at sparsity ≥ gold − slack and sparsity at recall ≥ the
    goal, with the task's measures where run, and which fitting wins each rank ("" without indexer rows)."""
    rows = [row for row in evaluation["graphs"] if row["method"] == "indexer"]
    gold = finite_number(evaluation["gold_sparsity"])
    if not rows or gold is None:
        return ""
    level = gold - INDEXER_SLACK
    variants: dict[tuple[Any, Any], list[dict]] = {}
    for row in rows:
        knobs = row.get("knobs") or {}
        variants.setdefault((knobs.get("rank"), knobs.get("fitting")), []).append(row)
    header = [
        "rank",
        "fitting",
        f"recall @ sparsity ≥ {level:.3f}",
        _score_header(evaluation),
        f"sparsity @ recall ≥ {INDEXER_RECALL:g}",
        _score_header(evaluation),
    ]
    lines = [_table_row(header), _table_row(["---"] * len(header))]
    winners = {}
    by_rank = sorted(variants.items(), key=lambda item: (finite_number(item[0][0]) or 0.0, str(item[0][1])))
    for (rank, fitting), group in by_rank:
        at_level = recall_at_sparsity(group, level)
        at_goal = sparsity_at_recall(group, INDEXER_RECALL)
        lines.append(
            _table_row(
                [
                    str(rank),
                    str(fitting),
                    _setting_cell(at_level, "recall"),
                    _quality_cell(evaluation, quality_at(evaluation, at_level)),
                    _setting_cell(at_goal, "sparsity"),
                    _quality_cell(evaluation, quality_at(evaluation, at_goal)),
                ]
            )
        )
        recall = _field(at_level, "recall")
        if recall is not None and (rank not in winners or recall > winners[rank][1]):
            winners[rank] = (fitting, recall)
    verdict = ", ".join(f"rank {rank}: {fitting}" for rank, (fitting, _) in winners.items())
    if verdict:
        lines += ["", f"Higher recall at sparsity ≥ {level:.3f} (gold − {INDEXER_SLACK:g}): {verdict}."]
    return "\n".join(lines)


def _students_section(evaluation: dict) -> str:
    """The students against the teacher, their self-ensembles against themselves, and what stands out."""
    teacher = teacher_quality(evaluation)
    students = student_rows(evaluation)
    scores = task_scores(evaluation)
    time = "decode" if evaluation.get("task", "translation") == "translation" else "forward"
    header = [
        "student",
        f"{_verbs(scores)[0]} sparsity",
        "computed per layer",
        *_score_columns(scores),
        "train step",
        time,
    ]
    lines = [_table_row(header), _table_row(["---"] * len(header))]
    for row in students:
        computed = row.get("computed_fraction_per_layer")
        cells = [
            _cell(row["student"]),
            _num(row["sparsity"], 3),
            " / ".join(_num(value, 2) for value in computed) if computed else DASH,
            *_versus(row, teacher, scores),
            _ratio(row.get("train_step_seconds"), row.get("teacher_train_step_seconds")),
            _ratio(row.get(f"{time}_seconds"), teacher.get(f"{time}_seconds")),
        ]
        lines.append(_table_row(cells))
        untrained = row.get("untrained")
        if untrained:
            cells = [f"{_cell(row['student'])}, before fine-tuning", _num(untrained.get("sparsity"), 3), DASH]
            lines.append(_table_row([*cells, *_versus(untrained, teacher, scores), DASH, DASH]))
    lines += [
        "",
        "Δ is against the teacher; *before fine-tuning* is the teacher with the student's predictor; "
        "computed per layer is the share of valid query–key pairs the student computes in each "
        "self-attention layer it restricts (encoder layers first, then decoder layers; SAMSA's learned "
        "support vectors are not pairs of the sentence); train step is the student's forward and backward "
        f"time over the teacher's, measured side by side; {time} is time relative to the teacher's.",
    ]
    parts = ["\n".join(lines)]
    for table in (_ensemble_table(students, teacher, scores), _par_table(students, teacher, scores, time)):
        if table:
            parts.append(table)
    sentences = [
        _best_student_sentence(students, teacher, scores),
        _fine_tuning_sentence(students, scores),
        _control_sentence(students, scores),
        _student_predictor_sentence(evaluation, scores),
    ]
    parts.append(" ".join(s for s in sentences if s))
    return "\n\n".join(parts)


def _score_columns(scores: Sequence[Score], suffix: str = "") -> list[str]:
    """Column names for :func:`_versus`: each measure and its Δ."""
    return [name for score in scores for name in (score.name, f"Δ {score.short}{suffix}")]


def _versus(row: dict, reference: dict, scores: Sequence[Score], *, deltas: int | None = None) -> list[str]:
    """Each measure of ``row`` and its difference to ``reference``'s, for the first ``deltas`` measures
    (all when None); the rest without their difference."""
    cells = []
    for i, score in enumerate(scores):
        cells.append(_num(row.get(score.key), score.digits))
        if deltas is None or i < deltas:
            cells.append(_signed(_difference(row.get(score.key), reference.get(score.key)), score.digits))
    return cells


def _ensemble_table(students: Sequence[dict], teacher: dict, scores: Sequence[Score]) -> str:
    """Each self-ensemble of S sampled sub-models against its own student run densely ("" without any)."""
    header = ["student", "samples S", *_score_columns(scores, " vs dense"), "decode"]
    lines = [_table_row(header), _table_row(["---"] * len(header))]
    for row in students:
        for ensemble in row.get("ensembles") or []:
            cells = [
                _cell(row["student"]),
                str(ensemble["samples"]),
                *_versus(ensemble, row, scores),
                _ratio(ensemble.get("decode_seconds"), teacher.get("decode_seconds")),
            ]
            lines.append(_table_row(cells))
    if len(lines) == 2:
        return ""
    lines += [
        "",
        "Self-ensembles average S sampled sub-models in probability space; Δ is against the same student "
        "decoded densely (its row above); decode is time relative to the teacher's.",
    ]
    return "\n".join(lines)


def _par_table(students: Sequence[dict], teacher: dict, scores: Sequence[Score], time: str) -> str:
    """Each PAR student's patterns, the share of the teacher's self-attention sublayers it keeps, its quality
    and its decoding (translation) or forward (block tasks) time beside the dense control's ("" without PAR
    students)."""
    searched = [row for row in students if row.get("par")]
    if not searched:
        return ""
    # an encoder–decoder's PAR rows name both stacks, a decoder-only LM's its decoder
    stacks = [stack for stack in ("encoder", "decoder") if any(stack in row["par"] for row in searched)]
    timed = f"{time}_seconds"
    header = [
        "student",
        *stacks,
        "attention kept",
        *_score_columns(scores),
        time,
    ]
    lines = [_table_row(header), _table_row(["---"] * len(header))]
    control = dense_control(students)
    for row in [*searched, *([control] if control else [])]:
        par = row.get("par") or {}
        cells = [
            _cell(row["student"]),
            *(_cell(par.get(stack, "teacher's")) for stack in stacks),
            _num(par.get("attention_fraction", 1.0), 2),
            *_versus(row, teacher, scores),
            _ratio(row.get(timed), teacher.get(timed)),
        ]
        lines.append(_table_row(cells))
    letters = "s self-attention, f feed-forward" + (", c cross-attention" if "encoder" in stacks else "")
    lines += [
        "",
        f"PAR students: {letters} sublayers, from the embeddings up; attention kept is the self-attention "
        f"sublayers over the teacher's; Δ is against the teacher; {time} is time relative to "
        "the teacher's. The dense control (the teacher's architecture, trained the same way) is the last "
        "row when there is one.",
    ]
    return "\n".join(lines)


def _best_student_sentence(students: Sequence[dict], teacher: dict, scores: Sequence[Score]) -> str:
    """Which student has the best first measure (ties: the sparser), at what sparsity, against the teacher."""
    primary = scores[0]
    best = best_at_least(
        students, x="sparsity", y=primary.key, x_min=-math.inf, maximize_y=primary.higher_is_better
    )
    if best is None:
        return f"No student has a {primary.name} score."
    adjective = "highest" if primary.higher_is_better else "lowest"
    lead = "The only student" if len(students) == 1 else f"The student with the {adjective} {primary.name}"
    return (
        f"{lead} is {best['student']} ({_verbs(scores)[0]} sparsity {best['sparsity']:.3f}); "
        f"{_gap_clause(best, teacher, scores)}."
    )


def _fine_tuning_sentence(students: Sequence[dict], scores: Sequence[Score]) -> str:
    """What fine-tuning with its own predicted graph did to each student that has an untrained twin."""
    primary, others = scores[0], scores[1:]
    clauses = []
    for row in students:
        before = row.get("untrained")
        if (
            not before
            or finite_number(before.get(primary.key)) is None
            or finite_number(row[primary.key]) is None
        ):
            continue
        digits = primary.digits
        moved = [
            f"{primary.name} {before[primary.key]:.{digits}f} to {row[primary.key]:.{digits}f} "
            f"({row[primary.key] - before[primary.key]:+.{digits}f})",
            *(
                f"{score.name} {_num(before.get(score.key), score.digits)} to "
                f"{_num(row.get(score.key), score.digits)}"
                for score in others
            ),
        ]
        sparsity = f"{_verbs(scores)[0]} sparsity {_num(row['sparsity'], 3)}"
        clauses.append(f"{row['student']} from {' and '.join(moved)} at {sparsity}")
    return f"Fine-tuning with its own predicted graph takes {'; '.join(clauses)}." if clauses else ""


def dense_control(students: Sequence[dict]) -> dict | None:
    """The dense control: the student with the teacher's own α-entmax and the teacher's architecture."""
    return next((row for row in students if row.get("attention") == "entmax" and not row.get("par")), None)


def _control_sentence(students: Sequence[dict], scores: Sequence[Score]) -> str:
    """Each sparse student against the dense control (a student with the teacher's own α-entmax, trained the
    same way): the cost of the sparsity alone ("" without a control)."""
    control = dense_control(students)
    primary = scores[0]
    if control is None or finite_number(control[primary.key]) is None:
        return ""
    clauses = [
        f"{row['student']} "
        + ", ".join(
            f"{_signed(_difference(row.get(s.key), control.get(s.key)), s.digits)} {s.name}" for s in scores
        )
        for row in students
        if row is not control and finite_number(row[primary.key]) is not None
    ]
    if not clauses:
        return ""
    own = ", ".join(f"{s.name} {_num(control.get(s.key), s.digits)}" for s in scores)
    return (
        f"Against the dense control ({control['student']}: the teacher trained further the same way, with "
        f"its own dense α-entmax; {own}): {'; '.join(clauses)}."
    )


def _student_predictor_sentence(evaluation: dict, scores: Sequence[Score]) -> str:
    """Each student that runs sparsely against the predictor point with the best first measure at sparsity
    ≥ its own − :data:`STUDENT_SLACK` ("" when no student has such a point). Students that run densely have
    no sparsity to match, so they are left out."""
    primary = scores[0]
    key, digits = primary.key, primary.digits
    clauses = []
    for row in student_rows(evaluation):
        sparsity, value = finite_number(row["sparsity"]), finite_number(row[key])
        if not sparsity or value is None:
            continue
        point = best_at_least(
            evaluation["quality"]["points"],
            x="sparsity",
            y=key,
            x_min=sparsity - STUDENT_SLACK,
            maximize_y=primary.higher_is_better,
        )
        if point is None:
            continue
        clauses.append(
            f"{row['student']}'s {primary.name} {value:.{digits}f} at sparsity {sparsity:.3f} vs "
            f"{point[key]:.{digits}f} with {_label(point)} at {point['sparsity']:.3f} "
            f"({value - point[key]:+.{digits}f})"
        )
    if not clauses:
        return ""
    adjective = "highest" if primary.higher_is_better else "lowest"
    return (
        f"Against the teacher {_verbs(scores)[0]}, without fine-tuning, with the best predicted graphs "
        f"({adjective} {primary.name} at sparsity ≥ the student's − {STUDENT_SLACK:g}): {'; '.join(clauses)}."
    )


# ----------------------------------------------------------------------------------------------------------
# findings: sentences generated from the numbers


def _findings(evaluation: dict, levels: Sequence[float], target: float) -> str:
    sentences = [
        _best_recall_sentence(evaluation["graphs"], levels),
        _dominance_sentence(evaluation["graphs"]),
        _operating_sentence(evaluation, target),
    ]
    return " ".join(s for s in sentences if s)


def _best_recall_sentence(rows: Sequence[dict], levels: Sequence[float]) -> str:
    """Which method has the best recall at each sparsity level."""
    clauses = []
    for i, level in enumerate(levels):
        row = recall_at_sparsity(rows, level)
        if row is None:
            clauses.append(f"no setting reaches sparsity ≥ {level:g}")
            continue
        found = f"{row['method']}'s ({row['recall']:.3f}, {_label(row)})"
        lead = f"The best recall at sparsity ≥ {level:g} is" if i == 0 else f"at sparsity ≥ {level:g} it is"
        clauses.append(f"{lead} {found}")
    text = "; ".join(clauses) + "."
    return text[0].upper() + text[1:]


def _dominance_sentence(rows: Sequence[dict]) -> str:
    """Which baselines' sparsity–recall fronts a learned method's front dominates ("" without both kinds)."""
    points = {m: finite_points(r, "sparsity", "recall")[0] for m, r in rows_by_method(rows).items()}
    points = {m: p for m, p in points.items() if p}
    learned = [m for m in points if m in LEARNED]
    baselines = [m for m in points if m not in LEARNED]
    if not learned or not baselines:
        return ""
    by = {b: [a for a in learned if front_dominates(points[a], points[b])] for b in baselines}
    beaten = [b for b in baselines if by[b]]
    standing = [b for b in baselines if not by[b]]
    if not beaten:
        return (
            f"No learned method's sparsity–recall front Pareto-dominates a baseline's "
            f"({', '.join(baselines)})."
        )
    detail = "; ".join(f"{b} by {', '.join(by[b])}" for b in beaten)
    if not standing:
        return f"Every baseline's sparsity–recall front is Pareto-dominated by a learned method ({detail})."
    return (
        f"The sparsity–recall fronts of {', '.join(beaten)} are Pareto-dominated by a learned method "
        f"({detail}); those of {', '.join(standing)} are not."
    )


def _operating_sentence(evaluation: dict, target: float) -> str:
    """Where the best method reaches the recall target, and what decoding with that graph costs."""
    best = sparsity_at_recall(evaluation["graphs"], target)
    if best is None:
        top = highest_recall(evaluation["graphs"])
        if top is None:
            return f"No setting reaches recall ≥ {target:g}."
        return (
            f"No setting reaches recall ≥ {target:g}; the highest recall is {top['method']}'s "
            f"{top['recall']:.3f} at sparsity {top['sparsity']:.3f} ({_label(top)})."
        )
    found = (
        f"At recall ≥ {target:g} the sparsest setting is {best['method']}'s: sparsity {best['sparsity']:.3f} "
        f"with {_label(best)} (recall {best['recall']:.3f})"
    )
    scores = task_scores(evaluation)
    return f"{found}; {_gap_clause(quality_at(evaluation, best), teacher_quality(evaluation), scores)}."


def _gap_clause(point: dict | None, teacher: dict, scores: Sequence[Score]) -> str:
    """The task's measures with a setting's graph, and their gaps to the teacher's."""
    names = " and ".join(score.name for score in scores)
    gerund, participle = _verbs(scores)
    if point is None:
        verb = "are" if len(scores) > 1 else "is"
        return f"it was not {participle} with its predicted graph, so its {names} {verb} not measured"
    parts = []
    for score in scores:
        key, digits = score.key, score.digits
        value = finite_number(point.get(key))
        if value is None:
            continue
        gap = _difference(value, teacher.get(key))
        versus = "" if gap is None else f" ({gap:+.{digits}f} vs the teacher's {teacher[key]:.{digits}f})"
        parts.append(f"{score.name} {value:.{digits}f}{versus}")
    if not parts:
        return f"{gerund} with it gave no {names}"
    return f"{gerund} with it gives " + " and ".join(parts)
