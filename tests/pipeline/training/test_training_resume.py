"""Choosing the checkpoint a re-run resumes from (``pipeline.training.trainer``)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import Seq2SeqTrainingArguments

from pipeline.training.trainer import (
    RUN_FINGERPRINT,
    last_complete_checkpoint,
    one_gpu_per_process,
    prepare_run_folder,
    record_checkpoint_files,
)


def checkpoint(run_dir: Path, step: int, state: str | None, *, recorded: bool = True) -> Path:
    """A checkpoint folder with weights, the Trainer's pickled arguments and, unless ``state`` is None,
    that trainer_state.json text; ``recorded``: its files' sha256 written, as once saving finished."""
    folder = run_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "training_args.bin").write_bytes(b"a pickle")
    if state is not None:
        (folder / "trainer_state.json").write_text(state)
    if recorded:
        record_checkpoint_files(folder)
    return folder


def test_newest_complete_checkpoint_wins_over_interrupted_ones(tmp_path, capsys):
    checkpoint(tmp_path, 2, json.dumps({"global_step": 2}))
    complete = checkpoint(tmp_path, 10, json.dumps({"global_step": 10}))  # 10 > 9: numeric, not text order
    checkpoint(tmp_path, 9, json.dumps({"global_step": 9}))
    checkpoint(tmp_path, 12, None, recorded=False)  # killed before its state was written
    checkpoint(tmp_path, 14, json.dumps({"global_step": 14}), recorded=False)  # killed before its record
    (tmp_path / "checkpoint-final").mkdir()  # not a step folder
    assert last_complete_checkpoint(tmp_path) == str(complete)
    printed = capsys.readouterr().out
    assert "checkpoint-14: interrupted while saving" in printed and "checkpoint-12" in printed
    assert not (complete / "training_args.bin").exists()  # a pickle nothing reads: not kept


def test_no_complete_checkpoint_means_a_fresh_start(tmp_path):
    checkpoint(tmp_path, 4, "{}", recorded=False)
    assert last_complete_checkpoint(tmp_path) is None


def test_run_folder_of_another_run_is_wiped(tmp_path):
    run_dir = tmp_path / "run"
    assert prepare_run_folder(run_dir, "a", is_main=True) is None
    done = checkpoint(run_dir, 3, "{}")
    assert prepare_run_folder(run_dir, "a", is_main=True) == str(done)
    assert prepare_run_folder(run_dir, "b", is_main=True) is None  # other params/data: start afresh
    assert not done.exists()
    assert json.loads((run_dir / RUN_FINGERPRINT).read_text()) == {"fingerprint": "b"}


def test_several_gpus_in_one_process_train_on_one(tmp_path, capsys):
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert args.n_gpu == 0
    one_gpu_per_process(args)  # none: nothing to say or change
    assert args.n_gpu == 0 and capsys.readouterr().err == ""
    args._n_gpu = 4  # what the Trainer's device set-up finds on a machine with four GPUs and no torchrun
    one_gpu_per_process(args)
    assert args.n_gpu == 1  # so the Trainer does not wrap the model in DataParallel
    assert "4 GPUs are visible to one process: training on one; `torchrun --nproc_per_node 4" in (
        capsys.readouterr().err
    )
