"""castore watch: alerts follow real commits by other processes, through real filesystem events.

Nothing here sleeps to wait: every wait is for an alert or a child's output, with a
deadline. The watchers run with a one-hour rescan unless a test is about the rescan, so an
alert that arrives proves the filesystem events (or the stuck timer) delivered it.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from helpers import rewrite, wait_for

import castore
from castore.chain.objects import ObjectStore
from castore.chain.refs import TaskSlots
from castore.cli import main, parse_duration
from castore.cli.watch import alert_line
from castore.watch import Watcher
from castore.watch.alerts import Alert

# watchdog's inotify observer warns when it adds a new directory's watch twice; harmless.
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")

DEADLINE_S = 10.0
HOUR = 3600.0
PLAN = castore.Plan.build("pay", "price", castore.effect("charge", "price"), "email")

# A worker in its own process: `submit` leaves charge SUBMITTED (the request went out, the
# connection dropped); `settle` is the restart, which must mark it UNRESOLVED because the
# service can neither deduplicate nor be asked.
WRITER = """
import sys

import castore

store_path, task, mode = sys.argv[1:4]
plan = castore.Plan.build("pay", "price", castore.effect("charge", "price"), "email")
service = castore.Service("payments")
with castore.Store.open(store_path).open_task(task, plan) as run:
    if mode == "submit":
        run.commit_step("price", 4200)
        try:
            with run.effect("charge", service):
                raise ConnectionError("reset after the request was sent")
        except ConnectionError:
            pass
    else:
        assert run.settle(service).action is castore.Action.ESCALATE
