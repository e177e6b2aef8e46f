"""fsck's ForkedMap: results in unit order from forked workers and the calling process, and
a clear error (never a hang) when a worker fails or dies."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import castore.maintenance.forked
from castore.errors import WorkerFailedError
from castore.maintenance.forked import ForkedMap

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


@contextlib.contextmanager
def ignoring(signum: int) -> Iterator[None]:
    """This process ignores `signum` for a while."""
    saved = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, saved)


@pytest.fixture
def sigterm_ignored() -> Iterator[None]:
    """The caller handles SIGTERM its own way (here: ignores it), as servers often do."""
    with ignoring(signal.SIGTERM):
        yield


@pytest.mark.usefixtures("sigterm_ignored")
def test_leaving_early_stops_workers_whatever_the_callers_sigterm_handler() -> None:
    started = time.monotonic()
    with ForkedMap(nap, list(range(100)), jobs=3) as forked:
        next(iter(forked))
    assert [] == multiprocessing.active_children()
    assert time.monotonic() - started < 5


def big_result_in_a_worker(unit: int) -> bytes:
    if os.getpid() == PARENT:
        time.sleep(1.0)  # busy with its own unit while the worker writes
        return b""
    return b"x" * 5_000_000  # far more than the pipe holds: the worker waits mid-message


def test_a_worker_killed_in_the_middle_of_a_message_is_an_error() -> None:
    with ForkedMap(big_result_in_a_worker, [0, 1], jobs=2) as forked:
        [(worker, _)] = forked._workers
        timer = threading.Timer(0.5, os.kill, (worker.pid, signal.SIGKILL))
        timer.start()
        with pytest.raises(WorkerFailedError, match="exit statuses"):
            list(forked)
        timer.join()


def test_a_worker_dead_with_the_counters_lock_held_is_an_error_not_a_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Killed (the OOM killer, say) between taking the shared counter's lock and giving it
    back: nobody can take a unit again, and the caller says so."""
    real = castore.maintenance.forked._take

    def die_holding_the_lock(taken: Any, count: int) -> int | None:
        if os.getpid() != PARENT:
            taken.get_lock().acquire()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(taken, count)

    monkeypatch.setattr(castore.maintenance.forked, "_take", die_holding_the_lock)  # workers' only
    started = time.monotonic()
    with (
        ForkedMap(pid_after_a_nap, list(range(400)), jobs=2) as forked,
        pytest.raises(WorkerFailedError, match="held the lock"),
    ):
        list(forked)
    assert time.monotonic() - started < 30


def test_workers_stop_when_the_caller_is_killed() -> None:
    """fsck killed (kill -9): its workers see their pipe broken at their next send, and end
    rather than wait forever to be read."""
    script = (
        "import os, signal, sys\n"
        "from castore.maintenance.forked import ForkedMap\n"
        "def work(unit): return b'x' * 300_000\n"
        "forked = ForkedMap(work, list(range(100)), jobs=3)\n"
        "print(' '.join(str(w.pid) for w, _ in forked._workers), flush=True)\n"
        "next(iter(forked))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    with spawned(script) as (caller, workers):
        assert -signal.SIGKILL == caller.wait(timeout=60)
        assert 2 == len(workers)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)


@contextlib.contextmanager
def spawned(script: str) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A Python process running `script`, which prints its workers' pids on its first line;
    those workers are SIGKILLed at the end whatever happens (a regression must not leave
    them blocked on a pipe for ever)."""
    workers: list[int] = []
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as caller:
        try:
            assert caller.stdout is not None
            workers.extend(int(pid) for pid in caller.stdout.readline().split())
            yield caller, workers
        finally:
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            caller.kill()


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, reaped by init soon, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_sigterm_to_the_whole_process_group_is_left_to_the_caller(
    sigterm_ignored: None,
) -> None:
    """systemd stops a service by sending SIGTERM to every process of its group: a caller
    that handles it (here: ignores it) still gets every result; the workers ignore it."""
    with ForkedMap(pid_after_a_nap, list(range(40)), jobs=3) as forked:
        results = iter(forked)
        first = next(results)
        for worker, _ in forked._workers:
            os.kill(worker.pid, signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert list(range(40)) == [unit for unit, _ in [first, *results]]


@pytest.fixture
def children_reaped_by_the_kernel() -> Iterator[None]:
    """SIGCHLD ignored, as some servers do: nobody ever learns a child's exit status."""
    with ignoring(signal.SIGCHLD):
        yield


@pytest.mark.usefixtures("children_reaped_by_the_kernel")
def test_a_worker_dead_with_the_lock_held_is_seen_even_without_exit_statuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    test_a_worker_dead_with_the_counters_lock_held_is_an_error_not_a_hang(monkeypatch)


def test_a_caller_that_exits_with_workers_still_running_is_not_held_up() -> None:
    """A script that drops the results half read and ends: its workers (which ignore
    SIGTERM, multiprocessing's way of ending daemon children at exit) are killed, and the
    script ends at once instead of joining workers stuck on a full pipe."""
    script = (
        "from castore.maintenance.forked import ForkedMap\n"
        "def work(unit): return b'x' * 300_000\n"
        "forked = ForkedMap(work, list(range(100)), jobs=3)\n"
        "results = iter(forked)\n"
        "next(results)\n"
        "print(' '.join(str(w.pid) for w, _ in forked._workers), flush=True)\n"
    )
    with spawned(script) as (caller, workers):
        assert 0 == caller.wait(timeout=20)
        assert 2 == len(workers)
        assert not any(_alive(pid) for pid in workers)
