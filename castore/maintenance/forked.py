"""A map over units of work in forked worker processes, with the results in unit order.

Why not ProcessPoolExecutor: its fixed cost (a manager thread, a feeder thread per queue,
every input pickled) measured 30 ms of CPU and 20 ms of wall time for no work at all on
this project's 2-core machine: a tenth of an fsck of 22,000 objects. Here each worker
inherits the units through fork, takes the next unit from a shared counter (so a slow unit
delays no other worker) and sends each result back through its own pipe; the calling
process takes units from the same counter while it has nothing else to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import multiprocessing.util
import signal
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.sharedctypes import Synchronized
from typing import Generic, TypeAlias, TypeVar, cast

from castore.errors import WorkerFailedError

T = TypeVar("T")
R = TypeVar("R")

# What a worker sends for each unit: (index, None, result), or (index, traceback, None).
_Message: TypeAlias = tuple[int, str | None, R | None]

# A worker never waits for the parent to read (it lists objects/ meanwhile) while its pipe
# holds this much; Linux allows it to any process (fs.pipe-max-size is 1 MiB by default).
_PIPE_BYTES = 1 << 20


class ForkedMap(Generic[T, R]):
    """`function(unit)` for every unit, computed by `jobs` processes: `jobs - 1` forked ones
    that start at once, and this one, which takes units too whenever it waits for a result
    that has not come. Iterate for the results in unit order. Use as a context manager:
    leaving it stops whatever workers still run."""

    def __init__(self, function: Callable[[T], R], units: Sequence[T], jobs: int) -> None:
        fork = multiprocessing.get_context("fork")
        self._function, self._units = function, units
        self._taken: Synchronized[int] = fork.Value("q", 0)
        self._workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        for _ in range(min(jobs - 1, len(units))):
            receiver, sender = fork.Pipe(duplex=False)
            _widen(sender)
            # The worker closes its copies of every receiver (this one's, the earlier ones'):
            # then if this process dies, a worker's next send fails and it stops.
            receivers = [*(r for _, r in self._workers), receiver]
            worker = fork.Process(
                target=_work, args=(function, units, self._taken, sender, receivers), daemon=True
            )
            worker.start()
            sender.close()  # this process's copy: EOF comes when the worker's end closes
            self._workers.append((worker, receiver))
        # Stops the workers on close(), when this object is collected, and at interpreter
        # exit before multiprocessing joins its children (workers ignore its SIGTERM).
        self._stop = multiprocessing.util.Finalize(
            self, _stop, args=(list(self._workers),), exitpriority=0
        )

    def __enter__(self) -> ForkedMap[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[R]:
        arrived: dict[int, R] = {}
        listening = [receiver for _, receiver in self._workers]
        for index in range(len(self._units)):
            while index not in arrived:
                # What has come first; then a unit of our own; else wait for the workers.
                ready = wait(listening, timeout=0) if listening else []
                if not ready:
                    mine = self._take_own()
                    if mine is not None:
                        arrived[mine] = self._function(self._units[mine])
                        continue
                    if not listening:
                        raise WorkerFailedError(self._why_short(index))
                    ready = wait(listening, timeout=_PATIENCE)
                    if not ready and self._counter_lost():
                        raise WorkerFailedError(_LOST_COUNTER)
                for receiver in cast(list[Connection], ready):
                    try:
                        message: _Message[R] = receiver.recv()
                    except (EOFError, OSError):  # it ended, or died, even mid-message
                        listening.remove(receiver)
                        continue
                    number, failure, result = message
                    if failure is not None:
                        raise WorkerFailedError(failure)
                    arrived[number] = cast(R, result)
            yield arrived.pop(index)

    def close(self) -> None:
        """Stop the workers that still run (the results were not all wanted) and reap all."""
        self._stop()

    def _take_own(self) -> int | None:
        """`_take` for this process, which gives up when a dead worker holds the lock."""
        lock = self._taken.get_lock()
        while not lock.acquire(timeout=_PATIENCE):
            if self._dead_worker():
                raise WorkerFailedError(_LOST_COUNTER)
        try:
            return _next_unit(self._taken, len(self._units))
        finally:
            lock.release()

    def _counter_lost(self) -> bool:
        """True when no unit can ever be taken again: a worker died holding the lock."""
        lock = self._taken.get_lock()
        if lock.acquire(timeout=_PATIENCE):
            lock.release()
            return False
        return self._dead_worker()

    def _dead_worker(self) -> bool:
        """True if a worker has ended other than by finishing. Its end is seen through its
        sentinel: the caller may reap children itself (SIGCHLD ignored or handled), and then
        no exit status is ever known, which counts as dead here."""
        ended = wait([worker.sentinel for worker, _ in self._workers], timeout=0)
        return any(worker.sentinel in ended and worker.exitcode != 0 for worker, _ in self._workers)

    def _why_short(self, index: int) -> str:
        for worker, _ in self._workers:
            worker.join(timeout=5)  # its pipe is closed: it has ended, or is ending
        codes = [worker.exitcode for worker, _ in self._workers]
        return f"no result for unit {index} of {len(self._units)}; exit statuses {codes}"


def may_fork() -> bool:
    """Fork starts workers at once, with the modules this process has imported; but only
    when this process runs no other thread (a Watcher, an application's own): a forked child
    would inherit their locks as they are, held or not. The other start methods re-run the
    caller's main script in each worker, which a script without a __main__ guard does not
    survive; so with other threads, the caller works in this process alone."""
    return threading.active_count() == 1


def _stop(workers: list[tuple[multiprocessing.process.BaseProcess, Connection]]) -> None:
    """Close the pipes and SIGKILL the workers that still run, then reap them all. SIGKILL:
    workers ignore SIGTERM (it is the caller's to handle, even when sent to the whole process
    group), and they only read, so nothing is lost by stopping them anywhere."""
    for worker, receiver in workers:
        receiver.close()
        if worker.is_alive():
            worker.kill()
        worker.join()


_PATIENCE = 1.0  # seconds between looks at whether a worker died holding the counter's lock
_LOST_COUNTER = "a worker died while it held the lock of the shared counter of units"


def _take(taken: Synchronized[int], count: int) -> int | None:
    """The index of the next unit nobody has taken yet, now taken; None when all are."""
    with taken.get_lock():
        return _next_unit(taken, count)


def _next_unit(taken: Synchronized[int], count: int) -> int | None:
    """`_take`, with the lock held by the caller."""
    index = taken.value
    if index >= count:
        return None
    taken.value = index + 1
    return index


def _work(
    function: Callable[[T], R],
    units: Sequence[T],
    taken: Synchronized[int],
    sender: Connection,
    receivers: list[Connection],
) -> None:
    """A worker's life: take the next unit, send its _Message, until none is left, one
    failed, or the parent is gone."""
    # Ctrl-C and a SIGTERM sent to the whole process group are the caller's to handle; if it
    # stops, close() SIGKILLs the workers, and if it dies, their next send fails.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for receiver in receivers:
        receiver.close()
    while (index := _take(taken, len(units))) is not None:
        try:
            sender.send((index, None, function(units[index])))
        except BrokenPipeError:  # the parent is gone: nobody wants the rest
            break
        except Exception:  # noqa: BLE001 - its traceback goes to the parent, which raises
            with contextlib.suppress(BrokenPipeError):
                sender.send((index, traceback.format_exc(), None))
            break
    sender.close()


def _widen(connection: Connection) -> None:
    """Give the pipe room for a worker's results while the parent is busy elsewhere."""
    with contextlib.suppress(OSError, AttributeError):  # only Linux has F_SETPIPE_SZ
        fcntl.fcntl(connection.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
