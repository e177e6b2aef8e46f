"""castore.aio: the sync store driven from asyncio. Commits are durable before the await
returns, file I/O stays off the loop, many agents commit concurrently, and a cancellation at
any await leaves the store consistent with every effect's state honest."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import castore
from castore import EffectState
from castore.aio import AsyncRun, AsyncStore
from castore.errors import TaskBusyError, UsageError
from castore.run.run import Run

TASK = "agent-1"
PLAN = castore.Plan.build("agent", "think", castore.effect("pay", "think"), "after")
IDEMPOTENT = castore.Service("payments", idempotent=True, retention=86400)
DEADLINE_S = 20.0


class Ledger:
    """A fake payment service: applies each key once (idempotent), counts every send."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.applied: dict[str, str] = {}

    def apply(self, key: str) -> str:
        self.sent.append(key)
        return self.applied.setdefault(key, f"receipt-{len(self.applied) + 1}")

    async def send(self, key: str) -> str:
        return self.apply(key)

    def lookup(self, key: str) -> castore.Reconciled:
        receipt = self.applied.get(key)
        return castore.NOT_FOUND if receipt is None else castore.found(receipt)


def on_disk(root: Path, task: str = TASK) -> tuple[str, castore.Snapshot]:
    """(HEAD id, HEAD) as a fresh reader of the store sees them."""
    chain = castore.Store.open(root).verify(task)
    return chain.head_id, chain.head


def pay_state(head: castore.Snapshot) -> EffectState | None:
    record = head.effect("pay")
    return None if record is None else record.state


@pytest.fixture
def root(store: castore.Store) -> Path:
    return Path(store.root)


async def agent_flow(arun: AsyncRun, ledger: Ledger) -> str:
    """The whole plan, written to be rerun as is after any interruption."""
    await arun.call("think", lambda: {"plan": "pay"})
    receipt = await arun.perform("pay", IDEMPOTENT, ledger.send)
    if not arun.done("after"):
        await arun.commit_step("after", {"receipt": receipt})
    return receipt


@pytest.mark.asyncio
async def test_each_commit_is_durable_before_its_await_returns(root: Path) -> None:
    """When an awaited commit returns, a fresh reader of the store already sees it."""
    ledger = Ledger()
    async with AsyncStore(root) as astore:
        arun = await astore.open_task(TASK, PLAN)
        assert {"plan": "ok"} == await arun.call("think", lambda: {"plan": "ok"})
        assert "pay" == on_disk(root)[1].frontier.step
        receipt = await arun.perform("pay", IDEMPOTENT, ledger.send)
        assert ("after", receipt) == (on_disk(root)[1].frontier.step, arun.receipt("pay"))
        await arun.commit_step("after", {"n": 1})
        assert (arun.run.head_id, None) == (on_disk(root)[0], on_disk(root)[1].frontier.step)
        await arun.close()
    assert [receipt] == list(ledger.applied.values())


