"""User-facing errors: one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])


class UserError(Exception):
    """Bad input from the user (params, paths, command-line flags).

    The message is a single line naming what is wrong and what is allowed.
    """


def exits_cleanly(fn: F) -> F:
    """Wrap a command-line ``main`` so a :class:`UserError` becomes one stderr line and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper  # type: ignore[return-value]
