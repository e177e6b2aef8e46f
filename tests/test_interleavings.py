"""Every order of the named points of two or three actors, for small histories (issue 23):
writers with and without a lock, a run's sealer, gc, forget, a reader. After each order: no
acknowledged commit unreadable, no effect applied twice (by the lab service's own ledger), no
commit made by a reader, fsck without errors, every task resumes or is cleanly forgotten.

The harness is tests/interleave.py. Each scenario's self-test puts back a mutable pointer
replaced in place (the sealed mark as one file written by rename, the way castore kept it
before issue 23) and must then find an order that breaks a rule.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import selectors
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from interleave import Exploration, Failure, Scheduler, Trace, explore, unexpected

import castore
import castore.aio
import castore.maintenance.fsck
import castore.run.inflight
import castore.store
from castore.chain import sealmark
from castore.chain.refs import TaskSlots
from castore.chain.seal import Sealer
from castore.errors import CastoreError, ConflictError, StepInFlightError, TaskForgottenError
from castore.format.layout import LEGACY_MARK_NAME
from castore.lab.service.ledger import Ledger, applied_counts
from castore.maintenance.gc import collect

TASK = "job"
# A lost race, a task forgotten under a writer, a send another run of the process still makes.
EXPECTED = (ConflictError, TaskForgottenError, StepInFlightError)


@attrs.define
class World:
    """One run's store and outside world: the lab ledger (what the service applied), and who
    got which commit acknowledged."""

    root: Path
    store: castore.Store
    ledger: Ledger
    scheduler: Scheduler
    acks: list[tuple[str, str, int, str]] = attrs.field(factory=list)  # actor, task, seq, id
    reader_commits: list[str] = attrs.field(factory=list)

    def actor(self) -> str:
        return self.scheduler.current() or "main"

    def service(self) -> castore.Service:
        """A payment service that can be asked about a key (reconcile)."""

        def lookup(key: str) -> castore.Reconciled:
            for entry in self.ledger.entries:
                if entry["key"] == key:
                    return castore.found(str(entry["receipt"]))
            return castore.NOT_FOUND

        return castore.Service("payments", reconcile=lookup)

    def send(self, key: str) -> str:
        """The request itself: the service applies it and records it in its ledger."""
        receipt = f"ch_{len(self.ledger.entries) + 1}"
        self.ledger.append(
            {"seq": len(self.ledger.entries), "key": key, "receipt": receipt, "time": 0}
        )
        return receipt


_counter = itertools.count()


@pytest.fixture
def worlds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[Scheduler], World]]:
    """A fresh World per run; commits are recorded as acknowledged when TaskSlots.commit
    returns, and a commit made by an actor named `reader…` is recorded as a reader's."""
    current: list[World] = []
    real_commit = TaskSlots.commit

    def commit(self: TaskSlots, data: bytes, seq: int, *args: object, **kwargs: object) -> str:
        world = current[-1]
        if world.actor().startswith("reader"):
            world.reader_commits.append(f"{world.actor()}: seq {seq} of {self.task_id}")
        made = real_commit(self, data, seq, *args, **kwargs)  # type: ignore[arg-type]
        world.acks.append((world.actor(), self.task_id, seq, made))
        return made

    monkeypatch.setattr(TaskSlots, "commit", commit)

    # Thousands of small stores: in memory where the machine has a tmpfs (fsync is free
    # there, and what is checked is the order of operations, not durability).
    base = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.path.isdir("/dev/shm") else tmp_path

    def make(scheduler: Scheduler) -> World:
        if current:  # the run before is checked: only the newest is kept, to look at
            current[-1].ledger.close()
            shutil.rmtree(current[-1].root)
        root = base / f"run{next(_counter)}"
        root.mkdir()
        world = World(root, castore.Store.init(root / "store"), Ledger(root / "ledger"), scheduler)
        current.append(world)
        return world

    yield make
    current[-1].ledger.close()
    if base != tmp_path:
        shutil.rmtree(base)


def inline_sealing(
    monkeypatch: pytest.MonkeyPatch, world_of: Callable[[], World], *names: str
) -> None:
    """The sealers of the named actors run their jobs in the actor's own thread (fewer actors,
    fewer orders; the actor's sealing is then one step of its commit)."""
    real = Sealer._submit

    def submit(self: Sealer, job: Callable[[], None]) -> None:
        if world_of().actor() in names:
            try:
                if self.error is None:
                    job()
            except (CastoreError, OSError) as exc:
                self.error = exc
            return
        real(self, job)

    monkeypatch.setattr(Sealer, "_submit", submit)


