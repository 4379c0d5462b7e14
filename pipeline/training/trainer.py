"""Training with the Hugging Face Trainer, for every task: resumable, DDP-ready, deterministic.

The Trainer brings the parts worth not re-writing: the inverse-square-root schedule with warm-up, label
smoothing, gradient clipping, DDP under ``torchrun`` (gloo on CPU), progress bars and checkpointing.
What this module adds is the resume guard: a run folder remembers the fingerprint of what it trains
(params + data + parent), and a re-run resumes from its last checkpoint only when the fingerprint matches,
so a stage killed mid-way finishes where it stopped, and a stage whose params changed starts afresh.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import DatasetDict
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from pipeline.corpus_card import Task
from pipeline.finite import require_finite
from pipeline.params import Distillation, Training
from pipeline.students.distill import DistillationTrainer

RUN_FINGERPRINT = "run_fingerprint.json"
# the share of an mlm block's tokens chosen for prediction (BERT's and RoBERTa's)
MASKED_FRACTION = 0.15

_WORKER_SETTLE_SECONDS = 0.2
"""How long a rank releases the GIL after its last barrier, so that gloo's worker thread can finish first
(:func:`leave_process_group`)."""


def prepare_run_folder(run_dir: str | os.PathLike, fingerprint: str, *, is_main: bool) -> str | None:
    """Return the checkpoint to resume from, wiping ``run_dir`` first if it belongs to another run."""
    run_dir = Path(run_dir)
    marker = run_dir / RUN_FINGERPRINT
    previous = json.loads(marker.read_text())["fingerprint"] if marker.is_file() else None
    barrier()  # every rank has read the marker before the main one may wipe it, so all take one branch
    if previous != fingerprint:
        if is_main:
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            marker.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")
        barrier()
        return None
    return last_complete_checkpoint(run_dir)


def last_complete_checkpoint(run_dir: Path) -> str | None:
    """The newest ``checkpoint-N`` folder the Trainer finished writing, or None.

    The Trainer writes a checkpoint in place (weights, optimizer, scheduler, RNG state) and its
    ``trainer_state.json`` last, so a run killed while saving leaves a newer folder without a readable state;
    that folder is skipped (the resumed run writes it again when it reaches that step)."""
    found = []
    for folder in run_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        step = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        if folder.is_dir() and step.isdigit():
            found.append((int(step), folder))
    for _, folder in sorted(found, reverse=True):
        try:
            json.loads((folder / "trainer_state.json").read_text())
        except (OSError, ValueError):
            print(f"skipping {folder}: interrupted while saving", flush=True)
            continue
        return str(folder)
    return None


def barrier() -> None:
    """Synchronise ranks when running under ``torchrun``; a no-op in a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def leave_process_group() -> None:
    """End the distributed part of a run on every rank once training is over.

    The main rank goes on alone (saving, evaluating) while the others exit. A rank that exits with its
    gloo group still up leaves the group's worker threads to interpreter finalisation, which can abort
    it (SIGABRT, "terminate called without an active exception") and fail the whole ``torchrun``.
    Destroying the group while the interpreter is whole makes that exit clean. A no-op in one process.

    After the barrier, gloo's worker thread frees the finished work and the tensors it held, which takes
    the GIL; the group's destructor joins that thread and runs with the GIL held (here, or when the DDP
    wrapper that also holds the group is freed). Were it to start first, each thread would wait for the
    other for ever. So the rank sleeps a moment, releasing the GIL, before it lets the group go.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        time.sleep(_WORKER_SETTLE_SECONDS)
        torch.distributed.destroy_process_group()


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def one_gpu_per_process(args: Seq2SeqTrainingArguments) -> None:
    """Train on one GPU where several are visible to a process not started by ``torchrun``, telling how to use
    them all. The Trainer would otherwise wrap the model in ``nn.DataParallel``, whose per-GPU replicas are
    shallow copies: SBM's density penalty would read the original heads (never run), the distillation
    loss would come back once per GPU and be counted that many times, and the replicas' threads would
    share each sparsefinder head's predictor state."""
    if args.n_gpu > 1:
        print(
            f"{args.n_gpu} GPUs are visible to one process: training on one; `torchrun --nproc_per_node "
            f"{args.n_gpu} -m stages.<stage>` trains on all of them (DDP)",
            file=sys.stderr,
        )
        args._n_gpu = 1  # what the Trainer reads to choose DataParallel (it sets it so for model parallelism)


