"""Failures a run recovers from: the machine failing a write, Ctrl-C, and a damaged run folder.

A failure of the machine (disk full, file too large) exits with status 1 and Ctrl-C with 130, each with one
stderr line and no traceback. A run folder that is not what its run saved is refused before anything in
it is loaded: exit status 2, one line naming the file and the command that clears the folder.

The stage is ``teacher`` on the tiny corpus and random α-entmax Marian of the params-error tests, two
training steps with a checkpoint after each; one run, stopped by Ctrl-C right after its first checkpoint
was recorded, leaves the run folder every corrupt case damages a copy of.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import re
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers.modeling_utils
from safetensors import SafetensorError
from safetensors.torch import save_file
from transformers.trainer_callback import TrainerState

from pipeline.errors import MAX_MESSAGE, UserError, environment_failure, exits_cleanly, writing
from pipeline.fingerprint import file_sha256
from pipeline.training.trainer import CHECKPOINT_FILES, RUN_FINGERPRINT, RecordCheckpointFiles
from tests.stage_runner import run_module
from tests.test_params_errors import corpus, params_file, teacher, texts  # noqa: F401  (module fixtures)

RUN_DIR = "artifacts/runs/teacher"
OUT = "artifacts/models/teacher"
CLEAR = f"rm -rf {RUN_DIR}"
CHECKPOINT = f"{RUN_DIR}/checkpoint-1"
PROGRESS_BAR = re.compile(r"\s*\d+%\|")  # a state of tqdm's bar, as the Trainer draws it


@pytest.fixture(scope="module")
def changes(corpus: Path, teacher: Path) -> dict[str, Any]:  # noqa: F811
    """The teacher stage on the tiny corpus and model: 2 steps, a checkpoint after each, a short eval;
    outputs at the profile's relative paths (the run's fingerprint holds them)."""
    return {
        "teacher.init": str(teacher),
        "teacher.data": str(corpus),
        "teacher.train.max_steps": 2,
        "teacher.train.save_steps": 1,
        "teacher.train.eval_steps": 2,
        "teacher.train.logging_steps": 1,
        "teacher.eval.max_new_tokens": 8,
        "teacher.eval.test_examples": 4,
        "teacher.eval.sparsity_examples": 4,
    }


def run_teacher(project: Path) -> subprocess.CompletedProcess:
    return run_module("stages.teacher", "--params", str(project / "params.yaml"), cwd=project)


def one_line(result: subprocess.CompletedProcess, status: int) -> str:
    """The one stderr line of a run that exited with ``status`` and printed no traceback: the last line,
    after nothing but the Trainer's progress bar (closed first, so not drawn again after it)."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == status, result.stderr[-3000:]
    *before, last = result.stderr.rstrip("\n").splitlines()
    assert all(PROGRESS_BAR.match(line) or not line.strip() for line in before), result.stderr[-3000:]
    return last