# -- the checks after every order ------------------------------------------------------------
def check_world(
    world: World, trace: Trace, *, expected: tuple[type[BaseException], ...] = EXPECTED
) -> list[str]:
    problems = unexpected(trace, expected)
    twice = {key: n for key, n in applied_counts(world.ledger.path).items() if n > 1}
    if twice:
        problems.append(f"effects applied more than once (the service's ledger): {twice}")
    problems += [f"a reader committed: {what}" for what in world.reader_commits]
    store = castore.Store.open(world.store.root)
    for task in store.tasks():
        problems += _check_task(store, world, task)
    summary = castore.maintenance.fsck.Summary()
    errors = [
        f"fsck {f.code} {f.path}: {f.message}"
        for f in castore.maintenance.fsck.check_store(world.store.root, jobs=1, summary=summary)
        if f.severity.value == "error"
    ]
    return problems + errors


def _check_task(store: castore.Store, world: World, task: str) -> list[str]:
    """The task resumes (its chain verifies) with every acknowledged commit in it, or it is
    forgotten, with every acknowledged commit at or below its tombstone."""
    acked = {(seq, made) for _, t, seq, made in world.acks if t == task}
    status = store.status(task)
    if status.forgotten:
        if status.seq is None:
            return [f"task {task}: forgotten, but status shows no HEAD"]
        late = sorted(seq for seq, _ in acked if seq > status.seq)
        return [f"task {task}: acknowledged commits above its tombstone: {late}"] if late else []
    try:
        history = {(snap.seq, made) for made, snap in store.history(task)}
    except CastoreError as exc:
        return [f"task {task}: does not verify: {exc}"]
    lost = sorted(acked - history)
    return [f"task {task}: acknowledged commits not in its chain: {lost}"] if lost else []


# -- the self-test's mutant: the mark as one file replaced in place ---------------------------
class ReplacedMark(sealmark.TaskMarks):
    """The mark as castore kept it before issue 23: one file, read, then replaced by rename
    if the writer is ahead of what it read (the read and the write are not one step)."""

    def _key(self) -> str:
        return f"{self.task_key}/{LEGACY_MARK_NAME}"

    def current(self) -> sealmark.Mark | None:
        return sealmark.read_file(self.medium, self.task_id, self._key())

    def advance(self, want: sealmark.Mark) -> sealmark.Mark:
        mark = self.current()
        if mark is not None and mark.through >= want.through:
            return mark
        castore.crashpoints.reach("mark.before_write")
        self.medium.replace(self._key(), want.encode())
        castore.crashpoints.reach("mark.written")
        return want


def replace_marks_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sealmark, "TaskMarks", ReplacedMark)


BROKEN = ("does not verify", "acknowledged commits", "fsck slot-gap")


def breaks_a_chain(failure: Failure) -> bool:
    """A failure a regressed mark makes: a task that no longer verifies, an acknowledged
    commit not in its chain, a slot gap fsck sees."""
    return any(m in p for p in failure.problems for m in BROKEN)


def broken_chains(found: Exploration) -> list[Failure]:
    return [f for f in found.failures if breaks_a_chain(f)]


def report(found: Exploration) -> str:
    shown = "\n".join(f"- {f.schedule}\n  {f.problems}" for f in found.failures[:3])
    return f"{found.summary()}\n{shown}"


# -- scenario 1: two writers without a shared lock, one sealer stalled ------------------------
PAY_PLAN = castore.Plan.build("pay", "s0", "s1", "s2", castore.effect("pay", "s2"), "s4", "s5")
# A's commits and its sealer's mark write are steps; B (which seals in its own thread) is one.
STALLED_SEALER = {
    "a": frozenset({"commit.done"}),
    "a.1": frozenset({"mark.before_write"}),
    "b": frozenset(),
}


