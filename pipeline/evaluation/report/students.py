"""The section "Students": each student against the teacher, its self-ensembles against itself, the PAR
students beside the dense control, then the sentences of
:mod:`~pipeline.evaluation.report.student_sentences`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.evaluation.control import dense_control
from pipeline.evaluation.report.cells import num, ratio, score_columns, versus
from pipeline.evaluation.report.points import student_rows, teacher_quality
from pipeline.evaluation.report.scores import Score, task_scores, verbs
from pipeline.evaluation.report.student_sentences import (
    best_student_sentence,
    control_sentence,
    fine_tuning_sentence,
    student_predictor_sentence,
)
from pipeline.evaluation.table_text import DASH, cell, table_row


def students_section(evaluation: dict, tolerances: Mapping[str, float] | None = None) -> str:
    """The students against the teacher, their self-ensembles against themselves, and what stands out."""
    teacher = teacher_quality(evaluation)
    students = student_rows(evaluation)
    scores = task_scores(evaluation)
    time = "decode" if evaluation.get("task", "translation") == "translation" else "forward"
    header = [
        "student",
        f"{verbs(scores)[0]} sparsity",
        "computed per layer",
        *score_columns(scores),
        "train step",
        time,
    ]
    lines = [table_row(header), table_row(["---"] * len(header))]
    for row in students:
        computed = row.get("computed_fraction_per_layer")
        cells = [
            cell(row["student"]),
            num(row["sparsity"], 3),
            " / ".join(num(value, 2) for value in computed) if computed else DASH,
            *versus(row, teacher, scores, against="teacher"),
            ratio(row.get("train_step_seconds"), row.get("teacher_train_step_seconds")),
            ratio(row.get(f"{time}_seconds"), teacher.get(f"{time}_seconds")),
        ]
        lines.append(table_row(cells))
        untrained = row.get("untrained")
        if untrained:
            cells = [f"{cell(row['student'])}, before fine-tuning", num(untrained.get("sparsity"), 3), DASH]
            lines.append(
                table_row([*cells, *versus(untrained, teacher, scores, against="teacher"), DASH, DASH])
            )
    lines += [
        "",
        "Δ is against the teacher (with evidence: paired, with its 95 % interval, perplexity in per cent); "
        "*before fine-tuning* is the teacher with the student's predictor; "
        "computed per layer is the share of valid query–key pairs the student computes in each "
        "self-attention layer it restricts (encoder layers first, then decoder layers; SAMSA's learned "
        "support vectors are not pairs of the sentence); train step is the student's forward and backward "
        f"time over the teacher's, measured side by side; {time} is time relative to the teacher's.",
    ]
    parts = ["\n".join(lines)]
    for table in (_ensemble_table(students, teacher, scores), _par_table(students, teacher, scores, time)):
        if table:
            parts.append(table)
    if tolerances is not None and evaluation.get("evidence"):
        # with evidence, every comparison is a paired difference with its interval; a student against the
        # best predictor point at its sparsity has none (two rows' intervals against the teacher are not one)
        sentences = [
            best_student_sentence(students, teacher, scores, tolerances),
            fine_tuning_sentence(students, scores, tolerances),
            control_sentence(students, scores, tolerances),
        ]
    else:
        sentences = [
            best_student_sentence(students, teacher, scores),
            fine_tuning_sentence(students, scores),
            control_sentence(students, scores),
            student_predictor_sentence(evaluation, scores),
        ]
    parts.append(" ".join(s for s in sentences if s))
    return "\n\n".join(parts)


def _ensemble_table(students: Sequence[dict], teacher: dict, scores: Sequence[Score]) -> str:
    """Each self-ensemble of S sampled sub-models against its own student run densely ("" without any)."""
    header = ["student", "samples S", *score_columns(scores, " vs dense"), "decode"]
    lines = [table_row(header), table_row(["---"] * len(header))]
    for row in students:
        for ensemble in row.get("ensembles") or []:
            cells = [
                cell(row["student"]),
                str(ensemble["samples"]),
                *versus(ensemble, row, scores, against="student"),
                ratio(ensemble.get("decode_seconds"), teacher.get("decode_seconds")),
            ]
            lines.append(table_row(cells))
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
        *score_columns(scores),
        time,
    ]
    lines = [table_row(header), table_row(["---"] * len(header))]
    control = dense_control(students)
    for row in [*searched, *([control] if control else [])]:
        par = row.get("par") or {}
        cells = [
            cell(row["student"]),
            *(cell(par.get(stack, "teacher's")) for stack in stacks),
            num(par.get("attention_fraction", 1.0), 2),
            *versus(row, teacher, scores, against="teacher"),
            ratio(row.get(timed), teacher.get(timed)),
        ]
        lines.append(table_row(cells))
    letters = "s self-attention, f feed-forward" + (", c cross-attention" if "encoder" in stacks else "")
    lines += [
        "",
        f"PAR students: {letters} sublayers, from the embeddings up; attention kept is the self-attention "
        f"sublayers over the teacher's; Δ is against the teacher; {time} is time relative to "
        "the teacher's. The dense control (the teacher's architecture, trained the same way) is the last "
        "row when there is one.",
    ]
    return "\n".join(lines)
