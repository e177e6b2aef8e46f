"""castore.aio: a sync send or journaled call whose await was cancelled (a timeout) runs on in
its pool thread; until it returns its step is in flight. A retry in the same process waits for
it (so a reconcile asks a service that has seen the request), and the sync paths refuse. Each
first send is held inside its pool thread by an event until the retry has been attempted, so
the order is fixed: no sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeshop import DEADLINE_S, HeldSend, Ledger

import castore
from castore import EffectState, crashpoints
from castore.aio import AsyncRun, AsyncStore
from castore.run import inflight

TASK = "agent-1"
FIXED = castore.Plan.build("agent", castore.effect("pay"), "think")
GROWING = castore.Plan.grow("agent-loop")
PLANS = {"fixed": FIXED, "growing": GROWING}


@pytest.fixture
def held() -> Iterator[HeldSend]:
    send = HeldSend(Ledger())
    yield send
    send.release.set()  # a failed test leaves no pool thread waiting
    assert send.returned.wait(DEADLINE_S) or not send.entered.is_set()


async def until(event: threading.Event) -> None:
    """Wait for `event` off the loop (the pool threads it waits on must go on)."""
    assert await asyncio.to_thread(event.wait, DEADLINE_S)


async def cancelled_while_running(work: Awaitable[Any], entered: threading.Event) -> None:
    """Run `work`, cancel it once its sync function runs in the pool (as a timeout does)."""
    task = asyncio.ensure_future(work)
    await until(entered)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class Progress:
    """Set when the retry ends, or when it starts waiting for the held send (castore's named
    point `aio.in_flight_awaited`): the moment to let the held send go on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.event = threading.Event()
        self.waited = 0
        real = crashpoints.reach

        def reach(name: str) -> None:
            if name == "aio.in_flight_awaited":
                self.waited += 1
                self.event.set()
            real(name)

        monkeypatch.setattr(crashpoints, "reach", reach)

    def watch(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        task.add_done_callback(lambda _: self.event.set())
        return task


async def retried(arun: AsyncRun, verb: str, ledger: Ledger) -> Callable[[], Awaitable[object]]:
    """The retry of the effect by `verb`, as a coroutine function."""
    service = ledger.service()

    async def block() -> object:
        async with arun.effect("pay", service) as call:
            await call.confirm(ledger.apply(call.key))
        return call.receipt

    verbs: dict[str, Callable[[], Awaitable[object]]] = {
        "perform": lambda: arun.perform("pay", service, ledger.apply),
        "effect": block,
        "reconcile": lambda: arun.reconcile("pay", service),
        "settle": lambda: arun.settle(service),
    }
    return verbs[verb]


@pytest.mark.asyncio
@pytest.mark.parametrize("plan", ["fixed", "growing"])
@pytest.mark.parametrize("verb", ["perform", "effect", "reconcile", "settle"])
async def test_retry_after_a_timed_out_perform_waits_for_its_send(
    store: castore.Store,
    monkeypatch: pytest.MonkeyPatch,
    held: HeldSend,
    plan: str,
    verb: str,
) -> None:
    """A perform cancelled while its sync send runs, retried in the same run (perform,
    effect, reconcile or settle, then perform if not done): the retry waits for that send,
    finds it by key, and the payment is applied once."""
    ledger = held.ledger
    async with AsyncStore(store) as astore, await astore.open_task(TASK, PLANS[plan]) as arun:
        await cancelled_while_running(arun.perform("pay", ledger.service(), held), held.entered)
        assert EffectState.SUBMITTED == arun.run.head.effect("pay").state  # type: ignore[union-attr]
        progress = Progress(monkeypatch)
        retry = progress.watch((await retried(arun, verb, ledger))())
        await until(progress.event)
        held.release.set()
        await retry
        await until(held.returned)
        if not arun.done("pay"):  # reconcile or settle found nothing: the agent sends
            await arun.perform("pay", ledger.service(), ledger.apply)
        assert "receipt-1" == arun.receipt("pay")
    assert (1, 1) == (len(ledger.applied), progress.waited)
    assert [] == inflight.running(arun.run)


@pytest.mark.asyncio
async def test_a_run_opened_again_in_the_process_waits_too(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch, held: HeldSend
) -> None:
    """Timed out (an `asyncio.timeout` that expires once the send runs), the run closed and
    the task resumed in the same process without the lock (which the first run keeps while
    its send runs): its perform waits for the first send as well; applied once."""
    ledger = held.ledger

    async def timed_out_perform(arun: AsyncRun) -> None:
        async with asyncio.timeout(None) as timeout:
            expiry = asyncio.ensure_future(until(held.entered))
            expiry.add_done_callback(lambda _: timeout.reschedule(-1))  # expire now
            await arun.perform("pay", ledger.service(), held)

    async with AsyncStore(store) as astore:
        async with await astore.open_task(TASK, FIXED) as arun:
            with pytest.raises(TimeoutError):
                await timed_out_perform(arun)
        progress = Progress(monkeypatch)
        async with await astore.resume(TASK, FIXED, lock_timeout=None) as again:
            retry = progress.watch(again.perform("pay", ledger.service(), ledger.apply))
            await until(progress.event)
            held.release.set()
            assert "receipt-1" == await retry
    assert 1 == len(ledger.applied)


@pytest.mark.asyncio
async def test_resolving_not_done_is_refused_while_the_send_runs(
    store: castore.Store, held: HeldSend
) -> None:
    """A person's "not done" for an effect whose send still runs in this process is refused
    (nobody can know that yet), and commits nothing; "confirmed" is a person's to say. (The
    run takes no lock: one would keep the task, and the decision out, until the send ends.)"""
    ledger = held.ledger
    async with AsyncStore(store) as astore:
        async with await astore.open_task(TASK, FIXED, lock_timeout=None) as arun:
            work = arun.perform("pay", ledger.service(), held)
            await cancelled_while_running(work, held.entered)
        head = store.verify(TASK).head_id
        with pytest.raises(castore.StepInFlightError, match="resolving effect 'pay' as not"):
            await astore.resolve(TASK, "pay", not_done=True, reason="timed out", who="ops")
        assert head == store.verify(TASK).head_id
        await astore.resolve(TASK, "pay", receipt="by-hand", who="ops")
        held.release.set()
        await until(held.returned)
    assert ("by-hand", 1) == (store.verify(TASK).head.transition.receipt, len(ledger.applied))


@pytest.mark.asyncio
@pytest.mark.parametrize("plan", ["fixed", "growing"])
async def test_sync_paths_refuse_while_a_cancelled_send_runs(
    store: castore.Store, held: HeldSend, plan: str
) -> None:
    """While the cancelled perform's send runs, the sync perform, effect, reconcile and
    settle of the step are refused (StepInFlightError) and commit nothing; once it has
    returned, the sync perform finds it by key."""
    ledger = held.ledger
    service = ledger.service()
    async with AsyncStore(store) as astore, await astore.open_task(TASK, PLANS[plan]) as arun:
        await cancelled_while_running(arun.perform("pay", service, held), held.entered)
        run, head_id = arun.run, arun.run.head_id

        def block() -> None:
            with run.effect("pay", service) as call:
                call.confirm(ledger.apply(call.key))

        attempts: list[Callable[[], object]] = [
            lambda: run.perform("pay", service, ledger.apply),
            block,
            lambda: run.reconcile("pay", service),
            lambda: run.settle(service),
        ]
        for attempt in attempts:
            with pytest.raises(castore.StepInFlightError, match=r"'pay'.*still runs in a pool"):
                attempt()
        assert ([], head_id) == (ledger.applied, run.head_id)
        held.release.set()
        await until(held.returned)
        assert "receipt-1" == run.perform("pay", service, ledger.apply)
    assert 1 == len(ledger.applied)


class HeldModel:
    """A sync model call held in its pool thread until `release`; `overlap` counts calls
    that started while another was still running."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.running = 0
        self.overlap = 0
        self.calls = 0
        self.returned = threading.Event()  # a call returned (the first, in these tests)
        self._lock = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self._lock:
            self.calls += 1
            self.overlap += self.running
            self.running += 1
            nth = self.calls
        try:
            if nth == 1:
                self.entered.set()
                if not self.release.wait(DEADLINE_S):
                    raise TimeoutError("the test never released the held call")
            return f"{prompt}-{nth}"
        finally:
            with self._lock:
                self.running -= 1
            self.returned.set()


THINKING = {"fixed": castore.Plan.build("agent", "think"), "growing": GROWING}


@pytest.mark.asyncio
@pytest.mark.parametrize("plan", ["fixed", "growing"])
async def test_call_retried_after_a_timeout_waits_for_the_first_call(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch, plan: str
) -> None:
    """A journaled sync call cancelled while it runs, called again in the same run: the
    retry runs the model only after the first call returned, never two at once."""
    model = HeldModel()
    try:
        async with (
            AsyncStore(store) as astore,
            await astore.open_task(TASK, THINKING[plan]) as arun,
        ):
            await cancelled_while_running(arun.call("think", model, "go"), model.entered)
            progress = Progress(monkeypatch)
            retry = progress.watch(arun.call("think", model, "go"))
            await until(progress.event)
            model.release.set()
            assert ("go-2", "go-2") == (await retry, await arun.result("think"))
    finally:
        model.release.set()
    assert (2, 0, 1) == (model.calls, model.overlap, progress.waited)


@pytest.mark.asyncio
@pytest.mark.parametrize("plan", ["fixed", "growing"])
async def test_sync_call_refused_while_a_cancelled_call_runs(
    store: castore.Store, plan: str
) -> None:
    """While a cancelled journaled call still runs, the sync `run.call` of its step is
    refused (StepInFlightError) without calling the model; once it returned, it is called."""
    model = HeldModel()
    try:
        async with (
            AsyncStore(store) as astore,
            await astore.open_task(TASK, THINKING[plan]) as arun,
        ):
            await cancelled_while_running(arun.call("think", model, "go"), model.entered)
            with pytest.raises(castore.StepInFlightError, match="calling step 'think' again"):
                arun.run.call("think", model, "go")
            assert 1 == model.calls
            model.release.set()
            assert model.returned.wait(DEADLINE_S)
            assert "go-2" == arun.run.call("think", model, "go")
    finally:
        model.release.set()
    assert (2, 0) == (model.calls, model.overlap)


@pytest.mark.asyncio
async def test_a_cancelled_async_send_has_ended_and_is_not_waited_for(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An async send cancelled mid-request is over when the cancellation is: the retry waits
    for nothing, reconciles at once (not found) and sends with the same key."""
    ledger = Ledger()
    entered = threading.Event()
    never = asyncio.Event()

    async def hang(key: str) -> str:
        entered.set()
        await never.wait()
        return ledger.apply(key)

    async with AsyncStore(store) as astore, await astore.open_task(TASK, FIXED) as arun:
        await cancelled_while_running(arun.perform("pay", ledger.service(), hang), entered)
        assert [] == inflight.running(arun.run, "pay")
        progress = Progress(monkeypatch)
        assert "receipt-1" == await arun.perform("pay", ledger.service(), ledger.apply)
    assert (1, 0) == (len(ledger.applied), progress.waited)


@pytest.mark.asyncio
async def test_a_closed_run_keeps_its_lock_until_its_cancelled_send_returns(
    store: castore.Store, held: HeldSend
) -> None:
    """A run closed while the send its cancelled perform started still runs keeps the task
    lock: a resume with a lock times out (TaskBusyError) until the send has returned, then
    gets it and finds the payment by key; applied once."""
    ledger = held.ledger
    async with AsyncStore(store) as astore:
        async with await astore.open_task(TASK, FIXED) as arun:
            await cancelled_while_running(arun.perform("pay", ledger.service(), held), held.entered)
        with pytest.raises(castore.TaskBusyError):
            store.resume(TASK, FIXED, lock_timeout=0.2)
        held.release.set()
        with store.resume(TASK, FIXED, lock_timeout=DEADLINE_S) as run:  # at the send's end
            assert "receipt-1" == run.perform("pay", ledger.service(), ledger.apply)
    assert 1 == len(ledger.applied)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_second_run_in_the_process_waits_for_the_first_runs_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Two runs of one task in one process without a lock, on two stores of one path: the
    first commits SUBMITTED and its (sync or async) send is held; the second's perform waits
    for that send to end, then reconciles, finds it, and loses the race to the first's
    CONFIRMED (ConflictError): the payment is applied once."""
    root = tmp_path / "store"
    castore.Store.init(root)
    ledger = Ledger()
    held = HeldSend(ledger)

    async def held_async(key: str) -> str:
        held.entered.set()
        await until(held.release)
        return ledger.apply(key)

    send = held if kind == "sync" else held_async
    try:
        async with AsyncStore(root) as one, AsyncStore(root) as two:
            first = await one.open_task(TASK, FIXED, lock_timeout=None)
            sending = asyncio.ensure_future(first.perform("pay", ledger.service(), send))
            await until(held.entered)
            second = await two.resume(TASK, FIXED, lock_timeout=None)
            progress = Progress(monkeypatch)
            retry = progress.watch(second.perform("pay", ledger.service(), ledger.apply))
            await until(progress.event)
            held.release.set()
            ended = await asyncio.gather(sending, retry, return_exceptions=True)
            await first.close()
            await second.close(finish=False)
    finally:
        held.release.set()
    assert (1, 1) == (len(ledger.applied), progress.waited)
    assert ("receipt-1", castore.ConflictError) == (ended[0], type(ended[1]))
