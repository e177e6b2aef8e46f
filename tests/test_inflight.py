"""A send that may still run keeps its step in flight (castore.run.inflight): two runs of one task
without a lock in one process, a submitter in another process of this host, and how a pid
reused by a later process is told from the submitter. Each send is held by an event or a pipe
the test controls, so the order is fixed: no sleeps."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeshop import DEADLINE_S, HeldSend, Ledger

import castore
from castore.aio import AsyncStore
from castore.run import inflight

TASK = "job"
PLAN = castore.Plan.build("pay", castore.effect("pay"), "after")


class Sender:
    """`fn()` in a thread of its own; `outcome()` is what it returned or raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._ended: list[Any] = []
        self._thread = threading.Thread(target=self._body, args=(fn,), name="first-run")
        self._thread.start()

    def _body(self, fn: Callable[[], Any]) -> None:
        try:
            self._ended.append(fn())
        except Exception as exc:  # noqa: BLE001 - the outcome the test looks at
            self._ended.append(exc)

    def outcome(self) -> Any:
        self._thread.join(DEADLINE_S)
        assert not self._thread.is_alive()
        return self._ended[0]


def attempt(verb: str, run: castore.Run, ledger: Ledger | FileLedger) -> Callable[[], object]:
    """What the second run tries on the effect the first one is sending."""
    service = ledger.service()

    def block() -> None:
        with run.effect("pay", service) as call:
            call.confirm(ledger.apply(call.key))

    verbs: dict[str, Callable[[], object]] = {
        "perform": lambda: run.perform("pay", service, ledger.apply),
        "effect": block,
        "reconcile": lambda: run.reconcile("pay", service),
        "settle": lambda: run.settle(service),
    }
    return verbs[verb]


@pytest.mark.parametrize("verb", ["perform", "effect", "reconcile", "settle"])
def test_a_second_run_is_refused_while_the_first_runs_send_runs(tmp_path: Path, verb: str) -> None:
    """Two runs of one task in one process without a lock, on two stores (one opened through
    a symlink): while the first's send is held after its SUBMITTED commit, the second's
    perform, effect, reconcile or settle is refused (StepInFlightError naming the first run)
    and commits nothing; the payment is applied once."""
    root = tmp_path / "store"
    castore.Store.init(root)
    (tmp_path / "link").symlink_to(root)
    ledger = Ledger()
    held = HeldSend(ledger)
    first = castore.Store.open(root).open_task(TASK, PLAN, lock_timeout=None)
    sending = Sender(lambda: first.perform("pay", ledger.service(), held))
    try:
        assert held.entered.wait(DEADLINE_S)
        second = castore.Store.open(tmp_path / "link").resume(TASK, PLAN, lock_timeout=None)
        head = second.head_id
        try:
            attempt(verb, second, ledger)()
        except castore.StepInFlightError as exc:
            refused: Exception | None = exc
        else:
            refused = None
        moved = second.head_id != head
    finally:
        held.release.set()
    assert ("receipt-1", 1, False) == (sending.outcome(), len(ledger.applied), moved)
    assert refused is not None
    assert f"by run {first.run_id} still runs in thread 'first-run'" in str(refused)
    first.close()
    second.close()


def test_the_second_run_goes_by_the_table_once_the_send_returned(tmp_path: Path) -> None:
    """Once the first run's send has returned, the second run's perform is no longer refused:
    it reconciles, finds the payment by key, and (the first having committed CONFIRMED) its
    commit loses the race; a resume then sees the effect done; applied once."""
    store = castore.Store.init(tmp_path / "store")
    ledger = Ledger()
    held = HeldSend(ledger)
    first = store.open_task(TASK, PLAN, lock_timeout=None)
    sending = Sender(lambda: first.perform("pay", ledger.service(), held))
    assert held.entered.wait(DEADLINE_S)
    second = store.resume(TASK, PLAN, lock_timeout=None)
    held.release.set()
    assert "receipt-1" == sending.outcome()
    with pytest.raises(castore.ConflictError):
        second.perform("pay", ledger.service(), ledger.apply)
    with store.resume(TASK, PLAN, lock_timeout=None) as third:
        assert ("receipt-1", 1) == (third.receipt("pay"), len(ledger.applied))
    first.close()
    second.close(finish=False)


# -- a submitter in another process of this host ------------------------------------------------
CHILD = """
import sys
import castore

root, applied = sys.argv[1], sys.argv[2]
plan = castore.Plan.build("pay", castore.effect("pay"), "after")


def lookup(key):
    return castore.NOT_FOUND  # never asked: this process submits first


def send(key):
    print("sending", flush=True)
    sys.stdin.readline()  # held until the test writes a line (or kills this process)
    with open(applied, "a") as out:
        out.write(key + "\\n")
    return "child-receipt"


with castore.Store.open(root).open_task("job", plan, lock_timeout=None) as run:
    run.perform("pay", castore.Service("shop", reconcile=lookup), send)
"""


