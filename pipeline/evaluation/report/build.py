"""The markdown report assembled from its sections, in order, with the headline JSON."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.evaluation.report.claims import claims_section
from pipeline.evaluation.report.evidence import evidence_section, headline_table
from pipeline.evaluation.report.facts import facts
from pipeline.evaluation.report.findings import findings
from pipeline.evaluation.report.headline import headline, operating_points
from pipeline.evaluation.report.indexer import indexer_table
from pipeline.evaluation.report.methods import method_table
from pipeline.evaluation.report.points import student_rows
from pipeline.evaluation.report.quality import quality_table
from pipeline.evaluation.report.recall import recall_section
from pipeline.evaluation.report.speed import speed_table
from pipeline.evaluation.report.students import students_section
from pipeline.params.report import Tolerances


def build_report(
    evaluation: dict,
    *,
    sparsity_levels: Sequence[float] = (0.8, 0.9),
    recall_target: float = 0.95,
    tolerances: Mapping[str, float] | None = None,
    figures: Sequence[tuple[str, str]] = (),
) -> tuple[str, dict]:
    """The markdown report and the headline JSON of an evaluation (with its evidence attached by
    :func:`~pipeline.evaluation.report.load.attach_evidence`, the Evidence and Claims sections and every
    comparison's interval; without, point values alone).

    ``tolerances`` (by measure, default the report params' defaults) decide when a difference "keeps" the
    reference's quality; ``figures`` are (caption, path relative to the report) pairs shown at the end.
    """
    task = evaluation.get("task", "translation")
    tolerances = dict(tolerances or Tolerances().model_dump())
    sections = [f"# Learned sparse attention: {evaluation['kind']}", facts(evaluation)]
    if evaluation.get("evidence"):
        sections += [
            "## Headline",
            headline_table(evaluation, operating_points(evaluation, recall_target)),
            "## Claims",
            claims_section(evaluation, tolerances),
            "## Evidence",
            evidence_section(evaluation["evidence"], tolerances),
        ]
    recall = recall_section(evaluation, tolerances)
    if recall:
        sections += ["## Associative recall by query distance", recall]
    sections += [
        "## Sparsity and recall per method",
        method_table(evaluation, sparsity_levels, recall_target),
        f"## {'Translation' if task == 'translation' else 'Language-model'} quality with predicted graphs",
        quality_table(evaluation),
    ]
    if evaluation.get("speed"):
        sections += ["## Speed inside the model", speed_table(evaluation)]
    if student_rows(evaluation):
        sections += ["## Students", students_section(evaluation, tolerances)]
    sections += [
        "## Findings",
        findings(evaluation, sparsity_levels, recall_target, tolerances),
    ]
    indexer = indexer_table(evaluation)
    if indexer:
        sections += ["## τ-indexer: rank and fitting", indexer]
    if figures:
        sections += ["## Figures", "\n\n".join(f"![{caption}]({path})" for caption, path in figures)]
    markdown = "\n\n".join(sections) + "\n"
    return markdown, headline(evaluation, sparsity_levels=sparsity_levels, recall_target=recall_target)
