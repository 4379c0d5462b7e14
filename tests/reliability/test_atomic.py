"""The atomic writer under stress: concurrent writers, targets that are not files, several outputs as one.

Writers run as processes of their own (``spawn``), all released at once, each writing a two-file folder to
one target many times: every write must succeed and the target must end as one writer's complete folder,
both through ``renameat2``'s exchange and through the portable rename dance. Staged outputs are checked
on their own, in the extract stage, whose second store fails on a full disk, and in a training stage,
whose metrics fail on a full disk after its model was written.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
import safetensors.numpy
import yaml

import pipeline.timings
from pipeline import atomic
from pipeline.atomic import atomic_path, staged_outputs, write_json, write_text
from pipeline.errors import ENVIRONMENT_FAILURES, UserError, environment_failure
from tests.reliability.concurrent_writer import write_folders
from tests.reliability.test_artifacts import checkpoint, micro_params  # noqa: F401  (module fixture)
from tests.reliability.test_recovery import OUT, changes, run_teacher  # noqa: F401  (module fixture)
from tests.stage_runner import run_module
from tests.test_params_errors import corpus, params_file, teacher, texts  # noqa: F401  (module fixtures)

WRITERS, WRITES = 4, 20


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "portable"])
def test_concurrent_writers_all_succeed_and_leave_one_whole_folder(tmp_path: Path, exchange: bool) -> None:
    if exchange and atomic._renameat2 is None:
        pytest.skip("this C library has no renameat2")
    target = tmp_path / "out"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(WRITERS)
    writers = [
        context.Process(target=write_folders, args=(str(target), i, WRITES, exchange, start))
        for i in range(WRITERS)
    ]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=120)
    assert [process.exitcode for process in writers] == [0] * WRITERS  # no write failed
    assert sorted(p.name for p in target.iterdir()) == ["a", "b"]
    assert (target / "a").read_text() == (target / "b").read_text()  # both files of one write
    assert (target / "a").read_text().endswith(f"write {WRITES - 1}")  # some writer's last
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary or retired folder left


def test_two_open_writes_of_one_target_in_one_process_do_not_collide(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with atomic_path(target, directory=True) as first, atomic_path(target, directory=True) as second:
        assert first != second and first.name.startswith(f".out.tmp-{os.getpid()}-")
        (first / "who").write_text("first")
        (second / "who").write_text("second")
    assert (target / "who").read_text() == "first"  # the last to finish wins, whole
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def special_files(folder: Path) -> dict[str, Path]:
    """A FIFO, a listening Unix socket's file and a character device, by kind."""
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    sock = folder / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.close()  # the socket file stays
    return {"a FIFO": fifo, "a socket": sock, "a character device": Path("/dev/null")}


@pytest.mark.parametrize("directory", [False, True], ids=["file", "folder"])
def test_a_device_fifo_or_socket_is_never_replaced(tmp_path: Path, directory: bool) -> None:
    for kind, path in special_files(tmp_path).items():
        before = os.lstat(path)
        with pytest.raises(UserError) as refused, atomic_path(path, directory=directory):
            pytest.fail("the block must not run")
        allowed = "allowed: a regular file, a folder or a path that does not exist"
        assert str(refused.value) == f"cannot write {path}: it is {kind}; {allowed}"
        after = os.lstat(path)
        assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "sock"]