def stalled_sealer(
    monkeypatch: pytest.MonkeyPatch, worlds: Callable[[Scheduler], World]
) -> Callable[[Scheduler], Callable[[Trace], list[str]]]:
    """Writer A (no lock) commits s0, s1, s2 and pays, its sealer a thread of its own; writer B
    (no lock) resumes the task, pays, commits s4, s5. Both seal every 2 commits. A payment
    the other writer may still be sending is refused (StepInFlightError), never reconciled."""
    holder: list[World] = []
    inline_sealing(monkeypatch, lambda: holder[-1], "b")
    monkeypatch.setattr(castore.store, "SEAL_EVERY", 2)

    def scenario(scheduler: Scheduler) -> Callable[[Trace], list[str]]:
        world = worlds(scheduler)
        holder.append(world)
        store, service = world.store, world.service()
        store.start(TASK, PAY_PLAN, lock_timeout=None).close()

        def writer_a() -> None:
            run = store.resume(TASK, PAY_PLAN, lock_timeout=None)
            try:
                for step in run.pending():
                    if step == "pay":
                        run.perform("pay", service, world.send)
                        break
                    run.commit_step(step, 1)
            finally:
                run.close(finish=False)

        def writer_b() -> None:
            run = store.resume(TASK, PAY_PLAN, lock_timeout=None)
            try:
                for step in run.pending():
                    if step == "pay":
                        run.perform("pay", service, world.send)
                    else:
                        run.commit_step(step, 2)
            finally:
                run.close(finish=False)

        scheduler.spawn("a", writer_a)
        scheduler.spawn("b", writer_b)
        return lambda trace: check_world(world, trace)

    return scenario


def test_two_writers_and_a_stalled_sealer_every_order(
    monkeypatch: pytest.MonkeyPatch, worlds: Callable[[Scheduler], World]
) -> None:
    """A sealer paused between reading the mark and moving it, while the other writer seals
    and prunes further: in no order is a payment applied twice or a commit lost."""
    found = explore(stalled_sealer(monkeypatch, worlds), STALLED_SEALER)
    print(f"\ntwo writers, stalled sealer: {found.summary()}")
    assert [] == found.failures, report(found)
    assert found.runs > 10


def test_self_test_a_mark_replaced_in_place_pays_twice(
    monkeypatch: pytest.MonkeyPatch, worlds: Callable[[Scheduler], World]
) -> None:
    """Self-test: with the mark one file replaced by rename, some order moves it back, a stale
    writer's link into a pruned slot is acknowledged, and the payment is applied twice."""
    replace_marks_in_place(monkeypatch)
    found = explore(stalled_sealer(monkeypatch, worlds), STALLED_SEALER, stop_when=breaks_a_chain)
    assert broken_chains(found), report(found)


# -- scenario 2: a live run's sealer, forget and gc's reclaim ---------------------------------
PLAIN_PLAN = castore.Plan.build("plain", *(f"s{i}" for i in range(6)))
FORGET_GC = {
    "w": frozenset({"commit.done"}),
    "w.1": frozenset({"mark.before_write"}),
    "forget": frozenset(),
    "gc": frozenset({"mark.before_write", "reclaim.marked"}),
}


def forget_during_seal(
    worlds: Callable[[Scheduler], World],
) -> Callable[[Scheduler], Callable[[Trace], list[str]]]:
    """Writer w (no lock) commits three steps, its sealer a thread; `forget` forgets the task
    (forced: an effect may not be open, but the writer does not know it is being ended); gc
    reclaims with no grace. After them all, one more gc: the task must end reclaimed."""

    def scenario(scheduler: Scheduler) -> Callable[[Trace], list[str]]:
        world = worlds(scheduler)
        store = world.store
        store.start(TASK, PLAIN_PLAN, lock_timeout=None).close()

        def writer() -> None:
            run = store.resume(TASK, PLAIN_PLAN, lock_timeout=None)
            try:
                for step in ("s0", "s1", "s2"):
                    run.commit_step(step, 1)
            finally:
                run.close(finish=False)

        scheduler.spawn("w", writer)
        scheduler.spawn("forget", lambda: store.forget(TASK, who="ops", why="done"))
        scheduler.spawn("gc", lambda: collect(store.root, grace_s=0))

        def check(trace: Trace) -> list[str]:
            problems = check_world(world, trace)
            if problems:
                return problems
            collect(store.root, grace_s=0)
            slots = TaskSlots(store.medium, store.objects, TASK)
            status = store.status(TASK)
            if not status.forgotten or status.seq is None:
                return [f"after a last gc: not a forgotten task: {status}"]
            if [status.seq] != slots.present():
                return [f"after a last gc: slots {slots.present()} left, not the tombstone's alone"]
            return check_world(world, trace)

        return check

    return scenario