def training_arguments(run_dir: str | os.PathLike, settings: Training) -> Seq2SeqTrainingArguments:
    """Map the params' training section onto the Trainer's arguments."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return Seq2SeqTrainingArguments(
        output_dir=str(run_dir),
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.grad_accumulation,
        learning_rate=settings.lr,
        lr_scheduler_type=settings.schedule,
        warmup_steps=settings.warmup_steps,
        label_smoothing_factor=settings.label_smoothing,
        weight_decay=settings.weight_decay,
        max_grad_norm=settings.grad_clip,
        eval_strategy="steps",
        eval_steps=settings.eval_steps,
        save_strategy="steps",
        save_steps=settings.save_steps,
        save_total_limit=1,
        logging_steps=settings.logging_steps,
        seed=settings.seed,
        data_seed=settings.seed,
        train_sampling_strategy="group_by_length",
        report_to="none",
        ddp_backend=("nccl" if torch.cuda.is_available() else "gloo") if distributed else None,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=False,
        # the Trainer would replace a NaN step loss by the running mean; FiniteLoss must see it instead
        logging_nan_inf_filter=False,
    )


class FiniteLoss(TrainerCallback):
    """Stop training with a one-line error at the first logged training or validation loss that is NaN or
    infinite (the logged loss sums every step since the last log, so no bad step slips through)."""

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        for key in ("loss", "eval_loss"):
            if key in (logs or {}):
                require_finite(float(logs[key]), f"training ({key})", state.global_step)


def batching(task: Task, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> tuple[list[str], Any]:
    """The dataset columns a task trains on and the collator that batches them.

    translation: source ids and labels, padded (labels by −100). lm: blocks, labels = inputs (the model
    shifts them). mlm: blocks with 15 % of the tokens chosen (80 % of those become ``<mask>``, 10 % a
    random token, 10 % stay), labels there only.
    """
    if task == "translation":
        return ["input_ids", "labels"], DataCollatorForSeq2Seq(
            tokenizer, model=model, label_pad_token_id=-100
        )
    return ["input_ids"], DataCollatorForLanguageModeling(
        tokenizer, mlm=task == "mlm", mlm_probability=MASKED_FRACTION
    )


def train_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: DatasetDict,
    run_dir: str | os.PathLike,
    settings: Training,
    fingerprint: str,
    *,
    task: Task = "translation",
    teacher: PreTrainedModel | None = None,
    distillation: Distillation | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    optimizer: torch.optim.Optimizer | None = None,
) -> PreTrainedModel:
    """Train ``model`` on ``data['train']`` (validated on ``data['valid']``), resuming when possible;
    ``task`` chooses the columns and the collator (:func:`batching`).

    With a ``teacher`` the loss also distils the teacher's token distributions into ``model``
    (:class:`~pipeline.students.distill.DistillationTrainer`, weighted by ``distillation``). An
    ``optimizer`` replaces the Trainer's AdamW (its parameter groups keep their own learning rates and
    weight decay; the schedule scales them all).
    """
    args = training_arguments(run_dir, settings)
    _ = args.device  # sets up the process group under torchrun, so the run folder check can synchronise
    one_gpu_per_process(args)
    resume_from = prepare_run_folder(run_dir, fingerprint, is_main=is_main_process())
    if resume_from is not None and is_main_process():
        print(f"resuming from {resume_from}", file=sys.stderr)
    columns, collator = batching(task, tokenizer, model)
    options = dict(
        model=model,
        args=args,
        train_dataset=data["train"].select_columns(columns),
        eval_dataset=data["valid"].select_columns(columns),
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[FiniteLoss(), *callbacks],
        optimizers=(optimizer, None),
    )
    if teacher is None:
        trainer = Seq2SeqTrainer(**options)
    else:
        trainer = DistillationTrainer(**options, teacher=teacher, distillation=distillation or Distillation())
    trainer.train(resume_from_checkpoint=resume_from)
    leave_process_group()
    return trainer.model
