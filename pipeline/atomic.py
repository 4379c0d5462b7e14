"""Atomic writes: write beside the target under a temporary name, then rename.

A crash therefore never leaves a half-written file or folder that looks whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it onto ``target``.

    With ``directory=True`` the temporary path is an empty folder and an existing ``target`` folder is
    replaced. On error the temporary path is removed and ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=target.parent)
        os.close(fd)
        tmp = Path(name)
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
