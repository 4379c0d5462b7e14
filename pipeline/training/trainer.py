"""Training with the Hugging Face Trainer, for every task: resumable, DDP-ready, deterministic.

The Trainer brings the parts worth not re-writing: the inverse-square-root schedule with warm-up, label
smoothing, gradient clipping, DDP under ``torchrun`` (gloo on CPU), progress bars and checkpointing.
What this module adds is the resume guard: a run folder remembers the fingerprint of what it trains
(params + data + parent), and a re-run resumes from its last checkpoint only when the fingerprint matches,
so a stage killed mid-way finishes where it stopped, and a stage whose params changed starts afresh.

A checkpoint is resumed from only when its files are the ones this run saved: their sha256 are recorded
once the Trainer has written them (:class:`RecordCheckpointFiles`) and checked before resuming
(:func:`verify_checkpoint`). The Trainer loads optimizer, scheduler and RNG states with ``torch.load(...,
weights_only=True)``, which refuses a pickle; the record makes a damaged or replaced file a one-line error
naming it, with the command that clears the run folder, rather than a traceback from deep in the Trainer
at every re-run.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from pickle import UnpicklingError  # torch.load(weights_only=True) refuses a pickle with it
from typing import Any

import torch
from datasets import DatasetDict
from safetensors import SafetensorError
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from pipeline.atomic import write_json
from pipeline.corpus_card import Task
from pipeline.errors import UserError, one_line, writing
from pipeline.fingerprint import file_sha256
from pipeline.finite import require_finite
from pipeline.params.training import Distillation, Training
from pipeline.students.distill import DistillationTrainer
from pipeline.training.schedule import schedule_callbacks

RUN_FINGERPRINT = "run_fingerprint.json"
# in each checkpoint folder, written last: the sha256 of every other file in it
CHECKPOINT_FILES = "checkpoint_files.json"
# the share of an mlm block's tokens an evaluation predicts (BERT's and RoBERTa's); training chooses
# ``train.mask_fraction`` of them
MASKED_FRACTION = 0.15

_WORKER_SETTLE_SECONDS = 0.2
"""How long a rank releases the GIL after its last barrier, so that gloo's worker thread can finish first
(:func:`leave_process_group`)."""


def clear_hint(run_dir: str | os.PathLike) -> str:
    """What ends a run-folder error: the command that clears the folder, so the stage trains afresh."""
    return f"to train this stage afresh, clear its run folder: rm -rf {shlex.quote(str(run_dir))}"


def read_run_fingerprint(run_dir: Path) -> str | None:
    """The fingerprint ``run_dir`` was made for, None when there is no run folder yet.

    Raises :class:`UserError` when ``run_dir`` holds something this module did not write: wiping it as
    another run's folder could delete a user's files (``run_dir: .``), and resuming from it would load them.
    """
    marker = run_dir / RUN_FINGERPRINT
    # a run killed before its marker was renamed into place leaves only the marker's temporary file
    leftover = f".{RUN_FINGERPRINT}.tmp-"
    if not run_dir.exists() or (
        run_dir.is_dir()
        and not marker.exists()
        and all(entry.name.startswith(leftover) for entry in run_dir.iterdir())
    ):
        return None
    if not run_dir.is_dir() or not marker.is_file():
        what = "a folder" if run_dir.is_dir() else "not a folder"
        raise UserError(
            f"run_dir {run_dir}: {what} without a {RUN_FINGERPRINT}, so not a run folder of this pipeline "
            f"(left as it is); choose another run_dir, or remove it: rm -rf {shlex.quote(str(run_dir))}"
        )
    return read_json_field(marker, "fingerprint", str, run_dir)


_JSON_NAMES = {str: "string", dict: "object"}


def read_json_field(path: Path, key: str, kind: type, run_dir: Path) -> Any:
    """``path``'s JSON object's ``key``, of type ``kind``; else :class:`UserError` naming the file."""
    try:
        content = json.loads(path.read_bytes())
    except ValueError as err:  # not JSON, or not in a Unicode encoding
        raise UserError(f"{path}: not JSON ({one_line(str(err), 80)}); {clear_hint(run_dir)}") from None
    value = content.get(key) if isinstance(content, dict) else None
    if not isinstance(value, kind):
        raise UserError(
            f'{path}: not what this pipeline writes (a JSON object whose "{key}" is a {_JSON_NAMES[kind]}); '
            f"{clear_hint(run_dir)}"
        )
    return value


def prepare_run_folder(run_dir: str | os.PathLike, fingerprint: str, *, is_main: bool) -> str | None:
    """Return the checkpoint to resume from, wiping ``run_dir`` first if it belongs to another run."""
    run_dir = Path(run_dir)
    previous = read_run_fingerprint(run_dir)
    barrier()  # every rank has read the marker before the main one may wipe it, so all take one branch
    if previous != fingerprint:
        if is_main:
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            write_json(run_dir / RUN_FINGERPRINT, {"fingerprint": fingerprint})
        barrier()
        return None
    return last_complete_checkpoint(run_dir)


def last_complete_checkpoint(run_dir: Path) -> str | None:
    """The newest ``checkpoint-N`` folder whose saving finished, checked by :func:`verify_checkpoint`.

    Its :data:`CHECKPOINT_FILES` is written once every other file is, so a run killed while saving leaves
    a newer folder without one; that folder is skipped (the resumed run writes it again when it reaches
    that step)."""
    found = []
    for folder in run_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        step = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        if folder.is_dir() and step.isdigit():
            found.append((int(step), folder))
    for _, folder in sorted(found, reverse=True):
        if not (folder / CHECKPOINT_FILES).is_file():
            print(f"skipping {folder}: interrupted while saving", flush=True)
            continue
        verify_checkpoint(folder, run_dir)
        return str(folder)
    return None


def checkpoint_files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` but the record, by path relative to it, with its sha256.

    Raises :class:`UserError` for an entry that is not a plain file or folder (a link could point the
    Trainer at any file)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise UserError(
                f"{path}: not a plain file, so not saved by this run; {clear_hint(folder.parent)}"
            )
        name = path.relative_to(folder).as_posix()
        if path.is_file() and name != CHECKPOINT_FILES:
            files[name] = file_sha256(path)
    return files


def record_checkpoint_files(folder: Path) -> None:
    """Write ``folder``'s :data:`CHECKPOINT_FILES`; the Trainer's pickled arguments, which nothing reads,
    are deleted first (no pickle is kept)."""
    (folder / TRAINING_ARGS_NAME).unlink(missing_ok=True)
    write_json(folder / CHECKPOINT_FILES, {"files": checkpoint_files(folder)})


def verify_checkpoint(folder: Path, run_dir: Path) -> None:
    """Raise :class:`UserError`, naming the file, unless ``folder`` holds exactly the files its record
    lists, with their sha256."""
    record = folder / CHECKPOINT_FILES
    if folder.is_symlink():
        raise UserError(f"{folder}: a link, not a checkpoint saved by this run; {clear_hint(run_dir)}")
    expected = read_json_field(record, "files", dict, run_dir)
    found = checkpoint_files(folder)
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            problem = "missing: the checkpoint was saved with it"
        elif name not in expected:
            problem = "was not saved with the checkpoint (added since)"
        elif found[name] != expected[name]:
            problem = "changed since the checkpoint was saved (damaged or replaced)"
        else:
            continue
        raise UserError(f"{folder / name}: {problem}; {clear_hint(run_dir)}")


class RecordCheckpointFiles(TrainerCallback):
    """Record each checkpoint's files once the Trainer has saved it (:func:`record_checkpoint_files`),
    then delete the older checkpoints: the newest recorded one is kept until the next is recorded, so a
    run killed at any moment leaves one to resume from."""

    def on_save(self, args, state, control, **kwargs) -> None:
        barrier()  # every rank has written its RNG state
        if state.is_world_process_zero:
            run_dir = Path(args.output_dir)
            folder = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            record_checkpoint_files(folder)
            for older in run_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
                if older != folder and older.is_dir() and not older.is_symlink():
                    shutil.rmtree(older)


class FirstStep(TrainerCallback):
    """Notes that training has begun its first step: by then the Trainer has loaded all it resumes from."""

    began = False

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.began = True


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
        save_total_limit=None,  # RecordCheckpointFiles deletes a checkpoint once a newer one is recorded
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


def right_padded(features: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """(B, n) ``input_ids`` and ``labels`` of examples of up to n tokens, padded after their end with
    ``pad_id`` and −100. No attention mask: under causal attention no real position sees the padding after
    it, and padding is never scored."""
    width = max(len(feature["input_ids"]) for feature in features)
    ids = torch.full((len(features), width), pad_id, dtype=torch.long)
    labels = torch.full((len(features), width), -100, dtype=torch.long)
    for row, feature in enumerate(features):
        length = len(feature["input_ids"])
        ids[row, :length] = torch.as_tensor(feature["input_ids"])
        labels[row, :length] = torch.as_tensor(feature["labels"])
    return {"input_ids": ids, "labels": labels}


def batching(
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    model: PreTrainedModel,
    mask_fraction: float = MASKED_FRACTION,
) -> tuple[list[str], Any]:
    """The dataset columns a task trains on and the collator that batches them.

    translation: source ids and labels, padded (labels by −100). lm: blocks, labels = inputs (the model
    shifts them). mlm: blocks with ``mask_fraction`` of the tokens chosen (80 % of those become ``<mask>``,
    10 % a random token, 10 % stay), labels there only. mqar: examples and their own labels (already in
    the convention the model shifts), right-padded to the batch's longest (:func:`right_padded`).
    """
    if task == "translation":
        return ["input_ids", "labels"], DataCollatorForSeq2Seq(
            tokenizer, model=model, label_pad_token_id=-100
        )
    if task == "mqar":
        return ["input_ids", "labels"], partial(right_padded, pad_id=tokenizer.pad_token_id)
    return ["input_ids"], DataCollatorForLanguageModeling(
        tokenizer, mlm=task == "mlm", mlm_probability=mask_fraction
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
    last: bool = True,
) -> PreTrainedModel:
    """Train ``model`` on ``data['train']`` (validated on ``data['valid']``), resuming when possible;
    ``task`` chooses the columns and the collator (:func:`batching`).

    With a ``teacher`` the loss also distils the teacher's token distributions into ``model``
    (:class:`~pipeline.students.distill.DistillationTrainer`, weighted by ``distillation``). An
    ``optimizer`` replaces the Trainer's AdamW (its parameter groups keep their own learning rates and
    weight decay; the schedule scales them all). Under ``torchrun`` the last training of a process
    (``last``) ends its process group (:func:`leave_process_group`); a stage that trains again in the same
    process (one run per seed) passes ``last=False`` until its final one, since a new Trainer cannot bring a
    destroyed group back and its ranks would wait on each other for ever.
    """
    args = training_arguments(run_dir, settings)
    _ = args.device  # sets up the process group under torchrun, so the run folder check can synchronise
    one_gpu_per_process(args)
    resume_from = prepare_run_folder(run_dir, fingerprint, is_main=is_main_process())
    if resume_from is not None and is_main_process():
        print(f"resuming from {resume_from}", file=sys.stderr)
    columns, collator = batching(task, tokenizer, model, settings.mask_fraction)
    started = FirstStep()
    options = dict(
        model=model,
        args=args,
        train_dataset=data["train"].select_columns(columns),
        eval_dataset=data["valid"].select_columns(columns),
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=[FiniteLoss(), RecordCheckpointFiles(), started, *schedule_callbacks(settings), *callbacks],
        optimizers=(optimizer, None),
    )
    if teacher is None:
        trainer = Seq2SeqTrainer(**options)
    else:
        trainer = DistillationTrainer(**options, teacher=teacher, distillation=distillation or Distillation())
    try:
        with writing(f"checkpoints to {run_dir}"):
            trainer.train(resume_from_checkpoint=resume_from)
    except (UnpicklingError, SafetensorError) as err:
        # the recorded sha256 matched, so the record itself was rewritten; weights_only=True refused a pickle
        if resume_from is None or started.began:
            raise
        first = one_line(str(err).split(". ")[0], 120)  # torch's message goes on for paragraphs
        raise UserError(f"{resume_from}: cannot be resumed from ({first}); {clear_hint(run_dir)}") from None
    if last:
        leave_process_group()
    return trainer.model