@pytest.fixture(scope="module")
def stopped(changes: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose teacher run was stopped by Ctrl-C once its first checkpoint was recorded."""
    project = tmp_path_factory.mktemp("stopped")
    params_file(project, changes)
    record = RecordCheckpointFiles.on_save

    def record_then_interrupt(self, args, state, control, **kwargs):
        record(self, args, state, control, **kwargs)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RecordCheckpointFiles, "on_save", record_then_interrupt)
        result = run_teacher(project)
    assert one_line(result, 130) == "interrupted"
    assert (project / CHECKPOINT / CHECKPOINT_FILES).is_file() and not (project / OUT).exists()
    return project


@pytest.fixture
def project(stopped: Path, tmp_path: Path) -> Path:
    """A copy of the stopped project, to damage."""
    copy = tmp_path / "project"
    shutil.copytree(stopped, copy)
    return copy


# ----------------------------------------------------------------------------------------------------------
# the machine fails a write


def test_disk_full_while_saving_a_training_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    changes: dict[str, Any],
) -> None:
    """safetensors reports a full disk with an error of its own that only quotes the OS's message."""

    def disk_full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", disk_full)
    params_file(tmp_path, changes)
    line = one_line(run_teacher(tmp_path), 1)
    assert (
        line
        == f"error: writing checkpoints to {RUN_DIR}: no space left on device (free some space and re-run)"
    )
    assert not (tmp_path / OUT).exists()


def test_file_too_large_while_saving_the_trainer_state(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    changes: dict[str, Any],
) -> None:
    def too_large(self, json_path: str) -> None:
        raise OSError(errno.EFBIG, "File too large", json_path)

    monkeypatch.setattr(TrainerState, "save_to_json", too_large)
    params_file(tmp_path, changes)
    line = one_line(run_teacher(tmp_path), 1)
    assert line.startswith(f"error: writing checkpoints to {RUN_DIR}: file too large for the file system")
    assert "ulimit -f" in line and not (tmp_path / OUT).exists()


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Writes past ``size`` bytes fail with EFBIG in this process (``ulimit -f``), as on a file system
    whose files cannot grow that large."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def write_json(path: Path) -> None:
    with open(path, "w") as handle:
        json.dump({"values": list(range(100_000))}, handle)


WRITERS: dict[str, Callable[[Path], None]] = {
    "safetensors": lambda path: save_file({"weight": torch.zeros(100_000)}, path),
    "torch.save": lambda path: torch.save({"weight": torch.zeros(100_000)}, path),
    "json": write_json,
}


@pytest.mark.parametrize("writer", WRITERS)
def test_what_each_writer_raises_when_the_file_cannot_grow(tmp_path: Path, writer: str) -> None:
    """The real errors, not stand-ins: safetensors quotes the OS's error number, torch.save gives none."""
    target = tmp_path / "out"
    with file_size_limit(4096), pytest.raises(Exception) as raised, writing(f"the file {target}"):
        WRITERS[writer](target)
    line = environment_failure(raised.value)
    reason = "a write failed" if writer == "torch.save" else "file too large for the file system"
    assert line is not None and line.startswith(f"writing the file {target}: {reason}"), line


def test_without_a_name_the_line_names_the_file_the_os_named() -> None:
    """A failed write names no file (the one above gives the bare reason); a failed open does."""
    failure = OSError(errno.EROFS, "Read-only file system", "artifacts/metrics/teacher.json")
    assert environment_failure(failure) == (
        "artifacts/metrics/teacher.json: read-only file system (make it writable or point the output "
        "elsewhere, and re-run)"
    )


# ----------------------------------------------------------------------------------------------------------
# exits_cleanly: status, one bounded line, what passes through


def run_main(main: Callable[[], object], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """(exit status, stderr) of a main wrapped by exits_cleanly."""
    with pytest.raises(SystemExit) as exit_info:
        exits_cleanly(main)()
    return exit_info.value.code, capsys.readouterr().err


def test_ctrl_c_exits_130_with_one_line(capsys: pytest.CaptureFixture) -> None:
    def main() -> None:
        raise KeyboardInterrupt

    assert run_main(main, capsys) == (130, "interrupted\n")


def test_a_huge_message_is_one_bounded_line(capsys: pytest.CaptureFixture) -> None:
    """A value quoted in a message may be megabytes long and hold line breaks; the line keeps its head and
    the tail, where what is allowed is said."""
    value = "x\n" * 5_000_000

    def main() -> None:
        raise UserError(f"prepare.max_length = {value!r}: not an integer; allowed: a whole number")

    status, err = run_main(main, capsys)
    assert status == 2 and err.count("\n") == 1
    assert len(err) < MAX_MESSAGE + 20
    assert err.startswith("error: prepare.max_length = ") and err.rstrip().endswith("allowed: a whole number")
    assert " … " in err


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (MemoryError(), "error: out of memory (RAM) (free some memory"),
        (
            torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
                "which 1.2 GiB is free. Including non-PyTorch memory, this process has 78 GiB in use.\n"
                "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF"
            ),
            "error: out of GPU memory: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 79.19 GiB of which 1.2 GiB is free (free some memory",
        ),
        (OSError(errno.EMFILE, "Too many open files"), "error: too many open files (raise `ulimit -n`"),
    ],
)
def test_the_machine_running_out_exits_1(
    failure: Exception, expected: str, capsys: pytest.CaptureFixture
) -> None:
    def main() -> None:
        raise failure

    status, err = run_main(main, capsys)
    assert status == 1 and err.startswith(expected) and err.count("\n") == 1, err


def test_a_writer_naming_its_target_keeps_the_machine_s_status(capsys: pytest.CaptureFixture) -> None:
    """A writer may turn a full disk into a line of its own that names its target: still exit status 1."""

    def main() -> None:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise UserError("cannot write out.json: No space left on device; nothing was replaced") from None

    status, err = run_main(main, capsys)
    assert (status, err) == (
        1,
        "error: cannot write out.json: No space left on device; nothing was replaced\n",
    )


def test_usage_errors_and_bugs_pass_through(capsys: pytest.CaptureFixture) -> None:
    """argparse's usage error keeps its status 2 and its own lines; a bug keeps its traceback."""

    def usage() -> None:
        argparse.ArgumentParser(prog="stage").parse_args(["--unknown"])

    status, err = run_main(usage, capsys)
    assert status == 2 and err.startswith("usage: stage") and "unrecognized arguments: --unknown" in err

    def bug() -> None:
        raise OSError(errno.ENOENT, "No such file or directory", "params.yaml")  # not the machine's fault

    with pytest.raises(FileNotFoundError):
        exits_cleanly(bug)()