def test_forget_and_gc_racing_a_live_sealer_every_order(
    monkeypatch: pytest.MonkeyPatch, worlds: Callable[[Scheduler], World]
) -> None:
    """A sealer paused between reading the mark and moving it while the task is forgotten and
    gc reclaims it: in no order is the task left broken, and the next gc reclaims it."""
    monkeypatch.setattr(castore.store, "SEAL_EVERY", 2)
    found = explore(forget_during_seal(worlds), FORGET_GC)
    print(f"\nforget and gc racing a sealer: {found.summary()}")
    assert [] == found.failures, report(found)
    assert found.runs > 10


def test_self_test_a_mark_replaced_in_place_breaks_a_forgotten_task(
    monkeypatch: pytest.MonkeyPatch, worlds: Callable[[Scheduler], World]
) -> None:
    """Self-test: with the mark one file replaced by rename, the sealer's older mark lands over
    gc's reclaim mark in some order, and the forgotten task no longer verifies."""
    monkeypatch.setattr(castore.store, "SEAL_EVERY", 2)
    replace_marks_in_place(monkeypatch)
    found = explore(forget_during_seal(worlds), FORGET_GC, stop_when=breaks_a_chain)
    assert broken_chains(found), report(found)


# -- scenario 3: gc's set-aside racing a commit that names a new blob -------------------------
GC_WRITER = {
    "w": frozenset({"commit.before_link", "commit.linked", "commit.done"}),
    "gc": frozenset({"gc.slots_read", "gc.set_aside", "gc.reread"}),
}


def gc_racing_a_writer(
    worlds: Callable[[Scheduler], World],
) -> Callable[[Scheduler], Callable[[Trace], list[str]]]:
    """Writer w stores a blob and commits it as s0's result; gc runs with no grace."""

    def scenario(scheduler: Scheduler) -> Callable[[Trace], list[str]]:
        world = worlds(scheduler)
        store = world.store
        store.start(TASK, PLAIN_PLAN, lock_timeout=None).close()

        def writer() -> None:
            with store.resume(TASK, PLAIN_PLAN, lock_timeout=None) as run:
                run.commit_step("s0", store.put_blob({"big": "x" * 64}))

        scheduler.spawn("w", writer)
        scheduler.spawn("gc", lambda: collect(store.root, grace_s=0))

        def check(trace: Trace) -> list[str]:
            problems = check_world(world, trace)
            with store.resume(TASK, PLAIN_PLAN) as run:
                if run.done("s0") and {"big": "x" * 64} != run.result("s0"):
                    problems.append("s0's blob does not read back")
            return problems

        return check

    return scenario


def test_gc_racing_a_commit_every_order(worlds: Callable[[Scheduler], World]) -> None:
    """gc's read of the slots, set-aside and re-read against a commit's link and its look for
    the objects it relies on: in no order does an acknowledged commit lose its blob."""
    found = explore(gc_racing_a_writer(worlds), GC_WRITER)
    print(f"\ngc racing a commit: {found.summary()}")
    assert [] == found.failures, report(found)
    assert found.runs > 10


# -- scenario 4: a LangGraph thread pruned while another saver reads it and a third puts --------
LG_PRUNE = {
    "pruner": frozenset(
        {"lgprune.intent", "lgprune.copy_started", "lgprune.copied", "commit.done"}
    ),
    "reader": frozenset(),
    "put": frozenset(),
}


