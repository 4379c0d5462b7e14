"""Atomic writes: write beside the target under a temporary name, then rename.

A crash therefore never leaves a half-written file or folder that looks whole. What a killed run leaves
behind (``.NAME.tmp-PID-*``, ``.NAME.old-PID``) is swept the next time the same target is written, once
process PID is gone.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import UserError


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it onto ``target``.

    With ``directory=True`` the temporary path is an empty folder and an existing ``target`` folder is
    replaced. On error the temporary path is removed and ``target`` is left as it was.
    """
    target = Path(target)
    if not directory and target.is_dir():
        raise UserError(f"cannot write the file {target}: a folder of that name is in the way")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale(target)
        prefix = f".{target.name}.tmp-{os.getpid()}-"
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, dir=target.parent)
            os.close(fd)
            tmp = Path(name)
    except OSError as err:
        raise UserError(f"cannot write {target}: {_reason(err, target)}") from None
    try:
        yield tmp
        # mkstemp/mkdtemp create private (0600/0700) paths; give the result the usual permissions.
        os.chmod(tmp, (0o777 if directory else 0o666) & ~_umask())
        if directory and target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def _reason(err: OSError, target: Path) -> str:
    """Why ``target`` cannot be written, naming the ancestor that is in the way when there is one."""
    for parent in target.parents:
        if parent.exists():
            return f"{parent} is not a folder" if not parent.is_dir() else err.strerror or str(err)
    return err.strerror or str(err)


def _sweep_stale(target: Path) -> None:
    """Remove temporary and replaced copies of ``target`` left by runs that were killed."""
    for kind in ("tmp", "old"):
        for leftover in target.parent.glob(f".{glob.escape(target.name)}.{kind}-*"):
            pid = leftover.name.rpartition(f".{kind}-")[2].split("-")[0]
            if pid.isdigit() and _alive(int(pid)):
                continue
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's live process
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(target: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(target: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_text(text)
