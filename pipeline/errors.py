"""What a command prints when it cannot finish: one line on stderr, never a traceback, and an exit status
that says whose the failure is.

* 2: bad input from the user (:class:`UserError`): params, paths, flags, a damaged file.
* 1: the machine the run is on failed it (:func:`environment_failure`): the disk full, a file too large for
  its file system, a read-only disk, an I/O error, too many open files, memory exhausted. Neither the
  input nor a bug, and the one fact that matters would be lost at the bottom of a traceback. A
  :class:`UserError` raised while handling such a failure keeps its line and takes this status.
* 130: Ctrl-C, the status a shell gives a process ended by SIGINT.

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import re
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])

# characters of a printed message at most: a message may quote a value whose repr runs to megabytes
MAX_MESSAGE = 500
INTERRUPTED_STATUS = 130

MEMORY_ADVICE = "free some memory or use smaller batches, models or contexts, and re-run"
ENVIRONMENT_FAILURES = {
    errno.ENOSPC: "no space left on device (free some space and re-run)",
    errno.EDQUOT: "disk quota exceeded (free some space or raise the quota, and re-run)",
    errno.EFBIG: (
        "file too large for the file system or for the process's file-size limit (write to another file "
        "system or raise `ulimit -f`, and re-run)"
    ),
    errno.EROFS: "read-only file system (make it writable or point the output elsewhere, and re-run)",
    errno.EIO: "input/output error (check the disk or network file system, and re-run)",
    errno.EMFILE: "too many open files (raise `ulimit -n` and re-run)",
    errno.ENFILE: "too many open files on the system (close other programs or raise the system's limit)",
    errno.ENOMEM: f"out of memory ({MEMORY_ADVICE})",
}

# an OS error number quoted in the message of an exception that is not an OSError: Rust libraries
# (safetensors, tokenizers) say "(os error 28)", Python code that re-raises says "[Errno 28]"
_QUOTED_ERRNO = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")
# torch.save's C++ writer reports a failed write without its cause (most often a full disk)
_TORCH_WRITE_FAILED = ("PytorchStreamWriter", "unexpected pos", "basic_ios::clear")
_CPU_ALLOCATOR_FAILED = "DefaultCPUAllocator: can't allocate memory"
_WRITING = "_pipeline_writing"


class UserError(Exception):
    """Bad input from the user (params, paths, command-line flags).

    The message is a single line naming what is wrong and what is allowed.
    """


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` on one line (line breaks become spaces) and at most about ``limit`` characters: its head
    and its tail around "…", since a message ends with what is allowed or what to do."""
    if len(text) > limit:  # cut first: the text may be hundreds of megabytes
        tail = limit // 4
        text = f"{text[: limit - tail - 3]} … {text[-tail:]}"
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


@contextlib.contextmanager
def writing(what: str) -> Iterator[None]:
    """Name what the block writes in the line an environment failure inside it gets.

    The OS names at most one file, and often none reaches the user: safetensors and ``torch.save`` raise
    errors of their own that keep only the OS's message. The innermost block's name wins.
    """
    try:
        yield
    except Exception as err:
        if not hasattr(err, _WRITING):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(err, _WRITING, what)
        raise


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the exceptions it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _memory_failure(err: BaseException) -> str | None:
    """The line for running out of memory (GPU or RAM), or None."""
    torch = sys.modules.get("torch")  # loaded by whatever could have run out of GPU memory
    if torch is not None and isinstance(err, torch.OutOfMemoryError):
        # CUDA's message: what was asked for, what the GPU holds, then paragraphs of allocator advice
        facts = ". ".join(str(err).split(". ")[:3])
        return f"out of GPU memory: {facts} ({MEMORY_ADVICE})"
    if isinstance(err, MemoryError):
        return f"out of memory (RAM){': ' + str(err) if str(err) else ''} ({MEMORY_ADVICE})"
    if isinstance(err, RuntimeError) and _CPU_ALLOCATOR_FAILED in str(err):
        asked = str(err).partition(_CPU_ALLOCATOR_FAILED)[2].partition(". ")[0]
        return f"out of memory (RAM){asked} ({MEMORY_ADVICE})"
    return None


def _errno_of(err: BaseException) -> int | None:
    """The environment failure's OS error number ``err`` carries or quotes, or None."""
    if isinstance(err, OSError) and err.errno in ENVIRONMENT_FAILURES:
        return err.errno
    quoted = _QUOTED_ERRNO.search(str(err))
    if quoted:
        number = int(quoted.group(1) or quoted.group(2))
        return number if number in ENVIRONMENT_FAILURES else None
    return None


def environment_failure(err: BaseException) -> str | None:
    """One line for an exception the machine caused (see the module's docstring), or None.

    The whole chain is searched, since libraries wrap the OS's error in one of their own. The line names
    what was being written (:func:`writing`) when known, else the file the OS named.
    """
    chain = list(_chain(err))
    for cause in chain:
        if (line := _memory_failure(cause)) is not None:
            return line
    number = next((number for cause in chain if (number := _errno_of(cause)) is not None), None)
    if number is not None:
        reason = ENVIRONMENT_FAILURES[number]
        if number == errno.ENOMEM:
            return reason
    elif any(
        isinstance(cause, RuntimeError) and any(sign in str(cause) for sign in _TORCH_WRITE_FAILED)
        for cause in chain
    ):
        reason = "a write failed and torch gives no reason; most often the disk is full (free some space)"
    else:
        return None
    what = next((getattr(cause, _WRITING) for cause in chain if hasattr(cause, _WRITING)), None)
    if what is not None:
        return f"writing {what}: {reason}"
    name = next((cause.filename for cause in chain if isinstance(cause, OSError) and cause.filename), None)
    return f"{name}: {reason}" if name else reason


def _say(line: str) -> None:
    """Print ``line`` as one line of its own: an open progress bar (the Trainer's) is closed first, or the
    line would continue the bar's and the bar be drawn again below it."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        with contextlib.suppress(Exception):
            bar.close()
    print(one_line(line), file=sys.stderr, flush=True)


def exits_cleanly(fn: F) -> F:
    """Wrap a command-line ``main`` so that a failure prints one stderr line and exits with its status
    (see the module's docstring); a ``SystemExit`` (argparse's usage errors, exit 2) passes untouched."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            _say(f"error: {err}")
            # raised while handling a failure of the machine (a writer's "cannot write X: no space left"):
            # the line names the target, and the failure is still the machine's
            handled = err.__cause__ or err.__context__
            raise SystemExit(1 if handled and environment_failure(handled) else 2) from None
        except KeyboardInterrupt:
            _say("interrupted")
            raise SystemExit(INTERRUPTED_STATUS) from None
        except Exception as err:
            line = environment_failure(err)
            if line is None:
                raise  # a bug: its traceback is what fixes it
            _say(f"error: {line}")
            raise SystemExit(1) from None

    return wrapper  # type: ignore[return-value]
