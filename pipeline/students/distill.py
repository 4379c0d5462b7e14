"""Knowledge distillation from the teacher into a student, inside the Hugging Face Trainer.

For every target token t with the student's logits s_t and the teacher's logits z_t (same prefix, teacher
forcing; a causal LM's logits at position t − 1 are those that predict token t), temperature T and weight λ:

    loss = (1 − λ) · CE(s, labels)  +  λ · T² · mean_t KL( softmax(z_t / T) ‖ softmax(s_t / T) )

CE is the Trainer's own loss (label smoothing included); the T² keeps the soft term's gradients on the
scale of the hard term's as T grows (Hinton et al., 2015). The teacher's logits are computed on the fly, in
the same batch, with gradients off: caching them would mean storing vocab-sized vectors for every target
token of the training set, while one extra forward costs about a third of a training step.

An attention that regularises its own training (SBM's density term) registers a loss penalty
(:func:`~pipeline.attention.interface.register_loss_penalty`); its term is added to every training step's
loss, once per optimizer step (split over the gradient-accumulation window, averaged across devices as the
gradients are).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel, Seq2SeqTrainer

from pipeline.attention.interface import loss_penalty
from pipeline.attention.recording import model_layout
from pipeline.params.training import Distillation


def distillation_loss_sum(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    distillation: Distillation,
    smoothing: float,
) -> Tensor:
    """Σ over target tokens (labels ≠ −100) of (1 − λ) · CE_ε + λ · T² · KL(teacher_T ‖ student_T).

    Shapes: logits (b, t, V), labels (b, t). CE_ε is cross-entropy with label smoothing ε, the Trainer's
    ``(1 − ε) · nll + ε · mean_v(−log p_v)``. Computed in float32; the caller normalizes the sum.
    """
    keep = labels.ne(-100)  # (b, t)
    logits = student_logits[keep].float()  # (tokens, V)
    ce = torch.nn.functional.cross_entropy(logits, labels[keep], label_smoothing=smoothing, reduction="sum")
    temperature = distillation.temperature
    student = torch.log_softmax(logits / temperature, dim=-1)
    teacher = torch.log_softmax(teacher_logits[keep].float() / temperature, dim=-1)
    kl = torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="sum") * temperature**2
    return (1.0 - distillation.weight) * ce + distillation.weight * kl


class DistillationTrainer(Seq2SeqTrainer):
    """A :class:`~transformers.Seq2SeqTrainer` whose loss is :func:`distillation_loss_sum` against a frozen
    ``teacher`` (moved to the training device, kept in eval mode); the validation loss is the same.

    The loss goes through the Trainer's ``compute_loss_func`` hook, so the Trainer normalizes it as it does
    its own: by the target tokens of the whole gradient-accumulation window (``num_items_in_batch``, across
    devices under DDP), or of the batch when it gives none (validation).
    """

    def __init__(
        self, *args: Any, teacher: PreTrainedModel, distillation: Distillation, **kwargs: Any
    ) -> None:
        super().__init__(*args, compute_loss_func=self._loss, **kwargs)
        self.teacher = teacher.to(self.args.device).eval().requires_grad_(False)
        self.distillation = distillation
        # a causal LM's logits at position t predict the label at t + 1 (the model shifts its own labels)
        self.shifted = model_layout(self.teacher) == "decoder_only"
        self._teacher_logits: Tensor | None = None

    def compute_loss(
        self,
        model: PreTrainedModel,
        inputs: dict[str, Tensor],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Any]:
        with torch.no_grad():
            self._teacher_logits = self.teacher(**inputs).logits  # (b, t, V), read by _loss
        try:
            result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self._teacher_logits = None
        penalty = loss_penalty(model) if model.training else None
        if penalty is None:
            return result
        penalty = penalty / self.current_gradient_accumulation_steps
        return (result[0] + penalty, result[1]) if return_outputs else result + penalty

    def _loss(self, outputs: Any, labels: Tensor, num_items_in_batch: Tensor | int | None = None) -> Tensor:
        student, teacher = outputs.logits, self._teacher_logits
        if self.shifted:
            student, teacher, labels = student[:, :-1], teacher[:, :-1], labels[:, 1:]
        total = distillation_loss_sum(
            student, teacher, labels, self.distillation, self.args.label_smoothing_factor
        )
        tokens = num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum().clamp(min=1)
        return total / tokens
