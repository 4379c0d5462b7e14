"""Run a stage script or the ``sparsefinder`` command inside the test process, as ``python -m`` would.

A user-error test only needs what the command prints and its exit status. A fresh interpreter spends most
of its seconds importing torch and transformers before the params check fails, so :func:`run_module` calls
the module's ``main(argv)`` here instead and returns what ``subprocess.run(..., capture_output=True,
text=True)`` would: the exit status ``main`` gives (or ``SystemExit`` carries) and everything written to
stdout and stderr. A few tests still start a real ``python -m`` process to cover the entry points
themselves.

What the in-process run sees differs from a fresh process in ways the helper makes up for:

* stderr: ``sys.stderr`` is swapped for a buffer, and so are the streams of the Hugging Face libraries'
  log handlers, which hold the stream they were created with; a warning the interpreter would print (its
  default filters: no deprecation, import or resource warnings) is written to that buffer too, where
  pytest would otherwise collect it out of sight. Anything stray breaks a test's one-line check as it
  would in a process of its own.
* the network: ``HF_HUB_OFFLINE`` is read when ``huggingface_hub`` and ``datasets`` are imported, so the
  helper sets their module flags as well as the variable; an unknown hub id fails at once, not after a
  timeout.
* process-wide state: what a stage may change before its check fails (working folder, environment,
  random generators, torch's thread count, default dtype and determinism flag, progress-bar switches) is
  put back afterwards, so no later test sees it.
* a crash: an exception other than ``SystemExit`` propagates and fails the test, the in-process form of
  "no traceback".
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import random
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import TextIO

import datasets
import datasets.config
import huggingface_hub.constants
import huggingface_hub.utils
import numpy as np
import pytest
import torch
import transformers.utils.logging

# loggers of the libraries the stages load models and corpora with; their handlers write to the stream
# that was sys.stderr when they were set up
LIBRARY_LOGGERS = ("transformers", "datasets", "huggingface_hub")

# what a fresh interpreter hides by default (its ``sys.warnoptions`` are empty)
HIDDEN_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_module(
    module: str, *args: str, cwd: str | os.PathLike | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in ``cwd`` with ``env`` added to the environment, offline, run by calling
    ``MODULE.main(list(ARGS))`` (``pipeline`` runs :func:`pipeline.cli.main`, as its ``__main__`` does).

    ``returncode`` is what ``sys.exit`` would make of ``main``'s return value or of the ``SystemExit`` it
    raises; ``stdout`` and ``stderr`` hold what the run printed.
    """
    main = importlib.import_module("pipeline.cli" if module == "pipeline" else module).main
    argv = [str(arg) for arg in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        if cwd is not None:
            patch.chdir(cwd)
        for key, value in {"HF_HUB_OFFLINE": "1", **(env or {})}.items():
            patch.setenv(key, value)
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        stack.enter_context(_restored_process_state())
        stack.enter_context(_progress_bars_off())
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(_library_logs_to(err))
        stack.enter_context(_warnings_to_stderr())
        try:
            returncode = _exit_status(main(argv), err)
        except SystemExit as exit_info:
            returncode = _exit_status(exit_info.code, err)
    return subprocess.CompletedProcess(
        ["python", "-m", module, *argv], returncode, out.getvalue(), err.getvalue()
    )


def _exit_status(code: object, err: io.StringIO) -> int:
    """The status ``sys.exit(code)`` ends a process with; like it, print a code that is not a number."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=err)
    return 1


@contextlib.contextmanager
def _restored_process_state() -> Iterator[None]:
    """Put back the process-wide settings a stage may touch before its params check fails.

    Loading a model draws its uninitialised weights from torch's global generator; the others are what
    training code commonly sets, snapshotted so that a stage that starts to set them early harms no
    later test.
    """
    environ = dict(os.environ)
    torch_rng, numpy_rng, python_rng = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    deterministic = torch.are_deterministic_algorithms_enabled()
    deterministic_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        torch.random.set_rng_state(torch_rng)
        np.random.set_state(numpy_rng)
        random.setstate(python_rng)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.use_deterministic_algorithms(deterministic, warn_only=deterministic_warn_only)


@contextlib.contextmanager
def _progress_bars_off() -> Iterator[None]:
    """No progress bars from datasets, transformers or the hub, switched back on afterwards if they were.

    A bar reports work done before the check (loading weights, encoding a split), not an error.
    """
    hub_bars = not huggingface_hub.utils.are_progress_bars_disabled()
    datasets_bars = not datasets.utils.are_progress_bars_disabled()
    transformers_bars = transformers.utils.logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()  # the hub's too
    try:
        yield
    finally:
        if hub_bars:
            huggingface_hub.utils.enable_progress_bars()
        if datasets_bars:
            datasets.enable_progress_bars()
        if transformers_bars:
            transformers.utils.logging.enable_progress_bar()


@contextlib.contextmanager
def _library_logs_to(stream: io.StringIO) -> Iterator[None]:
    """Point the library loggers' console handlers at ``stream`` for the run (and back afterwards)."""
    handlers = [
        handler
        for name in LIBRARY_LOGGERS
        for handler in logging.getLogger(name).handlers
        if type(handler) is logging.StreamHandler  # not a file handler, nor pytest's capturing one
    ]
    previous = [handler.stream for handler in handlers]
    for handler in handlers:
        handler.setStream(stream)
    try:
        yield
    finally:
        for handler, old in zip(handlers, previous, strict=True):
            handler.setStream(old)


@contextlib.contextmanager
def _warnings_to_stderr() -> Iterator[None]:
    """Print warnings to ``sys.stderr`` as a fresh interpreter would, instead of pytest's record of them."""
    with warnings.catch_warnings():
        for category in HIDDEN_WARNINGS:
            warnings.filterwarnings("ignore", category=category)

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

        warnings.showwarning = show
        yield
