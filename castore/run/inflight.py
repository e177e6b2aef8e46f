"""Sends and journaled calls that may still be running, and the one check made before a step
whose send may run is reconciled, resubmitted, marked or called again.

A SUBMITTED record says a request may have left, not whether its sender is still sending. A
reconcile while the send runs can find nothing at the service (the request has not arrived
yet), record NOT_DONE and send again: two applications on a service that can only be asked by
key. So while its send may run a step is in flight, and only its sender moves it. What castore
can know of a send:

- In this process, everything. Every send registers here (`sending`) from before the link of
  its SUBMITTED commit (so a run that reads that commit sees the registration too) until its
  effect block exits, which is also how a lost SUBMITTED commit ends it (ConflictError: it never
  sends); a journaled call, while its function runs. A sync send or call whose castore.aio await
  was cancelled runs on in a pool thread: `hold` keeps it until that thread returns. Keyed by
  the chain directory's real path and the step, so every run of the task in this process sees
  it, on any Store object or path. castore.aio waits for an entry to end; the sync paths raise
  StepInFlightError. A run's task lock is released only once its entries have ended
  (`after_sends`), so a process that takes the lock next knows its sends are over.
- In another process on this host: the snapshot that made the record SUBMITTED names its
  writer (host, pid). While that process runs, its send may run: refused, sync and async alike
  (nobody waits for another process). A dead pid, or a pid reused by a process started after
  the submission (its start time, from /proc), sends nothing: the table decides.
- On another host, nothing: the table decides, as after a crash (docs/FORMAT.md §14).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from castore.errors import StepInFlightError
from castore.format import identity
from castore.format.model import attrs
from castore.format.records import EffectRecord, EffectState, Snapshot, TransitionKind, Writer
from castore.run.contract import RunView

if TYPE_CHECKING:
    from concurrent.futures import Future

PROC = "/proc"  # procfs, where a process's start time is read (a test points it elsewhere)
# /proc/stat's boot time is in whole seconds: a start time computed from it is off by up to a
# second. A process started later than this after the submission is not the submitter.
START_SLACK_MS = 1_100
_LOOK_BACK = 64  # snapshots searched back from HEAD for the one that made a record SUBMITTED


@attrs.frozen(eq=False)
class _Entry:
    owner: object  # the RunView whose send or call it is
    where: str  # how the refusal names it
    job: Future[Any]


_lock = threading.Lock()
_running: dict[tuple[str, str], list[_Entry]] = {}


def _reset_after_fork() -> None:
    # A forked child runs none of its parent's threads: their entries would never end there.
    global _lock  # noqa: PLW0603 - the module's registry, remade in a forked child
    _lock = threading.Lock()
    _running.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


def _add(run: RunView, step_id: str, where: str, job: Future[Any]) -> None:
    key = (run.task_place, step_id)
    entry = _Entry(run, where, job)
    with _lock:
        _running.setdefault(key, []).append(entry)
    job.add_done_callback(lambda _: _forget(key, entry))  # at once if it has ended already


def _forget(key: tuple[str, str], entry: _Entry) -> None:
    with _lock:
        entries = _running.get(key, [])
        if entry in entries:
            entries.remove(entry)
        if not entries:
            _running.pop(key, None)


@contextlib.contextmanager
def sending(run: RunView, step_id: str) -> Iterator[None]:
    """Step `step_id` of the run's task is being sent or called by `run` in this thread for
    as long as the block runs. Enter it before the SUBMITTED commit is linked."""
    # Imported here: concurrent.futures (and logging, which it imports) cost every command
    # 5 ms to start, and only a run that sends an effect needs one.
    from concurrent.futures import Future  # noqa: PLC0415

    job: Future[None] = Future()
    job.set_running_or_notify_cancel()
    where = f"by run {run.run_id} still runs in thread {threading.current_thread().name!r}"
    _add(run, step_id, where, job)
    try:
        yield
    finally:
        job.set_result(None)


def hold(run: RunView, step_id: str, job: Future[Any]) -> None:
    """`job` runs step `step_id`'s send or call on in a pool thread, its awaiter gone: the
    step is in flight until `job` ends."""
    where = (
        f"that a cancelled castore.aio await of run {run.run_id} started still runs in a pool "
        "thread"
    )
    _add(run, step_id, where, job)


def _held(run: RunView, step_id: str | None) -> list[tuple[str, _Entry]]:
    """(step, entry) of each send or call still running for `step_id` (any step if None)."""
    if not _running:  # the common case costs no lookup
        return []
    place = run.task_place
    with _lock:
        if step_id is not None:
            held = [(step_id, entry) for entry in _running.get((place, step_id), [])]
        else:
            held = [(s, e) for (p, s), entries in _running.items() if p == place for e in entries]
    # An entry is over once its job is done, even before its callback took it out.
    return [(step, entry) for step, entry in held if not entry.job.done()]


def running(run: RunView, step_id: str | None = None) -> list[Future[Any]]:
    """The jobs still running for step `step_id` of the run's task (for any step if None),
    in any run of this process: what castore.aio waits for before it acts on the step."""
    return [entry.job for _, entry in _held(run, step_id)]


def after_sends(owner: object, then: Callable[[], None]) -> None:
    """Call `then` once every send and call `owner` registered has ended: now, if none runs
    (its error raised here), else in the thread that ends the last one."""
    with _lock:
        jobs = [e.job for entries in _running.values() for e in entries if e.owner is owner]
    jobs = [job for job in jobs if not job.done()]
    if not jobs:
        then()
        return
    left = [len(jobs)]
    counting = threading.Lock()

    def one_ended(_: Future[Any]) -> None:
        with counting:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    for job in jobs:
        job.add_done_callback(one_ended)


def refuse(run: RunView, step_id: str, doing: str, *, across_processes: bool = True) -> None:
    """StepInFlightError if a send or call of `step_id` may still be running: registered in
    this process, or (`across_processes`) the SUBMITTED record's submitter, another process of
    this host, runs (a person's decision may skip the second: that process may live on long
    after its send ended, and the person resolving may know it)."""
    held = _held(run, step_id)
    if held:
        raise StepInFlightError(
            run.task_id,
            step_id,
            doing,
            f"the send or call of step {step_id!r} {held[0][1].where}, and its request may "
            "not have arrived yet",
            "retry once it has returned (castore.aio waits for it)",
        )
    if across_processes:
        _refuse_if_submitter_runs(run, step_id, doing)


def _refuse_if_submitter_runs(run: RunView, step_id: str, doing: str) -> None:
    """StepInFlightError if HEAD's record of `step_id` is SUBMITTED by another process of
    this host that still runs (its send may too)."""
    record = run.head.effect(step_id)
    if record is None or record.state is not EffectState.SUBMITTED:
        return
    writer = _submitter(run, record)
    if writer is None or writer.host != identity.host_name() or writer.pid == os.getpid():
        return  # this process's sends are registered; another host's cannot be known
    if submitter_runs(writer.pid, record.since_ms):
        age = max(0, run.now_ms() - record.since_ms) // 1000
        raise StepInFlightError(
            run.task_id,
            step_id,
            doing,
            f"worker pid {writer.pid} on this host submitted it {age} s ago and still runs",
            "retry once it has exited; if you know that worker's send has ended, resolve the "
            "effect by hand (`castore resolve ... --submitter-ended`)",
            pid=writer.pid,
        )


def _submitter(run: RunView, record: EffectRecord) -> Writer | None:
    """The writer of the snapshot that made `record` (HEAD's) SUBMITTED: HEAD, or one before
    it that holds the same record (a seal or an override since); None if it is not found."""
    snapshot: Snapshot | None = run.head
    for _ in range(_LOOK_BACK):
        if snapshot is None or snapshot.effect(record.step) != record:
            return None
        moved = snapshot.transition
        if (
            moved.kind is TransitionKind.EFFECT
            and moved.step == record.step
            and moved.effect_to is EffectState.SUBMITTED
        ):
            return snapshot.writer
        if snapshot.seq == 0:
            return None
        snapshot = run.snapshot_at(snapshot.seq - 1)
    return None


def submitter_runs(pid: int, since_ms: int) -> bool:
    """True if process `pid` of this host runs and may be the one that submitted at
    `since_ms` (wall clock, ms): it exists, is not a zombie, and did not start after then (a
    pid reused by a later process). Without procfs a live pid is taken for the submitter."""
    if pid <= 0:  # 0 and -1 name process groups, never a writer
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    started = _start_ms(pid)
    if started is None:
        return True
    return 0 <= started <= since_ms + START_SLACK_MS


def _start_ms(pid: int) -> int | None:
    """When process `pid` started (wall clock, ms); -1 if it has ended (gone, a zombie);
    None if procfs cannot say."""
    try:
        with open(os.path.join(PROC, str(pid), "stat"), encoding="ascii", errors="replace") as f:
            stat = f.read()
        with open(os.path.join(PROC, "stat"), encoding="ascii", errors="replace") as f:
            boot = next(line for line in f if line.startswith("btime "))
    except FileNotFoundError:
        return -1 if os.path.exists(os.path.join(PROC, "stat")) else None
    except (OSError, StopIteration):
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        state, ticks, booted = fields[0], int(fields[19]), int(boot.split()[1])
    except (IndexError, ValueError):
        return None
    if state in ("Z", "X"):  # a zombie runs nothing
        return -1
    return booted * 1000 + ticks * 1000 // os.sysconf("SC_CLK_TCK")
