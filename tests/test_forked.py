"""fsck's ForkedMap: results in unit order from forked workers and the calling process, and
a clear error (never a hang) when a worker fails or dies."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from castore.errors import WorkerFailedError
from castore.fsck.forked import ForkedMap

PARENT = os.getpid()


def pid_after_a_nap(unit: int) -> tuple[int, int]:
    time.sleep(0.01)
    return unit, os.getpid()


def test_results_come_in_unit_order_from_every_process() -> None:
    with ForkedMap(pid_after_a_nap, list(range(40)), jobs=3) as forked:
        results = list(forked)
    assert list(range(40)) == [unit for unit, _ in results]
    pids = {pid for _, pid in results}
    assert PARENT in pids  # the caller takes units while it waits
    assert 2 <= len(pids - {PARENT})  # and both workers did some
    assert [] == multiprocessing.active_children()


def fail_in_a_worker(unit: int) -> int:
    if os.getpid() == PARENT:
        time.sleep(0.05)  # leaves the worker time to take a unit
        return unit
    raise ValueError(f"unit {unit} is bad")


def test_an_exception_in_a_worker_is_raised_with_its_traceback() -> None:
    with (
        ForkedMap(fail_in_a_worker, list(range(10)), jobs=2) as forked,
        pytest.raises(WorkerFailedError, match=r"ValueError: unit \d+ is bad") as raised,
    ):
        list(forked)
    assert "Traceback" in raised.value.detail
    assert [] == multiprocessing.active_children()


def die_in_a_worker(unit: int) -> int:
    if os.getpid() == PARENT:
        time.sleep(0.05)
        return unit
    os.kill(os.getpid(), signal.SIGKILL)  # like the OOM killer: no message, no cleanup
    return unit


def test_a_worker_killed_mid_unit_is_an_error_not_a_hang() -> None:
    started = time.monotonic()
    with (
        ForkedMap(die_in_a_worker, list(range(10)), jobs=2) as forked,
        pytest.raises(WorkerFailedError, match=r"no result for unit \d+ of 10.*-9"),
    ):
        list(forked)
    assert time.monotonic() - started < 30


def fail_in_the_caller(unit: int) -> int:
    if os.getpid() == PARENT:
        raise KeyError(unit)
    time.sleep(1)
    return unit


def test_an_exception_in_the_caller_propagates_as_itself() -> None:
    with ForkedMap(fail_in_the_caller, list(range(4)), jobs=2) as forked, pytest.raises(KeyError):
        list(forked)
    assert [] == multiprocessing.active_children()


def nap(unit: int) -> int:
    time.sleep(0.2)
    return unit


def test_leaving_early_stops_the_workers() -> None:
    """A caller that stops reading (an error, a break) leaves no worker behind."""
    started = time.monotonic()
    with ForkedMap(nap, list(range(100)), jobs=3) as forked:
        assert 0 == next(iter(forked))
    assert [] == multiprocessing.active_children()
    assert time.monotonic() - started < 5  # not 100 naps shared by 3 processes
