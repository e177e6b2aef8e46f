"""The Watcher: follows a store's commits and raises and clears alerts (see castore.watch).

A `Watcher` follows a store's commits and calls `on_alert` once when a condition starts
(`raised`) and once when it ends (`cleared`): an effect UNRESOLVED, SUBMITTED for too long,
near or past its service's idempotency retention, a chain that no longer verifies, or the
filesystem observer itself dying. Filesystem events are only hints: each one makes the
watcher re-read the task it names and verify the snapshots committed since the HEAD it last
verified (verify.extend_head, which falls back to the full walk when anything does not fit),
and a periodic rescan verifies every chain in full, catching whatever the events missed (a
dropped inotify queue, another host's write on a network filesystem, damage below HEAD).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from castore.chain.verify import VerifiedHead, extend_head, verified_head
from castore.errors import (
    CastoreError,
    FormatVersionError,
    IntegrityError,
    TaskNotFoundError,
    UsageError,
)
from castore.format.layout import TASKS_DIR, chain_key
from castore.run.forget import tombstone_head
from castore.store import Store
from castore.watch.alerts import Alert, Condition, Ident, Reading, broken, gone, read_chain, span
from castore.watch.observer import TasksObserver
from castore.watch.poller import DEFAULT_POLL_S, MediumPoller

log = logging.getLogger(__name__)

DEBOUNCE_S = 0.05  # a commit is several filesystem events: re-read once per burst
TICK_S = 1.0  # how often the observer's health and due timers are checked
MAX_RESTART_DELAY_S = 60.0


class Watcher:
    """Follows one store and calls `on_alert(alert)` as conditions start and end.

    `start()` scans every task (alerting on what already holds) before it returns, then
    follows commits with inotify, or with polling every `poll` seconds on a network
    filesystem where inotify does not see other hosts' writes. Every `rescan_every`
    seconds it re-reads everything anyway. An effect SUBMITTED for `stuck_after` seconds
    is stuck; one whose service deduplicates keys is warned about once `retention_warning`
    of that window has passed. `clock` gives epoch seconds (inject one in tests); after an
    event the watcher waits `debounce` seconds so that a burst is re-read once.

    `on_alert` runs on the watcher's thread (or the caller's, for `start` and
    `check_now`), one alert at a time; keep it quick. If it raises, the error is logged
    and watching goes on.
    """

    def __init__(
        self,
        store_path: str | os.PathLike[str],
        on_alert: Callable[[Alert], None],
        *,
        stuck_after: float = 300.0,
        poll: float | None = None,
        rescan_every: float = 30.0,
        retention_warning: float = 0.8,
        clock: Callable[[], float] = time.time,
        debounce: float = DEBOUNCE_S,
    ) -> None:
        _check_settings(stuck_after, poll, rescan_every, retention_warning)
        self._store = Store.open(store_path)
        self._tasks_dir = self._store.medium.where(TASKS_DIR)
        self._on_alert = on_alert
        self._stuck_after = stuck_after
        self._poll = poll
        self._rescan_every = rescan_every
        self._retention_warning = retention_warning
        self._clock = clock
        self._debounce = debounce
        self._lock = threading.RLock()  # the conditions, the observer, and delivery order
        self._active: dict[str | None, dict[Ident, Alert]] = {}  # raised, by task
        self._wake_at: dict[str, float] = {}
        # Each task's HEAD as last verified down to its plan root: an event then costs the
        # snapshots committed since, not the whole chain.
        self._known: dict[str, VerifiedHead] = {}
        self._hint_lock = threading.Lock()  # the only lock an observer thread ever takes
        self._hinted: set[str] = set()
        self._hinted_all = False
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._delivering = threading.local()
        self._thread: threading.Thread | None = None
        self._observer: TasksObserver | MediumPoller | None = None
        self._restart_delay = TICK_S
        self._restart_at = 0.0

    @property
    def root(self) -> str:
        """The store's directory."""
        return self._store.root

    @property
    def mode(self) -> str:
        """How commits are followed: `inotify`, `polling every Ns`, or (a store without
        filesystem events, S3) `listing every Ns`."""
        if not self._store.medium.file_events:
            return f"listing every {self._poll or DEFAULT_POLL_S:g}s"
        return "inotify" if self._poll is None else f"polling every {self._poll:g}s"

    # -- lifetime --------------------------------------------------------------------------
    def start(self) -> None:
        """Start observing, scan every task (alerting before this returns), then follow."""
        with self._lock:
            if self._thread is not None or self._stopping.is_set():
                raise UsageError("a Watcher starts once; create a new one to watch again")
            # Observe first, then scan: a commit landing during the scan is a hint too.
            self._start_or_alert()
            self.check_now()
            if self._stopping.is_set():  # on_alert stopped it during the first scan
                self._discard_observer()
                return
            self._thread = threading.Thread(target=self._loop, name="castore-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop watching (safe to call twice, and from inside `on_alert`)."""
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        inside = getattr(self._delivering, "depth", 0) > 0  # joining would wait on ourselves
        if thread is not None and thread is not threading.current_thread() and not inside:
            thread.join()
        with self._lock:
            self._discard_observer()

    def __enter__(self) -> Watcher:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- scanning ----------------------------------------------------------------------------
    def check_now(self) -> None:
        """Re-read and verify every task's whole chain now and alert on what changed (the
        periodic rescan)."""
        self._scan(interruptible=False)

    def _scan(self, *, interruptible: bool) -> None:
        with self._lock:
            try:
                # An unmounted or unreachable store is not a store whose tasks all finished:
                # without tasks/, clear nothing and try again later.
                self._store.medium.stat(TASKS_DIR)
                tasks = self._store.tasks()
            except OSError as exc:
                log.warning("cannot list the tasks of %s (%s); retrying later", self.root, exc)
                return
            for task in tasks:
                if interruptible and self._stopping.is_set():
                    return
                self._refresh(task, full=True)
            known = {task for task in self._active if task is not None}
            for task in (known | set(self._wake_at) | set(self._known)) - set(tasks):
                self._known.pop(task, None)
                self._apply(gone(task))

    def _refresh_all(self, tasks: Iterable[str]) -> None:
        with self._lock:
            for task in tasks:
                self._refresh(task)

    def _refresh(self, task: str, *, full: bool = False) -> None:
        # Set again by a reading with a deadline; a task that cannot be read must not stay
        # due and be retried on every tick (the rescan retries it).
        self._wake_at.pop(task, None)
        reading = self._read(task, full)
        if reading is not None:
            self._apply(reading)

    def _read(self, task: str, full: bool) -> Reading | None:
        """Re-read and verify one task (its whole chain if `full`, else what was committed
        since its last verified HEAD); None when it cannot be read right now."""
        # Forgotten first: a task that turns out broken or gone is verified in full next time.
        known = self._known.pop(task, None)
        try:
            head = self._verify(task, None if full else known)
        except (IntegrityError, FormatVersionError) as exc:
            return broken(task, str(exc))
        except TaskNotFoundError:
            return self._without_head(task)
        except OSError as exc:
            log.warning("cannot read task %r (%s); retrying later", task, exc)
            if known is not None:
                self._known[task] = known  # nothing was judged: what was verified still is
            return None
        except CastoreError as exc:  # anything else that keeps the chain from verifying
            return broken(task, str(exc))
        self._known[task] = head
        return read_chain(head, self._clock(), self._stuck_after, self._retention_warning)

    def _verify(self, task: str, known: VerifiedHead | None) -> VerifiedHead:
        """Verify twice before calling a chain broken: a walk racing a commit on a network
        filesystem may see a directory listing and a slot that disagree for a moment. The
        second try is always a full walk."""
        try:
            if known is None:
                return verified_head(self._store.verify(task))
            # Store._slots refuses a task or chain directory that is a symlink, as verify does.
            return extend_head(self._store.objects, self._store._slots(task), known)
        except IntegrityError:
            # forget hook: the history below a tombstone may be reclaimed (reclaim.py)
            forgotten = tombstone_head(self._store._slots(task))
            return forgotten or verified_head(self._store.verify(task))

    def _without_head(self, task: str) -> Reading:
        """No slot 0: a task being created or removed, unless later slots exist (damage)."""
        try:
            slots = self._store.medium.names(chain_key(task))
        except OSError:
            slots = []
        if slots:
            return broken(task, f"its chain has {len(slots)} entries but no first snapshot")
        return gone(task)

    def _apply(self, reading: Reading) -> None:
        """Alert on the difference between what held for this task and what holds now."""
        for ident in sorted(self._active.get(reading.task, {}), key=_order):
            if ident[2] in reading.scope and ident not in reading.conditions:
                self._clear(ident, reading.cleared_message(ident))
        for ident in sorted(reading.conditions, key=_order):
            self._raise(reading.conditions[ident])
        if reading.wake_at is None:
            self._wake_at.pop(reading.task, None)
        else:
            self._wake_at[reading.task] = reading.wake_at

    # -- alerting ----------------------------------------------------------------------------
    def _raise(self, condition: Condition) -> None:
        with self._lock:
            raised = self._active.setdefault(condition.task, {})
            if condition.ident in raised:
                return  # still the same condition: it was alerted once already
            c = condition
            alert = Alert(c.kind, "raised", c.task, c.step, c.key, c.message, self._clock())
            raised[condition.ident] = alert
            self._deliver(alert)

    def _clear(self, ident: Ident, message: str) -> None:
        with self._lock:
            for_task = self._active.get(ident[0], {})
            raised = for_task.pop(ident, None)
            if not for_task:
                self._active.pop(ident[0], None)
            if raised is not None:
                r = raised
                self._deliver(
                    Alert(r.kind, "cleared", r.task, r.step, r.key, message, self._clock())
                )

    def _deliver(self, alert: Alert) -> None:
        self._delivering.depth = getattr(self._delivering, "depth", 0) + 1
        try:
            self._on_alert(alert)
        except Exception:
            log.exception(
                "on_alert failed on a %s %s alert; watching goes on", alert.status, alert.kind
            )
        finally:
            self._delivering.depth -= 1

    # -- following -------------------------------------------------------------------------
    def _hint(self, task: str) -> None:
        with self._hint_lock:
            self._hinted.add(task)
        self._wake.set()

    def _hint_all(self) -> None:
        with self._hint_lock:
            self._hinted_all = True
        self._wake.set()

    def _take_hints(self) -> tuple[set[str], bool]:
        with self._hint_lock:
            hinted, everything = self._hinted, self._hinted_all
            self._hinted, self._hinted_all = set(), False
        return hinted, everything

    def _loop(self) -> None:
        next_rescan = time.monotonic() + self._rescan_every
        while not self._stopping.is_set():
            if self._wake.wait(self._wait_time(next_rescan)):
                self._stopping.wait(self._debounce)  # let the rest of a burst land first
                self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                next_rescan = self._tick(next_rescan)
            except Exception:
                log.exception("a check of %s failed; retrying on the next tick", self.root)

    def _tick(self, next_rescan: float) -> float:
        self._check_observer()
        hinted, everything = self._take_hints()
        if everything or time.monotonic() >= next_rescan:
            self._scan(interruptible=True)
            return time.monotonic() + self._rescan_every
        now = self._clock()
        with self._lock:
            due = {task for task, at in self._wake_at.items() if at <= now}
        self._refresh_all(sorted(hinted | due))
        return next_rescan

    def _wait_time(self, next_rescan: float) -> float:
        wait = min(TICK_S, next_rescan - time.monotonic())
        with self._lock:
            earliest = min(self._wake_at.values(), default=None)
        if earliest is not None:
            wait = min(wait, earliest - self._clock())
        return max(wait, 0.01)

    # -- the observer ----------------------------------------------------------------------
    def _start_or_alert(self) -> bool:
        # Back off between attempts: an observer that dies as soon as it starts (its
        # directory is gone) must not be restarted, and alerted about, on every tick.
        self._restart_at = time.monotonic() + self._restart_delay
        self._restart_delay = min(self._restart_delay * 2, MAX_RESTART_DELAY_S)
        try:
            self._observer = self._new_observer()
        except OSError as exc:
            log.warning("the observer of %s could not start (%s); retrying", self.root, exc)
            self._raise(self._observer_down(f"it could not start: {exc}"))
            return False
        return True

    def _new_observer(self) -> TasksObserver | MediumPoller:
        if not self._store.medium.file_events:
            poll = self._poll or DEFAULT_POLL_S
            return MediumPoller(self._store.medium, poll, self._hint, self._hint_all)
        return TasksObserver(self._tasks_dir, self._poll, self._hint, self._hint_all)

    def _discard_observer(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()

    def _observer_down(self, problem: str) -> Condition:
        message = (
            f"the observer ({self.mode}) of {self._tasks_dir} is down ({problem}); restarting "
            f"it. Until then only the rescan every {span(self._rescan_every)} sees commits"
        )
        return Condition("observer", None, None, None, message)

    def _check_observer(self) -> None:
        """Restart a dead observer (with an alert), then rescan for what it missed."""
        with self._lock:
            if self._stopping.is_set():
                return
            observer = self._observer
            problem = "it is not running" if observer is None else observer.problem()
            now = time.monotonic()
            if problem is None:
                if observer is not None and now - observer.since >= TICK_S:  # outlived a tick
                    self._restart_delay = TICK_S
                    message = f"the observer ({self.mode}) of {self._tasks_dir} runs again"
                    self._clear((None, None, "observer"), message)
                return
            self._raise(self._observer_down(problem))
            if now < self._restart_at:
                return
            self._discard_observer()
            if self._start_or_alert():
                self._scan(interruptible=True)  # what changed while nobody listened


def _order(ident: Ident) -> tuple[str, str, str]:
    return (ident[0] or "", ident[1] or "", ident[2])


def _check_settings(
    stuck_after: float, poll: float | None, rescan_every: float, retention_warning: float
) -> None:
    if stuck_after <= 0 or rescan_every <= 0 or (poll is not None and poll <= 0):
        raise UsageError(
            "stuck_after, rescan_every and poll are durations in seconds and must be > 0 "
            f"(got {stuck_after!r}, {rescan_every!r}, {poll!r})"
        )
    if not 0 < retention_warning <= 1:
        raise UsageError(
            f"retention_warning is the fraction of the retention after which to warn, in (0, 1]"
            f" (got {retention_warning!r})"
        )