def lg_prune(
    worlds: Callable[[Scheduler], World],
) -> Callable[[Scheduler], Callable[[Trace], list[str]]]:
    """Checkpoints 0, 1, 2 of thread p; `pruner` keeps the latest; `reader` (a saver of its
    own) reads the thread; `put` (another saver, which read the thread before) adds 3."""
    lg = pytest.importorskip("castore.langgraph")
    from langgraph.checkpoint.base import empty_checkpoint  # noqa: PLC0415 - behind the extra

    def put(saver: Any, n: int, parent: Any) -> Any:
        checkpoint = empty_checkpoint()
        versions = {"n": saver.get_next_version(None, None)}
        checkpoint["channel_values"] = {"n": n}
        checkpoint["channel_versions"] = versions
        metadata = {"source": "loop", "step": n, "parents": {}}
        return saver.put(parent, checkpoint, metadata, versions)

    def values(saver: Any) -> list[int]:
        return [t.checkpoint["channel_values"]["n"] for t in saver.list(THREAD)]

    def scenario(scheduler: Scheduler) -> Callable[[Trace], list[str]]:
        world = worlds(scheduler)
        root = world.store.root
        with lg.CastoreSaver(root) as saver:
            parent = THREAD
            for n in range(3):
                parent = put(saver, n, parent)
        putter = lg.CastoreSaver(root)
        putter.get_tuple(THREAD)  # it has read the thread: its put races the prune
        seen: list[list[int]] = []

        def prune() -> None:
            with lg.CastoreSaver(root) as pruning:
                pruning.prune(["p"])

        def read() -> None:
            with lg.CastoreSaver(root) as reading:
                seen.append(values(reading))

        def put_three() -> None:
            try:
                put(putter, 3, parent)
            finally:
                putter.close()

        scheduler.spawn("pruner", prune)
        scheduler.spawn("reader", read)
        scheduler.spawn("put", put_three)

        def check(trace: Trace) -> list[str]:
            problems = check_world(world, trace)
            with lg.CastoreSaver(root) as after:
                final = values(after)
            if "put" not in trace.errors and 3 not in final:
                problems.append(f"an acknowledged put is gone: the thread holds {final}")
            if final[:1] not in ([3], [2]):
                problems.append(f"the thread's latest is not the last put: {final}")
            if seen and seen[0] not in ([2, 1, 0], [2], [3, 2, 1, 0], [3, 2], [3]):
                problems.append(f"the reader saw {seen[0]}")
            return problems

        return check

    return scenario


THREAD: Any = {"configurable": {"thread_id": "p", "checkpoint_ns": ""}}


def test_a_langgraph_prune_a_reader_and_a_put_every_order(
    worlds: Callable[[Scheduler], World],
) -> None:
    """A prune (intent, copy, switch) against a reading saver and a racing put: in no order does
    the reader commit, an acknowledged put vanish, or the thread lose its latest checkpoint."""
    found = explore(lg_prune(worlds), LG_PRUNE)
    print(f"\nLangGraph prune, reader, put: {found.summary()}")
    assert [] == found.failures, report(found)
    assert found.runs > 10


def test_self_test_a_reader_that_repairs_is_caught(
    monkeypatch: pytest.MonkeyPatch, worlds: Callable[[Scheduler], World]
) -> None:
    """Self-test: a saver that, when it loads a thread, forgets every other started copy of the
    namespace as an interrupted prune (what castore.langgraph did before issue 23) commits
    from a read, and some order shows it."""
    generations = pytest.importorskip("castore.langgraph.generations")
    names = pytest.importorskip("castore.langgraph.names")
    real = generations.find_live

    def repairing(store: castore.Store, base: str) -> Any:
        live = real(store, base)
        for task in store.tasks():
            if (
                names.base_of(task) == base
                and task != live.task
                and not store.status(task).forgotten
            ):
                store.forget(task, who="reader", why="looks abandoned", force_in_flight=True)
        return live

    monkeypatch.setattr(generations, "find_live", repairing)
    found = explore(
        lg_prune(worlds), LG_PRUNE, stop_when=lambda f: any("a reader" in p for p in f.problems)
    )
    assert any("a reader committed" in p for f in found.failures for p in f.problems), report(found)