class FileLedger:
    """The service as two processes share it: one key per line of a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def applied(self) -> list[str]:
        return self.path.read_text().split()

    def apply(self, key: str) -> str:
        with self.path.open("a") as out:
            out.write(key + "\n")
        return f"receipt-{len(self.applied())}"

    def service(self) -> castore.Service:
        def lookup(key: str) -> castore.Reconciled:
            return castore.found("child-receipt") if key in self.applied() else castore.NOT_FOUND

        return castore.Service("shop", reconcile=lookup)


@pytest.fixture
def child_sending(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, FileLedger]]:
    """A child process that started the task, committed SUBMITTED and now blocks in its send
    (on its stdin) until the test writes a line or kills it."""
    root = tmp_path / "store"
    castore.Store.init(root)
    ledger = FileLedger(tmp_path / "applied")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(ledger.path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        readable, _, _ = select.select([child.stdout], [], [], DEADLINE_S)
        assert readable, "the child never reached its send"
        assert "sending" == child.stdout.readline().strip()
        yield child, root, ledger
    finally:
        child.kill()
        child.wait(DEADLINE_S)


def test_a_live_submitter_on_this_host_is_not_reconciled_under(
    child_sending: tuple[subprocess.Popen[str], Path, FileLedger],
) -> None:
    """A child process committed SUBMITTED and is still in its send: a lock-free resume here
    is refused (sync and async: StepInFlightError naming the child's pid), commits nothing,
    sends nothing. Once the child is killed (a zombie, not yet reaped), the table decides:
    reconcile (not found), resubmit; the payment is applied once."""
    child, root, ledger = child_sending
    store = castore.Store.open(root)
    run = store.resume(TASK, PLAN, lock_timeout=None)
    head = run.head_id
    for verb in ("perform", "settle", "reconcile"):
        with pytest.raises(castore.StepInFlightError, match=f"worker pid {child.pid} on this"):
            attempt(verb, run, ledger)()
    with pytest.raises(castore.StepInFlightError, match="resolving effect 'pay' as not done"):
        store.resolve(TASK, "pay", not_done=True, reason="looks lost", who="ops")

    async def async_perform() -> str:
        async with AsyncStore(root) as astore:
            arun = await astore.resume(TASK, PLAN, lock_timeout=None)
            try:
                return await arun.perform("pay", ledger.service(), ledger.apply)
            finally:
                await arun.close(finish=False)

    with pytest.raises(castore.StepInFlightError) as refused:
        asyncio.run(async_perform())
    assert (child.pid, head, []) == (refused.value.pid, run.head_id, ledger.applied())
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, left a zombie
    assert "receipt-1" == run.perform("pay", ledger.service(), ledger.apply)
    assert 1 == len(ledger.applied())
    run.close()


def test_a_person_may_resolve_not_done_once_the_live_submitter_s_send_has_ended(
    child_sending: tuple[subprocess.Popen[str], Path, FileLedger],
) -> None:
    """While the submitting process lives, `resolve --not-done` is refused; a person who
    knows its send has ended says so (`submitter_ended`) and the NOT_DONE is committed. The
    refusal's advice names that flag."""
    child, root, _ = child_sending
    store = castore.Store.open(root)
    with pytest.raises(castore.StepInFlightError, match="--submitter-ended"):
        store.resolve(TASK, "pay", not_done=True, reason="looks lost", who="ops")
    store.resolve(TASK, "pay", not_done=True, reason="ops checked", who="ops", submitter_ended=True)
    records = store.status(TASK).effects
    assert ["NOT_DONE"] == [record.state for record in records]
    child.kill()


# -- telling the submitter from a process that reused its pid ---------------------------------
def wall_ms() -> int:
    return time.time_ns() // 1_000_000


BOOT_S = 1_700_000_000
TICK = os.sysconf("SC_CLK_TCK")


def fake_proc(root: Path, pid: int, started_ms: int, state: str = "S") -> None:
    """A procfs with the boot time and process `pid`'s stat line (started `started_ms`)."""
    (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT_S}\nprocesses 9\n")
    ticks = (started_ms - BOOT_S * 1000) * TICK // 1000
    fields = [state, *["0"] * 18, str(ticks), "0", "0"]  # fields 3 to 24; 22 is the start
    (root / str(pid)).mkdir(exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (a (weird) name) {' '.join(fields)}\n")


@pytest.mark.parametrize(
    ("started_after_ms", "state", "expected"),
    [
        (-60_000, "S", True),  # started a minute before the submission: may be the submitter
        (500, "R", True),  # within the second the boot time's rounding blurs
        (5_000, "S", False),  # started after the submission: a reused pid
        (-60_000, "Z", False),  # a zombie runs nothing
    ],
)
def test_the_submitter_is_judged_by_its_start_time(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    started_after_ms: int,
    state: str,
    expected: bool,
) -> None:
    """A live pid is the submitter unless it started after the submission (its pid was
    reused) or is a zombie (procfs's start time against boot time, a command name with
    spaces and parentheses read right)."""
    submitted = BOOT_S * 1000 + 3_600_000
    fake_proc(tmp_path, os.getpid(), submitted + started_after_ms, state)
    monkeypatch.setattr(inflight, "PROC", str(tmp_path))
    assert expected == inflight.submitter_runs(os.getpid(), submitted)


def test_a_pid_procfs_does_not_list_has_ended_and_no_procfs_trusts_the_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live pid whose procfs entry is gone has just ended (not the submitter); where there
    is no procfs at all, a live pid is taken for the submitter; pids 0 and -1 never are."""
    monkeypatch.setattr(inflight, "PROC", str(tmp_path))
    assert inflight.submitter_runs(os.getpid(), wall_ms())  # no procfs
    (tmp_path / "stat").write_text(f"btime {BOOT_S}\n")
    assert not inflight.submitter_runs(os.getpid(), wall_ms())  # procfs, but no entry
    assert (False, False) == (inflight.submitter_runs(0, 0), inflight.submitter_runs(-1, 0))


def test_a_real_process_started_after_the_submission_is_not_the_submitter() -> None:
    """A real live process: the submitter of a submission made after it started, not of one
    made a minute before; once it has exited and been reaped, of none."""
    before = wall_ms()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        after = wall_ms()
        assert inflight.submitter_runs(child.pid, after)
        assert not inflight.submitter_runs(child.pid, before - 60_000)
    finally:
        child.kill()
        child.wait(DEADLINE_S)
    assert not inflight.submitter_runs(child.pid, after)
