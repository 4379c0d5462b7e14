"""Atomic writes: write beside the target under a temporary name, then swap it in.

A crash therefore never leaves a half-written file or folder that looks whole. Temporary and retired names
(``.NAME.tmp-PID-RANDOM``, ``.NAME.old-PID-RANDOM``) carry the writer's pid and a random part, so writers
running at once never collide; what a killed run leaves behind is swept the next time the same target is
written, once process PID is gone.

A folder is swapped in with one ``renameat2(RENAME_EXCHANGE)`` where the C library and the filesystem have
it (Linux): the target then always holds exactly one writer's complete folder, however many write it at
once. Elsewhere the old folder is renamed away and the new one renamed in, retried when another writer
gets between the two renames.

The target is replaced, never written through: a symlink is replaced as a link, and a target that is
neither a regular file nor a folder (a device, a FIFO, a socket) is refused.

:func:`staged_outputs` holds back the writes of several targets until all of them are complete, so that a
failure at any point (a full disk) leaves every previous output as it was.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import glob
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import UserError, writing

# renameat2(2): the directory file descriptor that means "relative to the working folder", and the flag
# that swaps two existing paths in one step
AT_FDCWD = -100
RENAME_EXCHANGE = 2
# errors renameat2 gives where the kernel or the filesystem cannot exchange: take the portable way
EXCHANGE_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}
# rename(2) onto a folder that is not empty, or across kinds: somebody's folder or file is there
TARGET_IN_PLACE = {errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR}
# how often the portable swap retries when other writers keep getting between its two renames
SWAP_ATTEMPTS = 1000

NOT_REGULAR = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
}


def _load_renameat2() -> Any:
    """glibc's ``renameat2`` (2.28 and later), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()

# how many atomic_path blocks enclose the current one: only the outermost names its target when the machine
# fails the write (a full disk), the inner ones write into its temporary folder
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("atomic_depth", default=0)
# the staging area of the innermost staged_outputs block, if any
_staging: contextvars.ContextVar[Staged | None] = contextvars.ContextVar("atomic_staging", default=None)


def check_target(target: str | os.PathLike, said: str | None = None) -> None:
    """Raise :class:`UserError` when ``target`` exists and is neither a regular file, a folder nor a
    symlink (which is replaced as a link): a device, a FIFO or a socket is never replaced. ``said`` is how
    the message names the target (by default "cannot write TARGET")."""
    said = said or f"cannot write {target}"
    try:
        mode = os.lstat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file on the way is reported later)
        return
    except OSError as err:
        raise UserError(f"{said}: {err.strerror}") from None
    kind = NOT_REGULAR.get(stat.S_IFMT(mode))
    if kind is not None:
        raise UserError(
            f"{said}: it is {kind}; allowed: a regular file, a folder or a path that does not exist"
        )


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success swap it in as ``target``.

    With ``directory=True`` the temporary path is an empty folder and an existing ``target`` (folder, file
    or link) is replaced. On error the temporary path is removed and ``target`` is left as it was; the error
    (a full disk, say) is marked with the outermost target (:func:`~pipeline.errors.writing`), so that the
    command's one error line names the output, not a temporary shard inside it. Inside
    :func:`staged_outputs` the swap of a staged target waits for the end of that block.
    """
    target = Path(target)
    check_target(target)
    if not directory and _is_folder(target):
        raise UserError(f"cannot write the file {target}: a folder of that name is in the way")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale(target)
        tmp = _temporary(target, directory)
    except OSError as err:
        raise UserError(f"cannot write {target}: {_reason(err, target)}") from None
    named = writing(str(target)) if _depth.get() == 0 else contextlib.nullcontext()
    depth = _depth.set(_depth.get() + 1)
    try:
        with named:
            yield tmp
            # mkstemp/mkdtemp create private (0600/0700) paths; give the result the usual permissions.
            os.chmod(tmp, (0o777 if directory else 0o666) & ~_umask())
            staging = _staging.get()
            if staging is not None and staging.holds(target):
                staging.hold(target, tmp)
            else:
                _publish(tmp, target)
    except BaseException:
        _remove(tmp)
        raise
    finally:
        _depth.reset(depth)


class Staged:
    """The writes :func:`staged_outputs` holds back: each staged target's complete temporary path."""

    def __init__(self, targets: list[Path]) -> None:
        self.targets = {_key(target): target for target in targets}
        self.pending: dict[str, tuple[Path, Path]] = {}  # key → (target, complete temporary path)

    def holds(self, target: Path) -> bool:
        return _key(target) in self.targets

    def hold(self, target: Path, tmp: Path) -> None:
        previous = self.pending.pop(_key(target), None)
        if previous is not None:  # written twice in the block: the last write counts
            _remove(previous[1])
        self.pending[_key(target)] = (target, tmp)

    def path(self, target: str | os.PathLike) -> Path:
        """Where ``target``'s new content lies now: its held-back temporary path once written in the block,
        else ``target`` itself (to read back what was just written, before it is swapped in)."""
        held = self.pending.get(_key(Path(target)))
        return held[1] if held is not None else Path(target)


