"""The markdown report assembled from its sections, in order, with the headline JSON."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.evaluation.report.facts import facts
from pipeline.evaluation.report.findings import findings
from pipeline.evaluation.report.headline import headline
from pipeline.evaluation.report.indexer import indexer_table
from pipeline.evaluation.report.methods import method_table
from pipeline.evaluation.report.points import student_rows
from pipeline.evaluation.report.quality import quality_table
from pipeline.evaluation.report.speed import speed_table
from pipeline.evaluation.report.students import students_section


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
        facts(evaluation),
        "## Sparsity and recall per method",
        method_table(evaluation, sparsity_levels, recall_target),
        f"## {'Translation' if task == 'translation' else 'Language-model'} quality with predicted graphs",
        quality_table(evaluation),
    ]
    if evaluation.get("speed"):
        sections += ["## Speed inside the model", speed_table(evaluation)]
    if student_rows(evaluation):
        sections += ["## Students", students_section(evaluation)]
    sections += [
        "## Findings",
        findings(evaluation, sparsity_levels, recall_target),
    ]
    indexer = indexer_table(evaluation)
    if indexer:
        sections += ["## τ-indexer: rank and fitting", indexer]
    if figures:
        sections += ["## Figures", "\n\n".join(f"![{caption}]({path})" for caption, path in figures)]
    markdown = "\n\n".join(sections) + "\n"
    return markdown, headline(evaluation, sparsity_levels=sparsity_levels, recall_target=recall_target)
