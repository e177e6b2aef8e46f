"""Doing a decided step in the same run: the work `run.at` / `run.decide` prepared, and a
retry in place after a model call or a send raised. Both go by the next-action table, as a
reopen of the task would: a SUBMITTED effect is reconciled first, never sent blind."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fakeshop import Ledger

import castore
from castore import EffectState, Position
from castore.aio import AsyncRun, AsyncStore

TASK = "agent-1"
GROWING = castore.Plan.grow("agent-loop")


def pay_state(run: castore.Run) -> EffectState | None:
    record = run.head.effect("pay")
    return None if record is None else record.state


# -- item 6: the effect `at` / `decide` just decided ----------------------------------------
@pytest.mark.parametrize("verb", ["at", "decide"])
def test_perform_does_the_effect_at_just_decided(store: castore.Store, verb: str) -> None:
    """`run.at(step, effect=True)` (or `decide`) then `run.perform(step)`: sent once, done."""
    ledger = Ledger()
    with store.start(TASK, GROWING) as run:
        if verb == "at":
            assert Position.PENDING == run.at("pay", effect=True)
        else:
            run.decide("pay", effect=True)
        assert "receipt-1" == run.perform("pay", ledger.service(), ledger.apply)
        assert (True, 1, 1) == (run.done("pay"), len(ledger.applied), run.position)


def test_effect_block_does_the_effect_at_just_decided(store: castore.Store) -> None:
    """`run.at(step, effect=True)` then `with run.effect(step)`: submitted, confirmed once."""
    ledger = Ledger()
    with store.start(TASK, GROWING) as run:
        assert Position.PENDING == run.at("pay", effect=True)
        with run.effect("pay", ledger.service()) as call:
            call.confirm(ledger.apply(call.key))
        assert (True, 1, 1) == (run.done("pay"), len(ledger.applied), run.position)


def test_call_does_the_step_at_just_decided(store: castore.Store) -> None:
    """`run.at(step)` then `run.call(step, fn)`: fn runs once and its result is recorded."""
    with store.start(TASK, GROWING) as run:
        assert Position.PENDING == run.at("think")
        assert "go" == run.call("think", lambda: "go")
        assert (True, 1) == (run.done("think"), run.position)


def test_another_step_than_the_decided_one_is_still_refused(store: castore.Store) -> None:
    """After `at(a)`, performing another step `b` is refused: `a` is decided and not done."""
    ledger = Ledger()
    with store.start(TASK, GROWING) as run:
        run.at("a", effect=True)
        with pytest.raises(castore.UsageError, match="'a' at position 0 is decided and not"):
            run.perform("b", ledger.service(), ledger.apply)
        assert [] == ledger.sent


def test_the_decided_effect_asked_as_a_plain_call_is_drift(store: castore.Store) -> None:
    """An effect `at` decided, then run as a journaled call there, is drift, as on a reopen."""
    with store.start(TASK, GROWING) as run:
        run.at("pay", effect=True)
        with pytest.raises(castore.ReplayDriftError, match="an effect was recorded"):
            run.call("pay", lambda: "x")


@pytest.mark.asyncio
async def test_async_perform_and_effect_do_the_effect_at_just_decided(store: castore.Store) -> None:
    """The async `at` then `perform`, and `decide` then `async with effect`: each sent once."""
    ledger = Ledger()
    async with AsyncStore(store) as astore, await astore.open_task(TASK, GROWING) as arun:
        assert Position.PENDING == await arun.at("pay", effect=True)
        assert "receipt-1" == await arun.perform("pay", ledger.service(), ledger.apply)
        await arun.decide("pay-2", effect=True)
        async with arun.effect("pay-2", ledger.service()) as call:
            await call.confirm(ledger.apply(call.key))
        await arun.at("think")
        assert "go" == await arun.call("think", lambda: "go")
        assert (True, True, 3) == (arun.done("pay"), arun.done("pay-2"), arun.position)
    assert 2 == len(ledger.applied)


# -- item 7: a retry in place after the work raised ------------------------------------------
def test_call_retried_in_place_after_the_model_raised(store: castore.Store) -> None:
    """A journaled call whose function raised is called again in place and recorded once."""
    calls: list[str] = []

    def flaky(prompt: str) -> str:
        calls.append(prompt)
        if len(calls) == 1:
            raise TimeoutError("the model did not answer in time")
        return prompt.upper()

    with store.start(TASK, GROWING) as run:
        with pytest.raises(TimeoutError):
            run.call("think", flaky, "go")
        assert "GO" == run.call("think", flaky, "go")
        assert (["go", "go"], 1) == (calls, run.position)
    with store.resume(TASK, GROWING) as run:
        assert "GO" == run.call("think", flaky, "go")
    assert 2 == len(calls)


def test_call_retried_in_place_with_other_arguments_is_drift(store: castore.Store) -> None:
    """The retry of a decided call with other arguments is drift, as it is after a reopen."""

    def fails(prompt: str) -> str:
        raise TimeoutError(prompt)

    with store.start(TASK, GROWING) as run:
        with pytest.raises(TimeoutError):
            run.call("think", fails, "a")
        with pytest.raises(castore.ReplayDriftError, match="decided with arguments"):
            run.call("think", lambda prompt: prompt, "b")


def test_perform_retried_in_place_reconciles_before_sending(store: castore.Store) -> None:
    """A send that was applied and then lost its connection: the retry in place asks the
    service by key, finds it, and confirms it with that receipt; nothing is sent again."""
    ledger = Ledger()
    with store.start(TASK, GROWING) as run:
        with pytest.raises(ConnectionError):
            run.perform("pay", ledger.service(), ledger.send_then_drop)
        assert EffectState.SUBMITTED == pay_state(run)
        assert "receipt-1" == run.perform("pay", ledger.service(), ledger.apply)
        assert (1, 1, 1) == (len(ledger.sent), len(ledger.applied), run.position)


def test_perform_retried_in_place_resubmits_what_never_arrived(store: castore.Store) -> None:
    """A send that never reached the service: the retry reconciles (not found), then sends
    again with the same key; applied once."""
    ledger = Ledger()
    with store.start(TASK, GROWING) as run:
        with pytest.raises(ConnectionError):
            run.perform("pay", ledger.service(), ledger.drop_before)
        assert "receipt-1" == run.perform("pay", ledger.service(), ledger.apply)
    assert ([ledger.sent[0]] * 2, [ledger.sent[0]]) == (ledger.sent, ledger.applied)


def test_effect_block_retried_in_place_reconciles_before_its_body(store: castore.Store) -> None:
    """An effect block that raised after its request was applied: the block entered again
    in place finds it by key, and stops at its first use of `call.key`."""
    ledger = Ledger()
    with store.start(TASK, GROWING) as run:
        with pytest.raises(ConnectionError), run.effect("pay", ledger.service()) as call:
            ledger.send_then_drop(call.key)
        with run.effect("pay", ledger.service()) as again:
            again.confirm(ledger.apply(again.key))
        assert (True, "receipt-1", 1) == (again.done, again.receipt, len(ledger.applied))


AsyncSend = Callable[[str], Awaitable[str]]


def _async(send: Callable[[str], str]) -> AsyncSend:
    async def wrapped(key: str) -> str:
        return send(key)

    return wrapped


@pytest.mark.asyncio
@pytest.mark.parametrize("sync", [True, False], ids=["sync-fn", "async-fn"])
async def test_async_call_retried_in_place_after_the_model_raised(
    store: castore.Store, sync: bool
) -> None:
    """`AsyncRun.call` retried in place after its function raised: called again, recorded."""
    calls: list[str] = []

    def flaky(prompt: str) -> str:
        calls.append(prompt)
        if len(calls) == 1:
            raise TimeoutError("the model did not answer in time")
        return prompt.upper()

    fn: Any = flaky if sync else _async(flaky)
    async with AsyncStore(store) as astore, await astore.open_task(TASK, GROWING) as arun:
        with pytest.raises(TimeoutError):
            await arun.call("think", fn, "go")
        assert "GO" == await arun.call("think", fn, "go")
        assert (2, 1) == (len(calls), arun.position)


async def _effect_block(arun: AsyncRun, ledger: Ledger, send: Callable[[str], str]) -> str:
    async with arun.effect("pay", ledger.service()) as call:
        await call.confirm(send(call.key))
    return call.receipt or ""


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["perform", "effect"])
async def test_async_effect_retried_in_place_reconciles_before_sending(
    store: castore.Store, how: str
) -> None:
    """`AsyncRun.perform` and `async with arun.effect` retried in place after the request
    was applied and the connection dropped: found by key, confirmed, nothing sent again."""
    ledger = Ledger()
    async with AsyncStore(store) as astore, await astore.open_task(TASK, GROWING) as arun:

        async def attempt(send: Callable[[str], str]) -> str:
            if how == "perform":
                return await arun.perform("pay", ledger.service(), _async(send))
            return await _effect_block(arun, ledger, send)

        with pytest.raises(ConnectionError):
            await attempt(ledger.send_then_drop)
        assert EffectState.SUBMITTED == pay_state(arun.run)
        assert "receipt-1" == await attempt(ledger.apply)
        assert (1, 1, 1) == (len(ledger.sent), len(ledger.applied), arun.position)
