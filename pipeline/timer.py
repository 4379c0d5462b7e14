"""The project's one timer: wall-clock seconds of calls, and their median over repeats.

What is measured: ``time.perf_counter`` seconds (a monotonic wall clock of the host) from just before a call
to just after it. When ``synchronize`` is given (``torch.cuda.synchronize``, say) it is called right before
the clock starts and again before it stops, so that the time covers the device work the call queued and no
work queued before it. ``warmup`` calls run first and are not timed (their lazy initialisation, compilation
and allocator growth stay out of the figures); then ``repeats`` calls are timed, and more while they have
taken less than ``budget_s`` in all, up to ``max_repeats``. The median is reported, so that one slow call
(another process, the allocator growing) does not decide the figure.

:func:`timed` times one call (and returns its result); :func:`seconds_each` and :func:`median_seconds` run
the loop above; :func:`lap_seconds` times the steps inside a call, between the laps it marks (the tokens of
one ``generate``).

A caller may time one call with another clock (``clock``) and keep the rest of the loop. The GPU suite of
``benchmarks.attention`` does: CUDA events time the GPU's own work between two points of its stream, a
different clock from the host's wall time, which would also count the launch overhead and the synchronising.

Wall times are not a function of a stage's inputs: :mod:`pipeline.timings` keeps them out of the metrics.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Required, TypedDict, TypeVar, Unpack

T = TypeVar("T")

Clock = Callable[[Callable[[], object]], float]  # the seconds of one call of its argument


def timed(run: Callable[[], T], synchronize: Callable[[], object] | None = None) -> tuple[T, float]:
    """``run()``'s result and the wall seconds it took, synchronised before and after when ``synchronize``
    is given (see the module docstring)."""
    if synchronize is not None:
        synchronize()
    started = time.perf_counter()
    result = run()
    if synchronize is not None:
        synchronize()
    return result, time.perf_counter() - started


def seconds_each(
    run: Callable[[], object],
    *,
    repeats: int,
    warmup: int = 0,
    synchronize: Callable[[], object] | None = None,
    budget_s: float = 0.0,
    max_repeats: int = 0,
    clock: Clock | None = None,
) -> list[float]:
    """The seconds of each timed call of ``run``: ``warmup`` untimed calls, then ``repeats`` timed ones and
    more while they have taken less than ``budget_s`` in all, up to ``max_repeats`` calls. Each call is timed
    by :func:`timed` (with ``synchronize``), or by ``clock`` when given (which then synchronises on its
    own)."""
    for _ in range(warmup):
        run()
    seconds: list[float] = []
    while len(seconds) < repeats or (sum(seconds) < budget_s and len(seconds) < max_repeats):
        seconds.append(timed(run, synchronize)[1] if clock is None else clock(run))
    return seconds


class Timing(TypedDict, total=False):
    """The keyword arguments of :func:`seconds_each`, for :func:`median_seconds` to pass on."""

    repeats: Required[int]
    warmup: int
    synchronize: Callable[[], object] | None
    budget_s: float
    max_repeats: int
    clock: Clock | None


def median_seconds(run: Callable[[], object], **timing: Unpack[Timing]) -> float:
    """The median of :func:`seconds_each` (same arguments); ``statistics.StatisticsError`` when no call was
    timed."""
    return statistics.median(seconds_each(run, **timing))


def lap_seconds(run: Callable[[Callable[[], None]], object], *, repeats: int) -> list[float]:
    """The wall seconds between consecutive laps inside a call: ``run(lap)`` is called ``repeats`` times,
    and each call of ``lap`` it makes reads the clock; one figure per lap after a call's first (for steps
    inside a call, such as the tokens of one ``generate``). Warm-up is the caller's."""
    laps: list[float] = []
    for _ in range(repeats):
        stamps: list[float] = []
        run(functools.partial(_stamp, stamps))
        laps += [after - before for before, after in itertools.pairwise(stamps)]
    return laps


def _stamp(stamps: list[float]) -> None:
    stamps.append(time.perf_counter())
