"""The timer on a scripted clock: what is timed, what is discarded, and the median it reports."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest

from pipeline import timer


def scripted_clock(monkeypatch, readings: list[float]) -> list[float]:
    """``time.perf_counter`` made to return ``readings`` in order (failing past their end); returns the
    readings still unread."""
    left = list(readings)

    def perf_counter() -> float:
        return left.pop(0)

    monkeypatch.setattr(time, "perf_counter", perf_counter)
    return left


def stepping_calls(monkeypatch, durations: list[float]) -> tuple[Callable[[], None], list[str]]:
    """A call whose i-th run takes ``durations[i]`` seconds of a fake clock that only it advances, and the
    log of what ran (``"run"``) and when the clock was read (``"read"``)."""
    now, log = [0.0], []

    def perf_counter() -> float:
        log.append("read")
        return now[0]

    def run() -> None:
        log.append("run")
        now[0] += durations[log.count("run") - 1]

    monkeypatch.setattr(time, "perf_counter", perf_counter)
    return run, log


def test_timed_returns_the_result_and_the_clock_difference(monkeypatch) -> None:
    left = scripted_clock(monkeypatch, [10.0, 12.5])
    assert timer.timed(lambda: "done") == ("done", 2.5)
    assert left == []


def test_synchronize_brackets_the_timed_region(monkeypatch) -> None:
    events: list[str] = []
    now = iter([1.0, 4.0])

    def perf_counter() -> float:
        events.append("read")
        return next(now)

    monkeypatch.setattr(time, "perf_counter", perf_counter)
    result, seconds = timer.timed(lambda: events.append("run"), synchronize=lambda: events.append("sync"))
    assert seconds == 3.0 and result is None
    assert events == ["sync", "read", "run", "sync", "read"]


def test_median_discards_the_warm_up_runs(monkeypatch) -> None:
    # a slow warm-up (100 s), then 4, 1 and 2 s: the median of the three timed runs only
    run, log = stepping_calls(monkeypatch, [100.0, 4.0, 1.0, 2.0])
    assert timer.median_seconds(run, repeats=3, warmup=1) == 2.0
    assert log == ["run"] + ["read", "run", "read"] * 3  # the warm-up is never timed
    run, log = stepping_calls(monkeypatch, [100.0, 4.0, 1.0, 2.0])
    assert timer.seconds_each(run, repeats=3, warmup=1) == [4.0, 1.0, 2.0]
    run, log = stepping_calls(monkeypatch, [100.0, 4.0, 1.0, 2.0])
    assert timer.median_seconds(run, repeats=4) == 3.0  # without warm-up it counts; even count: the mean


def test_median_of_scripted_readings(monkeypatch) -> None:
    # start/stop pairs: 7, 3, 5 seconds; the warm-up run reads no clock
    left = scripted_clock(monkeypatch, [0.0, 7.0, 10.0, 13.0, 20.0, 25.0])
    runs: list[int] = []
    assert timer.median_seconds(lambda: runs.append(1), repeats=3, warmup=2) == 5.0
    assert len(runs) == 2 + 3 and left == []


def test_budget_adds_runs_while_they_are_quick_up_to_the_most(monkeypatch) -> None:
    run, log = stepping_calls(monkeypatch, [3.0] * 10)
    # 3, 6, 9 s are under the 10 s budget: a fourth run, and no more
    assert timer.seconds_each(run, repeats=1, budget_s=10.0, max_repeats=8) == [3.0] * 4
    run, log = stepping_calls(monkeypatch, [1.0] * 10)
    assert timer.seconds_each(run, repeats=2, budget_s=100.0, max_repeats=6) == [1.0] * 6  # the most
    run, log = stepping_calls(monkeypatch, [50.0] * 10)
    assert timer.seconds_each(run, repeats=3, budget_s=60.0, max_repeats=6) == [50.0] * 3  # the given count
    assert log.count("run") == 3


def test_no_timed_run_has_no_median(monkeypatch) -> None:
    run, log = stepping_calls(monkeypatch, [1.0])
    assert timer.seconds_each(run, repeats=0) == [] and log == []
    with pytest.raises(statistics.StatisticsError):
        timer.median_seconds(run, repeats=0)


def test_another_clock_times_each_call(monkeypatch) -> None:
    scripted_clock(monkeypatch, [])  # the wall clock is never read
    calls: list[str] = []
    ticks = iter([0.5, 0.25, 0.75])

    def clock(call: Callable[[], object]) -> float:
        call()
        return next(ticks)

    assert timer.median_seconds(lambda: calls.append("run"), repeats=3, warmup=1, clock=clock) == 0.5
    assert len(calls) == 1 + 3


def test_laps_are_the_gaps_between_consecutive_laps_of_each_run(monkeypatch) -> None:
    # two runs of three laps each: 0 → 2 → 3, then 10 → 14 → 20
    left = scripted_clock(monkeypatch, [0.0, 2.0, 3.0, 10.0, 14.0, 20.0])

    def run(lap: Callable[[], None]) -> None:
        for _ in range(3):
            lap()

    assert timer.lap_seconds(run, repeats=2) == [2.0, 1.0, 4.0, 6.0]  # not the 7 s between the runs
    assert left == []
