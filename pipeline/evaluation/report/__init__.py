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

One module per section of the report, and what they share:

- :mod:`~pipeline.evaluation.report.load`: the evaluate stage's JSON read and checked, wall times put back;
  its evidence (``quality.json``) read, checked and attached to each quality row.
- :mod:`~pipeline.evaluation.report.verdicts`: a difference with its interval, and the verdict it supports.
- :mod:`~pipeline.evaluation.report.claims`: each seed paper's headline claim, checked.
- :mod:`~pipeline.evaluation.report.evidence`: every quality row with its interval and verdicts.
- :mod:`~pipeline.evaluation.report.scores`: the task's measures and the words for how a model is run.
- :mod:`~pipeline.evaluation.report.points`: method order, rows by method, selections (recall at sparsity,
  sparsity at recall, the operating point, the dense control).
- :mod:`~pipeline.evaluation.report.cells`: numbers and table cells, written one way everywhere.
- :mod:`~pipeline.evaluation.report.headline`: the headline JSON (the DVC metric).
- :mod:`~pipeline.evaluation.report.facts`: the opening facts about the evaluation.
- :mod:`~pipeline.evaluation.report.methods`: sparsity and recall per method.
- :mod:`~pipeline.evaluation.report.quality`: quality with predicted graphs.
- :mod:`~pipeline.evaluation.report.speed`: speed inside the model.
- :mod:`~pipeline.evaluation.report.students`: the students, their self-ensembles and PAR students.
- :mod:`~pipeline.evaluation.report.student_sentences`: the sentences closing the students section.
- :mod:`~pipeline.evaluation.report.findings`: the findings, sentences generated from the numbers.
- :mod:`~pipeline.evaluation.report.indexer`: the τ-indexer's rank and fitting.
- :mod:`~pipeline.evaluation.report.build`: the sections assembled into the markdown, with the headline.
"""

from pipeline.evaluation.control import dense_control
from pipeline.evaluation.report.build import build_report
from pipeline.evaluation.report.cells import num
from pipeline.evaluation.report.headline import headline
from pipeline.evaluation.report.indexer import INDEXER_RECALL, INDEXER_SLACK
from pipeline.evaluation.report.load import (
    GRAPH_KEYS,
    QUALITY_KEYS,
    REQUIRED_KEYS,
    attach_evidence,
    load_evaluation,
    load_evidence,
)
from pipeline.evaluation.report.points import (
    LEARNED,
    METHOD_ORDER,
    finite_points,
    highest_recall,
    method_order,
    operating_point,
    quality_at,
    recall_at_sparsity,
    rows_by_method,
    setting_key,
    sparsity_at_recall,
    student_rows,
    teacher_quality,
)
from pipeline.evaluation.report.scores import ACCURACY, BLEU, PERPLEXITY, TASK_SCORES, Score, task_scores
from pipeline.evaluation.report.student_sentences import STUDENT_SLACK
from pipeline.evaluation.table_text import DASH, formatted

__all__ = [
    "ACCURACY",
    "BLEU",
    "DASH",
    "GRAPH_KEYS",
    "INDEXER_RECALL",
    "INDEXER_SLACK",
    "LEARNED",
    "METHOD_ORDER",
    "PERPLEXITY",
    "QUALITY_KEYS",
    "REQUIRED_KEYS",
    "STUDENT_SLACK",
    "TASK_SCORES",
    "Score",
    "attach_evidence",
    "build_report",
    "dense_control",
    "finite_points",
    "formatted",
    "headline",
    "highest_recall",
    "load_evaluation",
    "load_evidence",
    "method_order",
    "num",
    "operating_point",
    "quality_at",
    "recall_at_sparsity",
    "rows_by_method",
    "setting_key",
    "sparsity_at_recall",
    "student_rows",
    "task_scores",
    "teacher_quality",
]
