"""Stage ``evaluate``: every predictor and baseline on the held-out graph store, then translation quality with
predicted graphs at each method's best points, the students and the speed table
(:mod:`pipeline.evaluation.run`)."""

from __future__ import annotations

from pipeline.atomic import staged_outputs
from pipeline.checks.evaluate import check_inputs, check_params, declared_students
from pipeline.errors import exits_cleanly
from pipeline.evaluation.evidence import write_evidence
from pipeline.evaluation.run import run_evaluation
from pipeline.params.evaluate import Evaluate
from pipeline.params.student import Student
from pipeline.stage import other_section, stage_params
from pipeline.timings import write_metrics


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("evaluate", Evaluate, argv)
    check_params(params)
    students = declared_students(other_section("student", Student, argv) if params.students else None)
    inputs = check_inputs(params, students)
    evaluation, evidence = run_evaluation(params, inputs)
    # the evaluation, its wall times and its evidence are swapped in together
    with staged_outputs(params.out, params.timings, params.evidence, params.hypotheses):
        write_metrics(params.out, evaluation, params.timings)
        write_evidence(evidence, params.evidence, params.hypotheses)


if __name__ == "__main__":
    main()
