"""Linear decay with warm restarts: the learning rate schedule of a training run in phases.

Phase i starts at step s_i (s_0 = 0) with peak rate η_i (η_0 = ``lr``) and ends where the next begins (or at
``max_steps``, e_i). With w warm-up steps, the rate at step t of phase i is

    η(t) = η_i · (t − s_i) / w                        for t − s_i < w,
    η(t) = η_i · max(0, (e_i − t) / (e_i − s_i − w))  after,

so phase 0 is exactly the Trainer's ``linear`` schedule of a run that stops at e_0, and each restart is that
of a fresh run of e_i − s_i steps from the weights reached so far (the optimizer's moments carry over). A
circuit that forms late under a high rate (associative recall does) is then refined at a lower one in the
same run.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.optim.lr_scheduler import LambdaLR
from transformers import TrainerCallback

from pipeline.params.training import Training


def restarted_factor(step: int, settings: Training) -> float:
    """η(step) / ``settings.lr`` under the phases of ``settings.restarts`` (the formula above)."""
    start, end, peak = [phase for phase in settings.phases() if phase[0] <= step][-1]
    warmup, local = settings.warmup_steps, step - start
    if local < warmup:
        share = local / max(1, warmup)
    else:
        share = max(0.0, (end - step) / max(1, end - start - warmup))
    return peak / settings.lr * share


class RestartedSchedule(TrainerCallback):
    """Give the Trainer's ``linear`` schedule the restarts of ``settings`` (:func:`restarted_factor`).

    The Trainer builds its scheduler (a ``LambdaLR``) and, when resuming, loads its step count before training
    begins; this swaps the factor it applies and sets the rate of the current step, so a run resumed after a
    restart continues at the restarted rate."""

    def __init__(self, settings: Training) -> None:
        self.settings = settings

    def factor(self, step: int) -> float:
        return restarted_factor(step, self.settings)

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs) -> None:
        if not isinstance(lr_scheduler, LambdaLR):
            raise TypeError(
                f"restarts need the linear schedule's LambdaLR, got {type(lr_scheduler).__name__}"
            )
        lr_scheduler.lr_lambdas = [self.factor for _ in lr_scheduler.optimizer.param_groups]
        step = lr_scheduler.last_epoch
        for group, base in zip(lr_scheduler.optimizer.param_groups, lr_scheduler.base_lrs, strict=True):
            group["lr"] = base * self.factor(step)
        lr_scheduler._last_lr = [group["lr"] for group in lr_scheduler.optimizer.param_groups]


def schedule_callbacks(settings: Training) -> Sequence[TrainerCallback]:
    """The callbacks that shape the schedule of ``settings``: none for a single phase."""
    return [RestartedSchedule(settings)] if settings.restarts else []


__all__ = ["RestartedSchedule", "restarted_factor", "schedule_callbacks"]
