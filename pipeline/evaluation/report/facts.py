"""The report's opening facts: the attention and graph store evaluated, the gold sparsity, the teacher's
measures and the learned projections."""

from __future__ import annotations

from pipeline.evaluation.report.cells import num
from pipeline.evaluation.report.points import teacher_quality
from pipeline.evaluation.report.scores import BLEU, task_scores, verbs
from pipeline.evaluation.table_text import DASH


def facts(evaluation: dict) -> str:
    store = evaluation["store"] or {}
    teacher = teacher_quality(evaluation)
    shape = (
        f", {store['layers']} layers × {store['heads']} heads"
        if "layers" in store and "heads" in store
        else ""
    )
    signature = f" (`{teacher['signature']}`)" if teacher.get("signature") else ""
    measures = ", ".join(
        f"{score.name} {num(teacher.get(score.key), score.digits)}" + (signature if score is BLEU else "")
        for score in task_scores(evaluation)
    )
    unit = "sentences" if evaluation.get("task", "translation") == "translation" else "blocks"
    gerund = verbs(task_scores(evaluation))[0]
    lines = [
        f"- attention: **{evaluation['kind']}**, graphs from `{store.get('path', DASH)}` "
        f"({store.get('split', DASH)} split, {store.get('sentences', DASH)} {unit}{shape})",
        f"- gold sparsity of the teacher's α-entmax graphs: {num(evaluation['gold_sparsity'], 3)}",
        f"- teacher: {measures}, {gerund} sparsity {num(teacher.get('sparsity'), 3)}",
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