@pytest.fixture
def io_threads(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads that opened or fsynced a file while the test ran."""
    seen: set[int] = set()
    real_fsync, real_open = os.fsync, os.open

    def fsync(fd: int) -> None:
        seen.add(threading.get_ident())
        real_fsync(fd)

    def open_(*args: Any, **kwargs: Any) -> int:
        seen.add(threading.get_ident())
        return real_open(*args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "open", open_)
    return seen


@pytest.mark.asyncio
async def test_file_io_never_runs_on_the_loop(root: Path, io_threads: set[int]) -> None:
    """Opening, calls, effects, commits and close do every open and fsync in the pool."""
    loop_thread = threading.get_ident()
    async with AsyncStore(root) as astore:
        async with await astore.open_task(TASK, PLAN) as arun:
            await agent_flow(arun, Ledger())
            await arun.result("after")
        seen = set(io_threads)
    assert seen
    assert loop_thread not in seen


@pytest.mark.asyncio
async def test_fifty_agents_in_one_loop_commit_concurrently(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 agents in one loop, each on its own task, commit at the same time; all verify."""
    plan = castore.Plan.build("loop", "s1", "s2", "s3", "s4")
    inside, most, lock = [0], [0], threading.Lock()
    overlapped = threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            first = most[0] == 1
            if inside[0] > 1:
                overlapped.set()
        if first:  # the first one waits (with a deadline) for another agent to get in too
            overlapped.wait(DEADLINE_S)
        try:
            real_fsync(fd)
        finally:
            with lock:
                inside[0] -= 1

    async def think(n: int, step: str) -> str:
        return f"{n}:{step}"

    async def agent(astore: AsyncStore, n: int) -> None:
        async with await astore.open_task(f"agent-{n}", plan) as arun:
            for index, step in enumerate(("s1", "s2", "s3", "s4")):
                fn: Callable[..., Any] = think if index % 2 else (lambda n, s: f"{n}:{s}")
                await arun.call(step, fn, n, step)

    monkeypatch.setattr(os, "fsync", fsync)
    async with AsyncStore(root) as astore:
        await asyncio.gather(*(agent(astore, n) for n in range(50)))
    monkeypatch.undo()
    assert most[0] >= 2
    store = castore.Store.open(root)
    for n in range(50):
        with store.resume(f"agent-{n}", plan) as run:
            assert (True, f"{n}:s4") == (run.finished, run.result("s4"))


# How long a commit's thread watches for its cancelled task ending early (it must not).
PROBE_S = 0.3


class CancelAtCommit:
    """Cancel the task driving a run at the `nth` commit of any run, while the commit's
    thread is still running (before or after the commit point), and note whether the task
    got to end before that thread did (it must not: its run would not know its HEAD)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, nth: int, after: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.nth, self.after, self.count = nth, after, 0
        self.task: asyncio.Task[Any] | None = None
        self.ended_early: bool | None = None
        self.task_ended = threading.Event()
        real = Run.advance

        def advance(run: Run, *args: Any, **kwargs: Any) -> str:
            self.count += 1
            if self.count == self.nth and not self.after:
                self.cancel_now()
            snapshot_id = real(run, *args, **kwargs)
            if self.count == self.nth and self.after:
                self.cancel_now()
            if self.count == self.nth:
                self.ended_early = self.task_ended.wait(PROBE_S)
            return snapshot_id

        monkeypatch.setattr(Run, "advance", advance)

    def drive(self, work: Any) -> asyncio.Task[Any]:
        self.task = asyncio.create_task(work)
        self.task.add_done_callback(lambda _: self.task_ended.set())
        return self.task

    def cancel_now(self) -> None:
        delivered = threading.Event()

        def cancel() -> None:
            assert self.task is not None
            self.task.cancel()
            self.loop.call_soon(delivered.set)  # after the task has seen its CancelledError

        self.loop.call_soon_threadsafe(cancel)
        assert delivered.wait(DEADLINE_S)


@pytest.mark.asyncio
@pytest.mark.parametrize("after", [False, True], ids=["in-commit", "after-commit"])
@pytest.mark.parametrize("nth", [1, 2, 3, 4])
async def test_cancel_at_each_commit_then_resume(
    root: Path, monkeypatch: pytest.MonkeyPatch, nth: int, after: bool
) -> None:
    """Cancelled at any commit: the run's HEAD is the store's, a sent payment is never
    PLANNED, and rerunning the same code finishes with the payment applied once."""
    ledger = Ledger()
    probe = CancelAtCommit(monkeypatch, nth, after)
    async with AsyncStore(root) as astore:
        arun = await astore.open_task(TASK, PLAN)
        with pytest.raises(asyncio.CancelledError):
            await probe.drive(agent_flow(arun, ledger))
        assert False is probe.ended_early
        head_id, head = on_disk(root)
        assert head_id == arun.run.head_id
        if ledger.sent:
            assert pay_state(head) in (EffectState.SUBMITTED, None)
        await arun.close(finish=False)
        monkeypatch.undo()
        async with await astore.resume(TASK, PLAN) as arun:
            receipt = await agent_flow(arun, ledger)
    assert {ledger.sent[0]: receipt} == ledger.applied
    assert on_disk(root)[1].frontier.step is None


GROWING = castore.Plan.grow("agent-loop")


async def growing_flow(arun: AsyncRun, ledger: Ledger) -> str:
    """An agent loop on a growing plan, rerun from the top after any interruption."""

    async def model(prompt: str) -> str:
        return prompt.upper()

    answer = await arun.call("think", model, "pay 5")
    receipt = await arun.perform("pay", IDEMPOTENT, ledger.send)
    await arun.append("log", {"answer": answer, "receipt": receipt})
    await arun.finish()
    return receipt


@pytest.mark.asyncio
@pytest.mark.parametrize("after", [False, True], ids=["in-commit", "after-commit"])
@pytest.mark.parametrize("nth", [1, 2, 3, 4, 5, 6, 7])
async def test_growing_loop_cancelled_at_each_commit_then_rerun(
    root: Path, monkeypatch: pytest.MonkeyPatch, nth: int, after: bool
) -> None:
    """A growing agent loop cancelled at any of its commits (decide, step, submit, confirm,
    append, finish), rerun from the top: one payment, finished, HEAD always the store's."""
    ledger = Ledger()
    probe = CancelAtCommit(monkeypatch, nth, after)
    async with AsyncStore(root) as astore:
        arun = await astore.open_task(TASK, GROWING)
        with pytest.raises(asyncio.CancelledError):
            await probe.drive(growing_flow(arun, ledger))
        assert False is probe.ended_early
        head_id, head = on_disk(root)
        assert head_id == arun.run.head_id
        if ledger.sent:
            assert pay_state(head) in (EffectState.SUBMITTED, None)
        await arun.close(finish=False)
        monkeypatch.undo()
        async with await astore.resume(TASK, GROWING) as arun:
            receipt = await growing_flow(arun, ledger)
            assert arun.finished
    assert {ledger.sent[0]: receipt} == ledger.applied


@pytest.mark.asyncio
async def test_async_replay_with_other_arguments_is_drift(root: Path) -> None:
    """An async call replayed with other arguments at a done position is drift."""
    async with AsyncStore(root) as astore:
        async with await astore.open_task(TASK, GROWING) as arun:
            await arun.call("think", lambda prompt: prompt, "a")
        async with await astore.resume(TASK, GROWING) as arun:
            with pytest.raises(castore.PlanDriftError, match=r"position 0"):
                await arun.call("think", lambda prompt: prompt, "b")
            await arun.close(finish=False)


@pytest.mark.asyncio
async def test_growing_effect_block_decides_then_submits(root: Path) -> None:
    """On a growing plan `async with arun.effect(...)` decides the step (its key durable)
    and submits it before the body runs; rerun, the done effect skips its body."""
    ledger = Ledger()
    async with AsyncStore(root) as astore:
        async with await astore.open_task(TASK, GROWING) as arun:
            async with arun.effect("pay", IDEMPOTENT) as call:
                head = on_disk(root)[1]
                assert ("pay", EffectState.SUBMITTED) == (head.frontier.step, pay_state(head))
                await call.confirm(await ledger.send(call.key))
            await arun.finish()
        async with await astore.resume(TASK, GROWING) as arun:
            async with arun.effect("pay", IDEMPOTENT) as again:
                await ledger.send(again.key)
            assert (True, 1) == (again.done, len(ledger.sent))


@pytest.mark.asyncio
async def test_cancelled_open_releases_the_task_lock(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its start runs: the task is created, and the run made for it is
    closed (its lock released), so the next open succeeds at once."""
    probe = CancelAtCommit(monkeypatch, nth=0, after=False)
    real_start = castore.Store.start

    def start(store: castore.Store, *args: Any, **kwargs: Any) -> Run:
        probe.cancel_now()
        return real_start(store, *args, **kwargs)

    monkeypatch.setattr(castore.Store, "start", start)
    async with AsyncStore(root) as astore:
        with pytest.raises(asyncio.CancelledError):
            await probe.drive(astore.start(TASK, PLAN))
        monkeypatch.undo()
        async with await astore.open_task(TASK, PLAN, lock_timeout=0.5) as arun:
            assert (0, "think") == (arun.head.seq, arun.next_step)


@pytest.mark.asyncio
async def test_send_that_never_returns_times_out_submitted_and_resume_reconciles(
    root: Path,
) -> None:
    """A hung send is cancelled by the caller's timeout; the effect stays SUBMITTED and a
    resume finds it by key, without sending again."""
    ledger = Ledger()
    service = castore.Service("payments", reconcile=ledger.lookup)
    never = asyncio.Event()

    async def hang(key: str) -> str:
        ledger.apply(key)  # the request reached the service; its answer never comes back
        await never.wait()
        return "unreachable"

    async with AsyncStore(root) as astore:
        async with await astore.open_task(TASK, PLAN) as arun:
            await arun.call("think", lambda: "go")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(arun.perform("pay", service, hang), 0.5)
            assert EffectState.SUBMITTED == pay_state(on_disk(root)[1])
        async with await astore.resume(TASK, PLAN) as arun:
            receipt = await arun.perform("pay", service, ledger.send)
    assert (1, "receipt-1") == (len(ledger.sent), receipt)


@pytest.mark.asyncio
async def test_cancelled_async_call_records_nothing(root: Path) -> None:
    """A journaled call cancelled while its function runs commits nothing; it runs again."""
    never = asyncio.Event()

    async def slow_model() -> str:
        await never.wait()
        return "unreachable"

    async with AsyncStore(root) as astore, await astore.open_task(TASK, PLAN) as arun:
        seq = arun.head.seq
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(arun.call("think", slow_model), 0.2)
        assert (seq, False) == (on_disk(root)[1].seq, arun.done("think"))
        assert "second" == await arun.call("think", lambda: "second")


@pytest.mark.asyncio
async def test_replayed_call_does_not_call_again(root: Path) -> None:
    """An async call done before a restart returns the recorded result, uncalled."""
    calls: list[str] = []

    async def model(prompt: str) -> dict[str, str]:
        calls.append(prompt)
        return {"content": prompt[::-1]}

    async with AsyncStore(root) as astore:
        async with await astore.open_task(TASK, PLAN) as arun:
            assert {"content": "olleh"} == await arun.call("think", model, "hello")
        async with await astore.resume(TASK, PLAN) as arun:
            assert {"content": "olleh"} == await arun.call("think", model, "hello")
    assert ["hello"] == calls


@pytest.mark.asyncio
async def test_sync_callable_runs_in_the_pool_and_vouch_works_async(root: Path) -> None:
    """A sync function runs off the loop; a vouched async function's result is recorded."""
    loop_thread = threading.get_ident()
    leaked = "sk-" + "a1b2c3d4" * 5

    async def model() -> dict[str, str]:
        return {"content": f"quote: {leaked}"}

    plan = castore.Plan.build("p", "a", "b")
    async with AsyncStore(root) as astore, await astore.open_task(TASK, plan) as arun:
        assert loop_thread != await arun.call("a", threading.get_ident)
        assert {"content": f"quote: {leaked}"} == await arun.call(
            "b", castore.vouch(model, "$.content")
        )


@pytest.mark.asyncio
async def test_second_coroutine_on_one_run_is_refused(root: Path) -> None:
    """While one coroutine is in a call, another's commit to the same run is refused."""
    started, release = asyncio.Event(), asyncio.Event()

    async def model() -> str:
        started.set()
        await release.wait()
        return "first"

    async with AsyncStore(root) as astore, await astore.open_task(TASK, PLAN) as arun:
        first = asyncio.create_task(arun.call("think", model))
        await asyncio.wait_for(started.wait(), DEADLINE_S)
        with pytest.raises(UsageError, match=r"one run has one driver"):
            await arun.commit_step("think", "second")
        release.set()
        assert "first" == await first
        assert "first" == await arun.result("think")


@pytest.mark.asyncio
async def test_second_thread_on_one_run_is_refused(root: Path) -> None:
    """Another thread (its own event loop) driving a busy run gets a UsageError."""
    started, release = asyncio.Event(), asyncio.Event()

    async def model() -> str:
        started.set()
        await release.wait()
        return "first"

    def other_loop(arun: AsyncRun) -> BaseException | None:
        try:
            asyncio.run(arun.commit_step("think", "second"))
        except UsageError as exc:
            return exc
        return None

    async with AsyncStore(root) as astore, await astore.open_task(TASK, PLAN) as arun:
        first = asyncio.create_task(arun.call("think", model))
        await asyncio.wait_for(started.wait(), DEADLINE_S)
        refused = await asyncio.to_thread(other_loop, arun)
        release.set()
        assert "first" == await first
    assert isinstance(refused, UsageError)


@pytest.mark.asyncio
async def test_two_runs_of_one_task_are_refused(root: Path) -> None:
    """A second open of a task held by a live run waits for the lock, then TaskBusyError."""
    async with AsyncStore(root) as astore, await astore.open_task(TASK, PLAN):
        with pytest.raises(TaskBusyError):
            await astore.open_task(TASK, PLAN, lock_timeout=0.2)


@pytest.mark.asyncio
async def test_effect_block_confirms_and_a_done_effect_skips_its_body(root: Path) -> None:
    """`async with arun.effect(...)` sends once; re-entered when done, it stops at call.key."""
    ledger = Ledger()
    async with AsyncStore(root) as astore, await astore.open_task(TASK, PLAN) as arun:
        await arun.call("think", lambda: 1)
        async with arun.effect("pay", IDEMPOTENT) as call:
            await call.confirm(await ledger.send(call.key))
        assert EffectState.SUBMITTED not in {r.state for r in on_disk(root)[1].effects}
        async with arun.effect("pay", IDEMPOTENT) as again:
            await ledger.send(again.key)
        assert again.done
    assert 1 == len(ledger.sent)


@pytest.mark.asyncio
async def test_cancel_in_effect_block_leaves_submitted_then_resubmits(root: Path) -> None:
    """Cancelled inside the block (the request may have left): SUBMITTED, and the rerun
    resubmits with the same key."""
    ledger = Ledger()
    never = asyncio.Event()

    async def body(arun: AsyncRun) -> None:
        async with arun.effect("pay", IDEMPOTENT) as call:
            ledger.apply(call.key)
            await never.wait()

    async with AsyncStore(root) as astore:
        async with await astore.open_task(TASK, PLAN) as arun:
            await arun.call("think", lambda: 1)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(body(arun), 0.2)
            assert EffectState.SUBMITTED == pay_state(on_disk(root)[1])
        async with await astore.resume(TASK, PLAN) as arun:
            receipt = await agent_flow(arun, ledger)
    assert [ledger.sent[0]] * 2 == ledger.sent
    assert {ledger.sent[0]: receipt} == ledger.applied


@pytest.mark.asyncio
async def test_resolve_and_settle_through_the_async_store(root: Path) -> None:
    """An outcome nobody knows is marked UNRESOLVED by settle, then a person resolves it."""
    blind = castore.Service("payments")  # neither idempotent nor a lookup
    async with AsyncStore(root) as astore:
        async with await astore.open_task(TASK, PLAN) as arun:
            await arun.call("think", lambda: 1)
            with pytest.raises(RuntimeError):
                await arun.perform("pay", blind, _refuse)
        async with await astore.resume(TASK, PLAN) as arun:
            action = await arun.settle(blind)
            assert castore.Action.ESCALATE == action.action
            await arun.close()
        await astore.resolve(TASK, "pay", receipt="by-hand", who="ops")
    assert None is pay_state(on_disk(root)[1])
    assert "after" == on_disk(root)[1].frontier.step


def _refuse(key: str) -> str:
    raise RuntimeError(f"connection reset sending {key}")


def test_async_store_needs_no_running_loop_to_build(root: Path) -> None:
    """Building an AsyncStore from a path touches nothing; the store opens on first use."""
    astore = AsyncStore(root / "missing")

    async def first_use() -> None:
        with pytest.raises(castore.StoreNotFoundError):
            await astore.store()
        await astore.close()

    asyncio.run(first_use())


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    """Every pool thread a test started has finished its work when the test ends."""
    yield
    for thread in threading.enumerate():
        if thread.name.startswith("castore-aio"):
            thread.join(DEADLINE_S)
            assert not thread.is_alive()


@pytest.mark.asyncio
async def test_the_async_brief_is_the_sync_brief(root: Path) -> None:
    """`AsyncStore.brief` and `AsyncRun.brief` give the very bytes the sync brief gives of the
    same state (the brief is deterministic), and name the step the run stands at."""
    ledger = Ledger()
    async with AsyncStore(root) as astore:
        arun = await astore.open_task(TASK, PLAN)
        await arun.call("think", lambda: {"plan": "pay"})
        from_run = await arun.brief()
        assert arun.run.brief().text == from_run.text
        assert "pay" == from_run.data["next"]["step"]
        await arun.perform("pay", IDEMPOTENT, ledger.send)
        await arun.close()
        from_store = await astore.brief(TASK)
    assert castore.Store.open(root).brief(TASK).text == from_store.text
    assert "after" == from_store.data["next"]["step"]