def current_path(target: str | os.PathLike) -> Path:
    """Where ``target``'s newest content lies: inside :func:`staged_outputs`, a staged target already
    written waits under its temporary name until the block ends; anywhere else, ``target`` itself."""
    staging = _staging.get()
    return staging.path(target) if staging is not None else Path(target)


@contextlib.contextmanager
def staged_outputs(*targets: str | os.PathLike) -> Iterator[Staged]:
    """Write several outputs as one: every :func:`atomic_path` write of one of ``targets`` inside the block
    stays under its temporary name, and all are swapped in only when the block ends without error.

    Any failure before that (a full disk while the last output is written) removes what was written and
    leaves every target as it was, so a stage never leaves new outputs beside stale ones that describe
    others. Writes of other paths inside the block go ahead as usual.
    """
    staged = Staged([Path(target) for target in targets])
    token = _staging.set(staged)
    try:
        yield staged
    except BaseException:
        for _, tmp in staged.pending.values():
            _remove(tmp)
        raise
    finally:
        _staging.reset(token)
    held = list(staged.pending.values())
    try:
        for target, tmp in held:
            _publish(tmp, target)
    finally:
        for _, tmp in held:  # whatever could not be swapped in (an error while swapping) goes
            _remove(tmp)


def _key(target: Path) -> str:
    return os.path.abspath(target)


def _temporary(target: Path, directory: bool) -> Path:
    """A new empty folder or file beside ``target`` whose name is the writer's alone (pid + random)."""
    prefix = f".{target.name}.tmp-{os.getpid()}-"
    if directory:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    fd, name = tempfile.mkstemp(prefix=prefix, dir=target.parent)
    os.close(fd)
    return Path(name)


def _publish(tmp: Path, target: Path) -> None:
    """Swap the complete ``tmp`` in as ``target``, removing what ``target`` held."""
    if not _is_folder(tmp):
        os.replace(tmp, target)  # atomic for files, and a link at target is replaced as a link
        return
    if _exchange_into(tmp, target):
        return
    _swap_portably(tmp, target)


def _exchange_into(tmp: Path, target: Path) -> bool:
    """Put the folder ``tmp`` at ``target`` in one step: a rename when nothing is there, else an exchange
    (also when another writer put its folder there meanwhile), after which ``tmp`` holds the old content
    and is removed. False where the exchange is unsupported."""
    if _renameat2 is None:
        return False
    for _ in range(SWAP_ATTEMPTS):
        if not os.path.lexists(target):
            try:
                os.rename(tmp, target)
                return True
            except OSError as err:
                if err.errno not in TARGET_IN_PLACE:
                    raise
        result = _renameat2(AT_FDCWD, os.fsencode(tmp), AT_FDCWD, os.fsencode(target), RENAME_EXCHANGE)
        if result == 0:
            _remove(tmp)
            return True
        code = ctypes.get_errno()
        if code in EXCHANGE_UNSUPPORTED:
            return False
        if code != errno.ENOENT:  # ENOENT: the target went away meanwhile; rename again
            raise OSError(code, os.strerror(code), str(target))
    raise UserError(f"cannot write {target}: other processes keep replacing it; run one writer at a time")


def _swap_portably(tmp: Path, target: Path) -> None:
    """Rename the old ``target`` away under a name of this writer's own, rename ``tmp`` in, remove the old;
    retried while other writers get between the two renames (the last to rename in wins, whole)."""
    for _ in range(SWAP_ATTEMPTS):
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{os.urandom(4).hex()}")
        with contextlib.suppress(FileNotFoundError):  # another writer renamed it away first
            os.rename(target, old)
        try:
            os.rename(tmp, target)
        except OSError as err:
            if err.errno not in TARGET_IN_PLACE:
                raise
            continue  # another writer's folder arrived in between: retire it too
        finally:
            _remove(old)
        return
    raise UserError(f"cannot write {target}: other processes keep replacing it; run one writer at a time")


def _is_folder(path: Path) -> bool:
    """Whether ``path`` itself is a folder (a link to one is not: it is replaced as a link)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _remove(path: Path) -> None:
    """Remove a file, a link or a folder tree at ``path``, if there is one."""
    if _is_folder(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


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
            _remove(leftover)


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
