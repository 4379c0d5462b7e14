"""The section "Evidence": every quality row with its 95 % interval, its paired difference from the teacher
and the verdict it supports, and each student against the dense control."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.evaluation.report.cells import num
from pipeline.evaluation.report.verdicts import (
    MEASURES,
    difference_text,
    judge,
    shown_value,
    task_measures,
    tolerance_text,
    training_seeds,
    value_text,
)
from pipeline.evaluation.table_text import DASH, cell, table_row

SHORT_VERDICTS = {"keeps": "keeps", "better": "better", "worse": "worse", "not distinguishable": "n.d."}
KINDS = {"teacher": "teacher", "point": "predicted graph", "student": "student"}
KINDS |= {"untrained": "student before fine-tuning", "ensemble": "self-ensemble"}


def row_head(row: Mapping) -> list[str]:
    """An evidence row's first cells: its name, its kind, the sparsity and the graph recall it ran at."""
    kind = KINDS.get(row["kind"], row["kind"])
    return [cell(row["name"]), kind, num(row.get("sparsity"), 3), num(row.get("recall"), 3)]


def measures_of(evidence: dict) -> list[str]:
    """The measures the evidence holds, in :data:`MEASURES` order (those of its first row, the teacher)."""
    first = evidence["rows"][0]
    return [key for key in MEASURES if key in first]


def judged_measures(evidence: dict) -> list[str]:
    """The measures a verdict is given on: the task's own (BLEU and perplexity, or perplexity and mlm
    accuracy) and KL to the teacher."""
    first = evidence["rows"][0]
    return [*task_measures(first), *(["kl"] if "kl" in first else [])]


def verdicts(compared: Mapping[str, dict], keys: Sequence[str], tolerances: Mapping[str, float]) -> str:
    """``BLEU n.d., perplexity worse, KL keeps``; a dash without comparisons."""
    found = [
        f"{MEASURES[key].name} {SHORT_VERDICTS[judge(compared[key], key, tolerances)]}"
        for key in keys
        if key in compared
    ]
    return ", ".join(found) or DASH


def preamble(evidence: dict) -> str:
    """How every row was measured: the units, the decoding, the resamples, the seeds."""
    rows = evidence["rows"]
    count, split = rows[0]["sentences"], evidence.get("split_units")
    whole = (
        "the whole test split" if split in (None, count) else f"the first {count} of the test split's {split}"
    )
    units = f"{count} {evidence['units']} ({whole})"
    decoding = evidence.get("decoding")
    decoded = ""
    if decoding:
        beams = decoding["beams"]
        how = "greedily" if beams == 1 else f"by beam search (beam {beams})"
        which = "every model"
        if decoding.get("decoded") == "operating":
            which = "the teacher, every student and each method's operating point"
        decoded = f", {which} decoded {how} with at most {decoding['max_new_tokens']} new tokens"
        if decoding.get("decoded") == "operating":
            decoded += " (the other points are scored teacher-forced alone: they have no BLEU or chrF)"
    corpus = "BLEU and chrF from sacreBLEU's own sufficient statistics, " if decoding else ""
    return (
        f"Every model is scored on the same {units}{decoded}. Intervals are 95 % "
        f"paired bootstrap percentile intervals over {evidence['resamples']} resamples of the "
        f"{evidence['units']} (seed {evidence['bootstrap_seed']}), one set of resamples shared by every row: "
        f"{corpus}the teacher-forced measures (perplexity, KL(teacher ‖ model) per token, top-1 agreement "
        "with the teacher) from sums over each unit"
        + ("" if decoding else " (consecutive blocks of one text, resampled as if independent)")
        + ". "
        "Perplexity differences are relative. " + _seeds_sentence(training_seeds(evidence))
    )


def _seeds_sentence(seeds: int) -> str:
    """What a student's row is: one training run, or the mean over several."""
    if seeds == 1:
        return (
            "Each student was trained once (one seed): its interval is the test set's uncertainty alone, not "
            "the spread over training runs."
        )
    return (
        f"Each student was trained {seeds} times (one seed each): its row is the mean over the seeds, its "
        "interval the test set's uncertainty of that mean, and sd after it the seeds' standard deviation "
        "(the spread over training runs)."
    )


