"""Stage ``report``: Pareto fronts, figures and a generated markdown report from the evaluation's JSON."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.atomic import atomic_path, staged_outputs, write_json, write_text
from pipeline.errors import exits_cleanly
from pipeline.evaluation.report import attach_evidence, build_report, load_evaluation, load_evidence
from pipeline.evaluation.report.headline import headline_rows
from pipeline.params.report import Report
from pipeline.plots.pareto import CAPTIONS, write_report_plots
from pipeline.stage import stage_params


@exits_cleanly
def main(argv: list[str] | None = None) -> None:
    params = stage_params("report", Report, argv)
    evaluation = attach_evidence(
        load_evaluation(params.evaluation, params.timings), load_evidence(params.evidence)
    )
    # the figures, the report linking them and its headline numbers are swapped in together
    with staged_outputs(params.plots, params.out, params.metrics, params.results):
        write(params, evaluation)


def write(params: Report, evaluation: dict) -> None:
    """Write the report's figures, its markdown, its headline metrics and the Results table's rows."""
    files = write_report_plots(evaluation, params.plots, recall_target=params.recall_target)
    # the report links its figures relative to where it lies, so it renders wherever the folder is opened
    here = Path(params.out).parent
    figures = [
        (caption, Path(os.path.relpath(files[name], here)).as_posix())
        for name, caption in CAPTIONS.items()
        if name in files
    ]
    markdown, headline = build_report(
        evaluation,
        sparsity_levels=params.sparsity_levels,
        recall_target=params.recall_target,
        tolerances=params.tolerances.model_dump(),
        figures=figures,
    )
    write_text(params.out, markdown)
    write_json(params.metrics, headline)
    with atomic_path(params.results, directory=True) as folder:
        for name, row in headline_rows(evaluation, params.recall_target).items():
            write_json(folder / f"{name}.json", row)


if __name__ == "__main__":
    main()