# ----------------------------------------------------------------------------------------------------------
# a run folder that is not what its run saved


def test_an_intact_run_folder_resumes(project: Path) -> None:
    result = run_teacher(project)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {CHECKPOINT}" in result.stderr
    assert (project / OUT / "model.safetensors").is_file() and not (project / RUN_DIR).exists()


class Payload:
    """Unpickling calls ``open(marker, "w")``: the marker file exists iff something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def plant_pickle(project: Path) -> Path:
    """An optimizer state saved with pickle in place of the checkpoint's; the marker its loading writes."""
    marker = project / "unpickled"
    torch.save({"state": {0: Payload(marker)}, "param_groups": []}, project / CHECKPOINT / "optimizer.pt")
    return marker


def forge_record(project: Path) -> None:
    """Rewrite the checkpoint's record to match its files as they now are."""
    folder = project / CHECKPOINT
    record = folder / CHECKPOINT_FILES
    files = {name: file_sha256(folder / name) for name in json.loads(record.read_text())["files"]}
    record.write_text(json.dumps({"files": files}))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


DAMAGES: dict[str, tuple[Callable[[Path], object], str]] = {
    "fingerprint not JSON": (
        lambda p: (p / RUN_DIR / RUN_FINGERPRINT).write_text('{"fingerprint": '),
        f"{RUN_DIR}/{RUN_FINGERPRINT}: not JSON",
    ),
    "fingerprint without its key": (
        lambda p: (p / RUN_DIR / RUN_FINGERPRINT).write_text("[1, 2]"),
        f"{RUN_DIR}/{RUN_FINGERPRINT}: not what this pipeline writes "
        '(a JSON object whose "fingerprint" is a string)',
    ),
    "truncated weights": (
        lambda p: truncate(p / CHECKPOINT / "model.safetensors"),
        f"{CHECKPOINT}/model.safetensors: changed since the checkpoint was saved",
    ),
    "pickled optimizer state": (
        plant_pickle,
        f"{CHECKPOINT}/optimizer.pt: changed since the checkpoint was saved",
    ),
    "trainer state not JSON": (
        lambda p: (p / CHECKPOINT / "trainer_state.json").write_text("{"),
        f"{CHECKPOINT}/trainer_state.json: changed since the checkpoint was saved",
    ),
    "a file added": (
        lambda p: (p / CHECKPOINT / "scaler.pt").write_bytes(b"\0"),
        f"{CHECKPOINT}/scaler.pt: was not saved with the checkpoint",
    ),
    "a file removed": (
        lambda p: (p / CHECKPOINT / "scheduler.pt").unlink(),
        f"{CHECKPOINT}/scheduler.pt: missing",
    ),
    "record not JSON": (
        lambda p: (p / CHECKPOINT / CHECKPOINT_FILES).write_text("{"),
        f"{CHECKPOINT}/{CHECKPOINT_FILES}: not JSON",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_run_folder_is_refused_with_the_command_that_clears_it(project: Path, damage: str) -> None:
    harm, expected = DAMAGES[damage]
    harm(project)
    line = one_line(run_teacher(project), 2)
    assert line.startswith(f"error: {expected}"), line
    assert line.endswith(f"to train this stage afresh, clear its run folder: {CLEAR}"), line
    assert not (project / "unpickled").exists()  # nothing was unpickled
    assert (project / RUN_DIR).is_dir() and not (project / OUT).exists()  # left for the user to look at


def test_a_pickle_behind_a_forged_record_is_refused_by_torch_and_never_unpickled(project: Path) -> None:
    """With the record rewritten to match, the Trainer loads the checkpoint; torch.load(weights_only=True)
    refuses the pickle, and the refusal is the same kind of line."""
    plant_pickle(project)
    forge_record(project)
    result = run_teacher(project)
    assert "Traceback" not in result.stderr and result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [result.stderr.rstrip("\n").splitlines()[-1]], result.stderr[-3000:]
    assert errors[0] == (
        f"error: {CHECKPOINT}: cannot be resumed from (Weights only load failed); "
        f"to train this stage afresh, clear its run folder: {CLEAR}"
    )
    assert not (project / "unpickled").exists() and not (project / OUT).exists()


def test_a_folder_of_other_files_is_not_wiped_as_a_run_folder(
    tmp_path: Path, changes: dict[str, Any]
) -> None:
    params_file(tmp_path, changes)
    notes = tmp_path / RUN_DIR / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("mine")
    line = one_line(run_teacher(tmp_path), 2)
    assert line.startswith(f"error: run_dir {RUN_DIR}: a folder without a {RUN_FINGERPRINT}"), line
    assert line.endswith(CLEAR) and notes.read_text() == "mine"