def evidence_section(evidence: dict, tolerances: Mapping[str, float]) -> str:
    """The preamble, the table of every row against the teacher, and the students against the dense
    control."""
    keys = measures_of(evidence)
    judged = judged_measures(evidence)
    compared = task_measures(evidence["rows"][0])
    header = [
        "model",
        "kind",
        "sparsity",
        "recall",
        *(MEASURES[key].name for key in keys),
        *(f"Δ {MEASURES[key].name} vs teacher" for key in compared),
        "vs teacher",
    ]
    lines = [table_row(header), table_row(["---"] * len(header))]
    for row in evidence["rows"]:
        versus = row.get("vs_teacher") or {}
        lines.append(
            table_row(
                [
                    *row_head(row),
                    *(value_text(row[key], key) if key in row else DASH for key in keys),
                    *(difference_text(versus[key], key) if key in versus else DASH for key in compared),
                    verdicts(versus, judged, tolerances),
                ]
            )
        )
    bounds = ", ".join(f"{MEASURES[key].name} {tolerance_text(key, tolerances)}" for key in judged)
    lines += [
        "",
        f"A verdict is *keeps* when the whole interval of the difference lies within the tolerance "
        f"({bounds}), *better* or *worse* when it excludes 0, and *n.d.* (not distinguishable) otherwise.",
    ]
    parts = [preamble(evidence), "\n".join(lines)]
    control = evidence.get("dense_control")
    students = [row for row in evidence["rows"] if row["kind"] == "student" and "vs_dense" in row]
    if control and students:
        header = ["student", *(f"Δ {MEASURES[key].name} vs {control}" for key in judged), "vs dense control"]
        lines = [table_row(header), table_row(["---"] * len(header))]
        for row in students:
            versus = row["vs_dense"]
            lines.append(
                table_row(
                    [
                        cell(row["name"]),
                        *(difference_text(versus[key], key) if key in versus else DASH for key in judged),
                        verdicts(versus, judged, tolerances),
                    ]
                )
            )
        lines += [
            "",
            f"The dense control ({control}) is the teacher trained further exactly as the students are, with "
            "its own dense α-entmax: a student's difference from it is its attention's alone.",
        ]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def headline_table(evaluation: dict, points: Sequence[dict]) -> str:
    """The table a reader looks at first: the teacher, each method's operating point (``points``, the
    teacher decoding with that method's graph) and each student, with its sparsity and recall, its first
    measure with the 95 % interval, its paired differences from the teacher, KL to the teacher and its time
    relative to the teacher's."""
    evidence = evaluation["evidence"]
    keys = task_measures(evidence["rows"][0])
    first = MEASURES[keys[0]]
    decodes = "bleu" in keys
    timed = "decode_seconds" if decodes else "forward_seconds"
    teacher = evaluation["quality"]["teacher"]
    header = [
        "model",
        "sparsity",
        "recall",
        f"{first.name} [95 % CI]",
        *(f"Δ {MEASURES[key].name} vs teacher" for key in keys),
        "KL",
        "decode" if decodes else "forward",
    ]
    lines = [table_row(header), table_row(["---"] * len(header))]
    shown = [
        ("teacher", teacher),
        *((f"teacher + {point['method']}: `{point['label']}`", point) for point in points),
        *((f"student: {row['student']}", row) for row in evaluation.get("students") or []),
    ]
    for name, row in shown:
        own = row.get("evidence")
        if not own:
            continue
        versus = own.get("vs_teacher") or {}
        time = row.get(timed)
        reference = teacher.get(timed)
        lines.append(
            table_row(
                [
                    cell(name),
                    num(own.get("sparsity"), 3),
                    num(own.get("recall"), 3),
                    value_text(own[first.key], first.key),
                    *(difference_text(versus[key], key) if key in versus else DASH for key in keys),
                    num(shown_value(own["kl"]["value"], "kl"), 4) if "kl" in own else DASH,
                    f"{time / reference:.2f}×" if time and reference else DASH,
                ]
            )
        )
    units = f"{evidence['rows'][0]['sentences']} {evidence['units']}"
    lines += [
        "",
        f"On {units}, every model {'decoded and ' if decodes else ''}scored the same way (see Evidence); "
        "differences are paired, "
        "perplexity's relative; KL is KL(teacher ‖ model) in nats per token; the last column is time over "
        "the teacher's, above 1× slower. Each method's row is its sparsest decoded setting with graph "
        "recall at or above the recall target, or its highest-recall one when none reaches it.",
    ]
    return "\n".join(lines)