"""


def write(store: castore.Store, task: str, mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WRITER, store.root, task, mode],
        check=False,
        timeout=30,
        capture_output=True,
        text=True,
    )
    assert 0 == done.returncode, done.stderr


def make_unresolved(store: castore.Store, task: str) -> None:
    write(store, task, "submit")
    write(store, task, "settle")


class Alerts:
    """An on_alert callback that keeps every alert and lets a test wait for one."""

    def __init__(self) -> None:
        self.all: list[Alert] = []
        self._arrived = threading.Condition()

    def __call__(self, alert: Alert) -> None:
        with self._arrived:
            self.all.append(alert)
            self._arrived.notify_all()

    def wait(
        self,
        kind: str,
        status: str = "raised",
        task: str | None = None,
        timeout: float = DEADLINE_S,
    ) -> Alert:
        """The first such alert, whenever it came (other alerts may arrive in between)."""

        def found() -> Alert | None:
            return next((a for a in self.all if self._matches(a, kind, status, task)), None)

        with self._arrived:
            alert = self._arrived.wait_for(found, timeout)
        if alert is None:
            raise AssertionError(f"no {status} {kind} alert within {timeout}s; got {self.all}")
        return alert

    def count(self, kind: str, status: str, task: str | None = None) -> int:
        return sum(self._matches(a, kind, status, task) for a in self.all)

    @staticmethod
    def _matches(alert: Alert, kind: str, status: str, task: str | None) -> bool:
        return (alert.kind, alert.status) == (kind, status) and task in (None, alert.task)


@pytest.fixture
def watchers() -> Iterator[Callable[..., Watcher]]:
    """Make watchers on a store; every one is stopped at the end of the test."""
    made: list[Watcher] = []

    def make(store: castore.Store, on_alert: Alerts, **options: Any) -> Watcher:
        options.setdefault("rescan_every", HOUR)
        options.setdefault("stuck_after", HOUR)
        watcher = Watcher(store.root, on_alert, **options)
        made.append(watcher)
        return watcher

    yield make
    for watcher in made:
        watcher.stop()


@pytest.mark.parametrize("poll", [None, 0.2], ids=["inotify", "polling"])
def test_unresolved_effect_from_another_process_alerts_once_then_clears(
    store: castore.Store, watchers: Callable[..., Watcher], poll: float | None
) -> None:
    """A worker process leaves an effect UNRESOLVED: one alert within seconds; resolving
    it brings one cleared alert."""
    alerts = Alerts()
    watcher = watchers(store, alerts, poll=poll)
    watcher.start()
    make_unresolved(store, "order-1")
    raised = alerts.wait("unresolved", task="order-1")
    assert ("charge", True) == (raised.step, (raised.key or "").startswith("cas-"))
    assert "castore resolve order-1 charge" in raised.message
    watcher.check_now()  # a re-read of a condition that still holds repeats nothing
    assert 1 == alerts.count("unresolved", "raised")
    store.resolve("order-1", "charge", not_done=True, reason="not in the payments ledger")
    cleared = alerts.wait("unresolved", "cleared", task="order-1")
    assert "NOT_DONE" in cleared.message
    assert [("unresolved", "raised"), ("unresolved", "cleared")] == [
        (a.kind, a.status) for a in alerts.all
    ]


def test_effect_submitted_past_the_threshold_alerts_as_stuck(
    store: castore.Store, watchers: Callable[..., Watcher]
) -> None:
    """An effect left SUBMITTED alerts once stuck_after has passed (the stuck timer, not a
    rescan), and clears when a person confirms it."""
    alerts = Alerts()
    watchers(store, alerts, stuck_after=1.0).start()
    write(store, "order-2", "submit")
    stuck = alerts.wait("stuck", task="order-2")
    record = store.verify("order-2").head.effect("charge")
    assert record is not None
    assert stuck.time >= record.since_ms / 1000 + 1.0
    assert "SUBMITTED" in stuck.message
    store.resolve("order-2", "charge", receipt="ch_9")
    assert "CONFIRMED" in alerts.wait("stuck", "cleared", task="order-2").message


def test_injected_clock_drives_stuck_and_retention_alerts(store: castore.Store) -> None:
    """With an injected clock: stuck after the threshold, a retention warning at 80% of an
    idempotent service's window (counted from the first submission), each once."""
    payments = castore.Service("payments", idempotent=True, retention=100)
    with store.open_task("order-3", PLAN) as run:
        run.commit_step("price", 4200)
        with pytest.raises(ConnectionError), run.effect("charge", payments):
            raise ConnectionError("reset")
    record = store.verify("order-3").head.effect("charge")
    assert record is not None
    now = [record.since_ms / 1000]
    alerts = Alerts()
    watcher = Watcher(store.root, alerts, stuck_after=50, clock=lambda: now[0])
    for offset, expected in [(10, []), (60, ["stuck"]), (85, ["stuck", "retention"])]:
        now[0] = record.since_ms / 1000 + offset
        watcher.check_now()
        assert expected == [a.kind for a in alerts.all]
    assert "ends in" in alerts.all[-1].message
    now[0] += 100  # past the retention: still the same condition, no new alert
    watcher.check_now()
    assert 2 == len(alerts.all)
    store.resolve("order-3", "charge", receipt="ch_3")
    watcher.check_now()
    assert [("retention", "cleared"), ("stuck", "cleared")] == [
        (a.kind, a.status) for a in alerts.all[2:]
    ]


def test_restarted_watcher_repeats_what_holds_but_not_what_cleared(
    store: castore.Store, watchers: Callable[..., Watcher]
) -> None:
    """The start scan alerts on every effect already UNRESOLVED; after a restart, an alert
    that was cleared is not raised again."""
    make_unresolved(store, "order-a")
    make_unresolved(store, "order-b")
    first = Alerts()
    watcher = watchers(store, first)
    watcher.start()
    assert ["order-a", "order-b"] == sorted(a.task or "" for a in first.all)
    store.resolve("order-a", "charge", receipt="ch_a")
    first.wait("unresolved", "cleared", task="order-a")
    watcher.stop()
    second = Alerts()
    restarted = watchers(store, second)
    restarted.start()  # scans synchronously: its alerts are in by now
    restarted.check_now()
    assert [("unresolved", "raised", "order-b")] == [(a.kind, a.status, a.task) for a in second.all]