def test_a_symlink_is_replaced_as_a_link_never_written_through(tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("kept")
    kept_folder = tmp_path / "kept"
    kept_folder.mkdir()
    (kept_folder / "inside").write_text("kept")
    (tmp_path / "link.txt").symlink_to(kept)
    (tmp_path / "link").symlink_to(kept_folder)
    (tmp_path / "to-device").symlink_to("/dev/null")
    write_text(tmp_path / "link.txt", "new")
    write_text(tmp_path / "to-device", "new")
    with atomic_path(tmp_path / "link", directory=True) as tmp:
        (tmp / "new").write_text("new")
    for name in ("link.txt", "to-device", "link"):
        assert not (tmp_path / name).is_symlink()
    assert (tmp_path / "link.txt").read_text() == "new" and (tmp_path / "to-device").read_text() == "new"
    assert [p.name for p in (tmp_path / "link").iterdir()] == ["new"]
    assert kept.read_text() == "kept" and [p.name for p in kept_folder.iterdir()] == ["inside"]


def previous_outputs(tmp_path: Path) -> tuple[Path, Path]:
    folder, metrics = tmp_path / "store", tmp_path / "metrics.json"
    with atomic_path(folder, directory=True) as tmp:
        (tmp / "shard").write_text("previous")
    write_json(metrics, {"run": "previous"})
    return folder, metrics


def assert_previous(tmp_path: Path, folder: Path, metrics: Path) -> None:
    assert (folder / "shard").read_text() == "previous" and json.loads(metrics.read_text()) == {
        "run": "previous"
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "store"]  # nothing half-written


def test_staged_outputs_are_swapped_in_together(tmp_path: Path) -> None:
    folder, metrics = previous_outputs(tmp_path)
    with staged_outputs(folder, metrics) as staged:
        with atomic_path(folder, directory=True) as tmp:
            (tmp / "shard").write_text("new")
        assert (folder / "shard").read_text() == "previous"  # held back until the block ends
        assert (staged.path(folder) / "shard").read_text() == "new"  # but readable where it waits
        write_json(metrics, {"run": "new"})
        assert json.loads(metrics.read_text()) == {"run": "previous"}
    assert (folder / "shard").read_text() == "new" and json.loads(metrics.read_text()) == {"run": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "store"]


def test_a_failure_after_the_first_staged_output_keeps_every_previous_one(tmp_path: Path) -> None:
    folder, metrics = previous_outputs(tmp_path)
    with pytest.raises(RuntimeError, match="stage failed"), staged_outputs(folder, metrics):
        with atomic_path(folder, directory=True) as tmp:
            (tmp / "shard").write_text("new")
        raise RuntimeError("stage failed")
    assert_previous(tmp_path, folder, metrics)


def test_a_full_disk_names_the_output_and_keeps_every_previous_one(tmp_path: Path) -> None:
    folder, metrics = previous_outputs(tmp_path)
    with pytest.raises(OSError) as full, staged_outputs(folder, metrics):
        with atomic_path(folder, directory=True) as tmp:
            (tmp / "shard").write_text("new")
        with atomic_path(metrics) as tmp, atomic_path(tmp.with_name("inner")):  # named by the outermost
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert environment_failure(full.value) == f"writing {metrics}: {ENVIRONMENT_FAILURES[errno.ENOSPC]}"
    assert_previous(tmp_path, folder, metrics)


def test_a_full_disk_on_the_second_store_leaves_the_first_and_the_metrics_as_they_were(
    corpus: Path,  # noqa: F811
    checkpoint: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """extract writes two stores and its metrics; a full disk while the second store is written keeps the
    previous run's first store and metrics (not the new first store beside stale metrics)."""
    params = micro_params(tmp_path, corpus, checkpoint)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    first = run_module("stages.extract", "--params", "params.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    graphs, metrics = tmp_path / "artifacts/graphs", tmp_path / "artifacts/metrics/extract.json"
    (graphs / "train" / "previous").write_text("the previous run's store")  # to know it again
    metrics.write_text('{"run": "previous"}\n')
    save = safetensors.numpy.save_file

    def disk_full_in_the_test_store(tensors, path, metadata=None):
        if "/.test.tmp-" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return save(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full_in_the_test_store)
    second = run_module("stages.extract", "--params", "params.yaml", cwd=tmp_path)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]  # the machine's
    assert second.stderr.strip().splitlines()[-1] == (
        f"error: writing {graphs / 'test'}: {ENVIRONMENT_FAILURES[errno.ENOSPC]}"
    )
    assert (graphs / "train" / "previous").is_file() and metrics.read_text() == '{"run": "previous"}\n'
    assert sorted(p.name for p in graphs.iterdir()) == ["test", "train"]  # no temporary store left


def test_a_full_disk_on_the_metrics_keeps_the_previous_model_and_metrics(
    changes: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A training stage (teacher, two steps) writes its model, measures it, then writes its metrics; a full
    disk on the metrics keeps the previous model and metrics, never the new model beside stale metrics."""
    model, metrics = tmp_path / OUT, tmp_path / "artifacts/metrics/teacher.json"
    timings = metrics.with_name("teacher.timings.json")
    model.mkdir(parents=True)
    (model / "previous").write_text("the previous run's model")
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"run": "previous"}\n')
    timings.write_text('{"run": "previous"}\n')
    write = pipeline.timings.write_json

    def disk_full_on_the_metrics(target: Path, obj: Any) -> None:
        if Path(target).name != metrics.name:
            return write(target, obj)
        with atomic_path(target):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pipeline.timings, "write_json", disk_full_on_the_metrics)
    params_file(tmp_path, changes)
    result = run_teacher(tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]  # the machine's
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: writing {Path('artifacts/metrics/teacher.json')}: {ENVIRONMENT_FAILURES[errno.ENOSPC]}"
    )
    assert [p.name for p in model.iterdir()] == ["previous"]
    assert metrics.read_text() == timings.read_text() == '{"run": "previous"}\n'
    assert sorted(p.name for p in model.parent.iterdir()) == ["teacher"]  # no temporary model left
    assert sorted(p.name for p in metrics.parent.iterdir()) == ["teacher.json", "teacher.timings.json"]
