"""Linear decay with warm restarts (``pipeline.training.schedule``): each phase is the Trainer's own linear
schedule of a fresh run, and the Trainer follows it, resumed runs included."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from transformers import Trainer, TrainerCallback, TrainingArguments, get_linear_schedule_with_warmup

from pipeline.params.training import Training
from pipeline.training.schedule import restarted_factor, schedule_callbacks


def linear_factors(steps: int, warmup: int) -> list[float]:
    """The Trainer's ``linear`` schedule of a run of ``steps``, as factors of the peak rate."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = get_linear_schedule_with_warmup(optimizer, warmup, steps)
    return [schedule.lr_lambdas[0](step) for step in range(steps)]


def test_each_phase_is_a_fresh_linear_run_at_its_own_peak():
    settings = Training(
        max_steps=300, lr=3e-3, warmup_steps=10, schedule="linear", restarts=[{"step": 200, "lr": 1e-3}]
    )
    factors = [restarted_factor(step, settings) for step in range(300)]
    assert factors[:200] == pytest.approx(linear_factors(200, 10))  # a 200-step run, stopped at 0
    assert factors[200:] == pytest.approx([f / 3 for f in linear_factors(100, 10)])  # 1e-3 / 3e-3
    assert factors[199] > 0 and factors[200] == 0 and factors[210] == pytest.approx(1 / 3)


def test_without_restarts_the_schedule_is_the_trainers():
    settings = Training(max_steps=50, lr=1e-3, warmup_steps=5, schedule="linear")
    assert [restarted_factor(step, settings) for step in range(50)] == pytest.approx(linear_factors(50, 5))
    assert schedule_callbacks(settings) == []


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"schedule": "inverse_sqrt"}, "restarts need schedule 'linear', not 'inverse_sqrt'"),
        ({"restarts": [{"step": 30, "lr": 1e-3}, {"step": 33, "lr": 1e-3}]}, "increase by more than warmup"),
        ({"restarts": [{"step": 60, "lr": 1e-3}]}, "stay below max_steps (50)"),
        ({"restarts": [{"step": 20, "lr": 0.0}]}, "greater than 0"),
    ],
)
def test_restarts_that_cannot_run_are_refused(changes, named):
    settings = {
        "max_steps": 50,
        "warmup_steps": 4,
        "schedule": "linear",
        "restarts": [{"step": 20, "lr": 1e-3}],
    }
    with pytest.raises(ValidationError, match=named.replace("(", r"\(").replace(")", r"\)")):
        Training(**(settings | changes))


class Quadratic(torch.nn.Module):
    """A model the Trainer can run: the loss is ‖w − x‖² of a batch of points."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": ((self.weight - x) ** 2).sum(-1).mean()}


class Points(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor([float(i % 7), 1.0])}


class RecordRates(TrainerCallback):
    """The rate each optimizer step ran at."""

    def __init__(self) -> None:
        self.rates: dict[int, float] = {}

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs) -> None:
        self.rates[state.global_step] = optimizer.param_groups[0]["lr"]


def train(settings: Training, out, *, stop: int | None = None, resume: str | None = None) -> dict[int, float]:
    record = RecordRates()
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=settings.max_steps,
        per_device_train_batch_size=4,
        learning_rate=settings.lr,
        lr_scheduler_type=settings.schedule,
        warmup_steps=settings.warmup_steps,
        save_strategy="steps",
        save_steps=stop or settings.max_steps,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs) -> None:
            if stop is not None and state.global_step >= stop:
                control.should_training_stop = True

    trainer = Trainer(
        model=Quadratic(),
        args=args,
        train_dataset=Points(),
        callbacks=[*schedule_callbacks(settings), record, StopAt()],
    )
    trainer.train(resume_from_checkpoint=resume)
    return record.rates


def test_the_trainer_runs_at_the_restarted_rates_and_keeps_them_when_resumed(tmp_path):
    settings = Training(
        max_steps=24, lr=0.1, warmup_steps=2, schedule="linear", restarts=[{"step": 12, "lr": 0.05}]
    )
    expected = {step: 0.1 * restarted_factor(step, settings) for step in range(24)}
    rates = train(settings, tmp_path / "whole")
    assert rates == pytest.approx(expected)
    assert rates[11] == pytest.approx(0.01) and rates[13] == pytest.approx(0.025) and rates[14] == 0.05
    # killed after step 16, past the restart: the resumed run goes on at the restarted phase's rates
    train(settings, tmp_path / "cut", stop=16)
    resumed = train(settings, tmp_path / "cut", resume=str(tmp_path / "cut" / "checkpoint-16"))
    assert sorted(resumed) == list(range(16, 24))
    assert resumed == pytest.approx({step: expected[step] for step in range(16, 24)})