def test_chain_damage_without_events_is_caught_by_the_rescan(
    store: castore.Store, watchers: Callable[..., Watcher]
) -> None:
    """A snapshot rewritten through objects/ makes no event under tasks/: the periodic
    rescan re-verifies the chain, alerts, and clears when the bytes are back."""
    with store.open_task("order-4", PLAN) as run:
        run.commit_step("price", 4200)
        head = Path(store.objects.path(run.head_id))
    original = head.read_bytes()
    alerts = Alerts()
    watchers(store, alerts, rescan_every=0.3).start()
    head.chmod(0o644)
    head.write_bytes(original[:-2] + bytes([original[-2] ^ 1]) + original[-1:])
    assert "does not verify" in alerts.wait("chain", task="order-4").message
    head.write_bytes(original)
    alerts.wait("chain", "cleared", task="order-4")
    head.chmod(0o444)


@pytest.mark.parametrize("what", ["observer", "emitter", "replaced"])
def test_a_dead_observer_is_restarted_with_an_alert(
    store: castore.Store, watchers: Callable[..., Watcher], what: str
) -> None:
    """Stopping the observer thread, or its emitter (as watchdog's polling emitter does on
    its own), or replacing tasks/ under an inotify watch (a restore) brings an observer
    alert and a restart, and alerts keep following commits."""
    alerts = Alerts()
    watcher = watchers(store, alerts, poll=0.2 if what == "emitter" else None)
    watcher.start()
    watching = watcher._observer  # private on purpose: the test kills the watcher's thread
    assert watching is not None
    observer = watching.observer
    if what == "observer":
        observer.stop()
    elif what == "emitter":
        for emitter in list(observer.emitters):
            emitter.stop()
    else:
        tasks = Path(store.root, "tasks")
        tasks.rename(tasks.with_name("tasks-before"))
        tasks.mkdir()
    assert "restarting" in alerts.wait("observer").message
    make_unresolved(store, "order-5")
    alerts.wait("unresolved", task="order-5")
    alerts.wait("observer", "cleared")
    assert watcher._observer is not watching


def test_a_failing_callback_is_logged_and_watching_goes_on(
    store: castore.Store, watchers: Callable[..., Watcher], caplog: pytest.LogCaptureFixture
) -> None:
    """on_alert raising is logged; the next alert is still delivered."""
    make_unresolved(store, "order-6")
    alerts = Alerts()

    def flaky(alert: Alert) -> None:
        alerts(alert)
        if len(alerts.all) == 1:
            raise RuntimeError("the pager is down")

    with caplog.at_level(logging.ERROR, logger="castore.watch"):
        watchers(store, flaky).start()
    assert "on_alert failed" in caplog.text
    store.resolve("order-6", "charge", receipt="ch_6")
    alerts.wait("unresolved", "cleared", task="order-6")


def test_import_castore_does_not_import_watchdog() -> None:
    """Only castore.watch.observer (for castore.watch) imports watchdog; the library and the CLI
    parser do not."""
    code = (
        "import sys, castore, castore.cli; castore.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'watchdog'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=30
    )
    assert "[]" == result.stdout.strip()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("300", 300.0), ("300s", 300.0), ("5m", 300.0), ("2h", 7200.0), ("1d", 86400.0), ("0.2", 0.2)],
)
def test_durations(text: str, seconds: float) -> None:
    """Durations are seconds, or a number with s, m, h or d."""
    assert seconds == parse_duration(text)


@pytest.mark.parametrize("text", ["", "5x", "-1", "0", "m", "1.5.2"])
def test_bad_durations_are_refused(text: str) -> None:
    """Anything else is a usage error naming the accepted forms."""
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_human_line() -> None:
    """One line per alert: UTC time, RAISED or CLEARED, the kind, the message."""
    alert = Alert("stuck", "raised", "t", "charge", "cas-1", "effect charge is stuck", 0.0)
    assert "1970-01-01T00:00:00Z RAISED stuck: effect charge is stuck" == alert_line(alert)


def test_a_missing_hook_program_is_a_usage_error(store: castore.Store) -> None:
    """--exec naming no executable fails at once (exit 2), before watching."""
    assert 2 == main(["watch", store.root, "--exec", "no-such-program-castore-hook"])