# -- scenario 5: an async perform cancelled while its sync send runs, then retried ------------
class HarnessSelector(selectors.DefaultSelector):
    """An event loop's selector whose wait for I/O is a castore wait point: the loop's thread
    goes on only once something it waits for is ready (a pool thread's answer), so the
    scheduler sees the loop block instead of losing it in select()."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout > 0:
            castore.crashpoints.wait(
                "loop.select", lambda: bool(super(HarnessSelector, self).select(0))
            )
        return super().select(timeout)


class ThreadPerJob(concurrent.futures.Executor):
    """A pool that runs each job in a thread of its own, which ends with the job: under the
    scheduler every such thread is an actor that starts and ends (no idle worker blocking
    where no point can see it)."""

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - the job's outcome, for its awaiter
                future.set_exception(exc)

        threading.Thread(target=job, name="pool-job", daemon=True).start()
        return future


PAY_ONCE = castore.Plan.build("pay-once", castore.effect("pay"))
ASYNC_CANCEL = {
    "loop": frozenset({"effect.submitted", "aio.in_flight_awaited"}),
    "*": frozenset({"lab.sending"}),
}


def async_cancel(
    worlds: Callable[[Scheduler], World],
) -> Callable[[Scheduler], Callable[[Trace], list[str]]]:
    """A coroutine performs the payment with a sync send (run in the pool); the caller cancels
    the await as soon as the send has started (a timeout), then performs again in the same run."""

    def scenario(scheduler: Scheduler) -> Callable[[Trace], list[str]]:
        world = worlds(scheduler)
        store, service = world.store, world.service()
        astore = castore.aio.AsyncStore(store)
        astore.pool.shutdown()
        astore.pool = ThreadPerJob()  # type: ignore[assignment]

        async def main(loop: asyncio.AbstractEventLoop) -> None:
            arun = await astore.open_task(TASK, PAY_ONCE, lock_timeout=None)
            started = asyncio.Event()

            def send(key: str) -> str:
                loop.call_soon_threadsafe(started.set)
                castore.crashpoints.reach("lab.sending")
                return world.send(key)

            first = asyncio.ensure_future(arun.perform("pay", service, send))
            await started.wait()
            first.cancel()  # the caller's timeout, while the send runs in its thread
            with contextlib.suppress(asyncio.CancelledError):
                await first
            await arun.perform("pay", service, send)
            await arun.close()

        def loop_actor() -> None:
            loop = asyncio.SelectorEventLoop(HarnessSelector())
            try:
                loop.run_until_complete(main(loop))
            finally:
                loop.close()

        scheduler.spawn("loop", loop_actor)

        def check(trace: Trace) -> list[str]:
            problems = check_world(world, trace)
            if problems:
                return problems
            status = store.status(TASK)
            if not status.finished:
                problems.append(f"the payment is not settled: {status.effects}")
            return problems

        return check

    return scenario


def test_an_async_perform_cancelled_mid_send_and_retried_every_order(
    worlds: Callable[[Scheduler], World],
) -> None:
    """The retry of a perform whose await was cancelled while its sync send ran: in no order
    of the send, the commits and the retry is the payment applied twice."""
    found = explore(async_cancel(worlds), ASYNC_CANCEL)
    print(f"\nasync cancel and retry: {found.summary()}")
    assert [] == found.failures, report(found)
    assert found.runs >= 2


def test_self_test_a_retry_that_does_not_wait_for_the_send_pays_twice(
    monkeypatch: pytest.MonkeyPatch, worlds: Callable[[Scheduler], World]
) -> None:
    """Self-test: a retry that reconciles at once, not waiting for the send its cancelled
    await left running (castore.aio before issue 23), pays twice in some order."""

    async def no_wait(self: Any, step_id: str | None) -> None:
        del self, step_id

    monkeypatch.setattr(castore.aio.AsyncRun, "wait_in_flight", no_wait)
    monkeypatch.setattr(castore.run.inflight, "refuse", lambda *args, **kwargs: None)
    found = explore(async_cancel(worlds), ASYNC_CANCEL, stop_at_first=True)
    assert any("more than once" in p for f in found.failures for p in f.problems), report(found)


# -- scenario 6: a writer holding the task lock and one without it ----------------------------
LOCKED_AND_NOT = {"*": frozenset({"commit.linked", "commit.done"})}


def locked_and_unlocked(
    worlds: Callable[[Scheduler], World],
) -> Callable[[Scheduler], Callable[[Trace], list[str]]]:
    """Writer `locked` holds the task lock (a worker of this host); `free` takes none (another
    host whose locks this one cannot see); both commit every step they can, racing."""

    def scenario(scheduler: Scheduler) -> Callable[[Trace], list[str]]:
        world = worlds(scheduler)
        store = world.store
        store.start(TASK, PLAIN_PLAN, lock_timeout=None).close()

        def writer(lock_timeout: float | None) -> Callable[[], None]:
            def body() -> None:
                with store.resume(TASK, PLAIN_PLAN, lock_timeout=lock_timeout) as run:
                    for step in run.pending():
                        run.commit_step(step, f"by {world.actor()}")

            return body

        scheduler.spawn("locked", writer(10.0))
        scheduler.spawn("free", writer(None))
        return lambda trace: check_world(world, trace)

    return scenario


def test_a_locked_and_an_unlocked_writer_every_order(worlds: Callable[[Scheduler], World]) -> None:
    """The lock is not what makes a commit safe: a writer that holds it and one that takes
    none, racing commit for commit, never both win a slot nor lose an acknowledged commit."""
    found = explore(locked_and_unlocked(worlds), LOCKED_AND_NOT)
    print(f"\nlocked and unlocked writers: {found.summary()}")
    assert [] == found.failures, report(found)
    assert found.runs > 10
