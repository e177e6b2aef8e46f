"""Work that outlived its awaiter: a sync send or journaled call still running in a castore.aio
pool thread after the await that started it was cancelled (`asyncio.wait_for` timed it out).

A thread cannot be stopped, so until that function returns its step is in flight in this
process: a reconcile now could find nothing at the service (the request has not arrived yet)
and send it again, and a second call would run the model twice at once. So nothing reconciles,
resends, marks unresolved or calls that step again until it has returned (castore.aio waits
for it; the sync paths refuse with StepInFlightError). The registry is process-wide, keyed by
the task's chain directory: a run of the task opened again in this process sees it too. A
process that is gone runs nothing: a resume elsewhere goes by the table as after a crash.

An async function (a coroutine) has no such afterlife: cancelled, it has ended when the
CancelledError reaches castore. A request it had written may still reach the service, exactly
as one written just before a crash; the retry reconciles it as a resume would.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from castore.errors import StepInFlightError

if TYPE_CHECKING:
    from castore.run import Run

_lock = threading.Lock()
_running: dict[tuple[str, str], Future[Any]] = {}


def _place(run: Run) -> str:
    # Two paths to one store (a symlink, a relative root) are one task.
    return os.path.realpath(run.chain_directory)


def hold(run: Run, step_id: str, job: Future[Any]) -> None:
    """`job` runs step `step_id`'s send or call on in a pool thread, its awaiter gone: the
    step is in flight until `job` ends."""
    key = (_place(run), step_id)
    with _lock:
        _running[key] = job
    job.add_done_callback(lambda ended: _forget(key, ended))


def _forget(key: tuple[str, str], job: Future[Any]) -> None:
    with _lock:
        if _running.get(key) is job:
            del _running[key]


def _held(run: Run, step_id: str | None) -> list[tuple[str, Future[Any]]]:
    """(step, job) of each job still running for `step_id` (any step if None)."""
    if not _running:  # the common case costs no path lookup
        return []
    place = _place(run)
    with _lock:
        held = list(_running.items())
    # A job is over once done(), even before its callback has taken it out of the registry.
    return [
        (step, job)
        for (where, step), job in held
        if where == place and step_id in (None, step) and not job.done()
    ]


def running(run: Run, step_id: str | None = None) -> list[Future[Any]]:
    """The jobs still running for step `step_id` of the run's task (for any step if None)."""
    return [job for _, job in _held(run, step_id)]


def refuse(run: Run, step_id: str | None, doing: str) -> None:
    """StepInFlightError if a send or call of `step_id` (any step if None) is still running."""
    for step, _ in _held(run, step_id):
        raise StepInFlightError(run.task_id, step, doing)