@pytest.mark.parametrize("command", ["'unclosed", "notify\\", "", "   "])
def test_an_exec_that_does_not_parse_is_one_line_exit_2(
    store: castore.Store, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unclosed quote, a trailing backslash or no command at all: exit 2, one line that
    names --exec, never a traceback."""
    assert 2 == main(["watch", store.root, "--exec", command])
    err = capsys.readouterr().err
    assert [True] == [line.startswith("castore: error: --exec") for line in err.splitlines()]


class Lines:
    """A child's output, line by line, read on a thread so a wait can have a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.text: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.text.append(line)
            self._queue.put(line)

    def next(self, timeout: float = DEADLINE_S) -> str:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout}s; so far: {self.text}") from None


@pytest.mark.parametrize(
    ("hook", "stop_with"), [("fails", signal.SIGTERM), ("hangs", signal.SIGINT)]
)
def test_cli_survives_a_failing_or_hanging_hook(
    store: castore.Store, tmp_path: Path, hook: str, stop_with: signal.Signals
) -> None:
    """`castore watch --json --exec`: a hook exiting 1, or hanging past --exec-timeout, is
    logged on stderr; alerts keep coming; SIGTERM/SIGINT stop it with exit 0."""
    make_unresolved(store, "order-a")
    seen = tmp_path / "hook-input.jsonl"
    command = f"sh -c 'cat >> {seen}; exit 1'" if hook == "fails" else "sleep 60"
    argv = ["watch", store.root, "--json", "--rescan", "1h", "--exec", command]
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from castore.cli import entry_point; entry_point()",
            *argv,
            "--exec-timeout",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stderr is not None
        out, err = Lines(child.stdout), Lines(child.stderr)
        first = json.loads(out.next())
        assert ("unresolved", "raised", "order-a") == (
            first["kind"],
            first["status"],
            first["task"],
        )
        make_unresolved(store, "order-b")
        second = json.loads(out.next())
        assert ("unresolved", "order-b") == (second["kind"], second["task"])
        if hook == "fails":
            wait_for(lambda: "exited 1" in "".join(err.text), DEADLINE_S, "the hook failure log")
            assert first == json.loads(seen.read_text().splitlines()[0])
        else:
            wait_for(lambda: "timed out" in "".join(err.text), DEADLINE_S, "the hook timeout log")
        child.send_signal(stop_with)
        assert 0 == child.wait(timeout=DEADLINE_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "Traceback" not in "".join(err.text)


# ------------------------------------------------------------- reading only what is new

LONG = castore.Plan.build("long", *(f"s{i}" for i in range(80)))
NEW = 5  # commits after the watcher's start scan


def commit_steps(run: castore.Run, count: int, tag: str = "") -> None:
    for _ in range(count):
        step = run.next_step
        assert step is not None
        run.commit_step(step, {"step": step, "tag": tag})


def verified_seq(watcher: Watcher, task: str) -> int | None:
    known = watcher._known.get(task)  # private on purpose: what the watcher last verified
    return None if known is None else known.head.seq


@pytest.fixture
def watcher_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every object id (ObjectStore.read) and slot ('slot N', TaskSlots.read) the watcher's
    own thread reads; the test's writer reads are not counted."""
    seen: list[str] = []
    object_read, slot_read = ObjectStore.read, TaskSlots.read

    def watching() -> bool:
        return threading.current_thread().name == "castore-watch"

    def read_object(self: ObjectStore, object_id: str) -> bytes:
        if watching():
            seen.append(object_id)
        return object_read(self, object_id)

    def read_slot(self: TaskSlots, seq: int) -> bytes:
        if watching():
            seen.append(f"slot {seq}")
        return slot_read(self, seq)

    monkeypatch.setattr(ObjectStore, "read", read_object)
    monkeypatch.setattr(TaskSlots, "read", read_slot)
    return seen


def test_commits_to_a_long_chain_are_verified_by_reading_only_the_new_slots(
    store: castore.Store, watchers: Callable[..., Watcher], watcher_reads: list[str]
) -> None:
    """After the start scan verified a 60-snapshot chain, 5 commits make the watcher read
    the slots from its remembered HEAD up and the 5 new snapshots, nothing older."""
    with store.open_task("long-1", LONG) as run:
        commit_steps(run, 59)
        watcher = watchers(store, Alerts())
        watcher.start()
        assert 59 == verified_seq(watcher, "long-1")
        watcher_reads.clear()
        commit_steps(run, NEW)
    wait_for(lambda: verified_seq(watcher, "long-1") == 59 + NEW, DEADLINE_S, "the new HEAD")
    new_ids = [snapshot_id for snapshot_id, _ in store.history("long-1")[:NEW]]
    objects_read = {read for read in watcher_reads if not read.startswith("slot ")}
    slots_read = {int(read.split()[1]) for read in watcher_reads if read.startswith("slot ")}
    assert (True, set()) == (new_ids[0] in objects_read, objects_read - set(new_ids))
    assert set() == {seq for seq in slots_read if seq < 59}


def other_snapshot(tmp_path: Path, task: str, seq: int) -> bytes:
    """The bytes of a valid snapshot of `task` at `seq` from another history of it (another
    store, other results): what a forged splice would plant."""
    elsewhere = castore.Store.init(tmp_path / "elsewhere")
    with elsewhere.open_task(task, LONG) as run:
        commit_steps(run, seq, tag="forged")
    return Path(elsewhere.layout.slot_path(task, seq)).read_bytes()


def test_a_spliced_remembered_head_is_caught_by_the_fallback_at_the_next_commit(
    store: castore.Store, watchers: Callable[..., Watcher], tmp_path: Path
) -> None:
    """The remembered HEAD's file rewritten in place with another valid snapshot of the same
    task and seq: the next commit's check sees the slot changed, falls back to the full walk,
    and alerts, without waiting for a rescan."""
    forged = other_snapshot(tmp_path, "long-2", 20)
    alerts = Alerts()
    with store.open_task("long-2", LONG) as run:
        commit_steps(run, 20)
        watcher = watchers(store, alerts)  # rescan_every: an hour
        watcher.start()
        assert 20 == verified_seq(watcher, "long-2")
        rewrite(Path(store.layout.slot_path("long-2", 20)), lambda _: forged)
        commit_steps(run, 1)
    assert "does not verify" in alerts.wait("chain", task="long-2").message


def test_a_splice_below_the_remembered_head_is_caught_by_the_rescan(
    store: castore.Store, watchers: Callable[..., Watcher], tmp_path: Path
) -> None:
    """A snapshot below the remembered HEAD rewritten in place with another valid snapshot of
    the same task: commits after it are checked from the remembered HEAD up (no alert), and
    the rescan, which walks the whole chain, alerts."""
    forged = other_snapshot(tmp_path, "long-3", 5)
    alerts = Alerts()
    with store.open_task("long-3", LONG) as run:
        commit_steps(run, 20)
        watcher = watchers(store, alerts)
        watcher.start()
        rewrite(Path(store.layout.slot_path("long-3", 5)), lambda _: forged)
        commit_steps(run, 2)
    wait_for(lambda: verified_seq(watcher, "long-3") == 22, DEADLINE_S, "the new HEAD")
    assert 0 == alerts.count("chain", "raised")
    watcher.check_now()  # the periodic rescan
    assert "does not verify" in alerts.wait("chain", task="long-3").message


def test_alert_to_json_is_text_and_to_dict_its_fields() -> None:
    """`alert.to_json()` is one line of JSON text (what a pager is sent), `to_dict()` a dict."""
    alert = Alert("unresolved", "raised", "order-17", "charge", "cas-1", "ask the service", 1.5)
    expected = {
        "kind": "unresolved",
        "status": "raised",
        "task": "order-17",
        "step": "charge",
        "key": "cas-1",
        "message": "ask the service",
        "time": 1.5,
    }
    assert expected == alert.to_dict()
    text = alert.to_json()
    assert (str, expected, 0) == (type(text), json.loads(text), text.count("\n"))
