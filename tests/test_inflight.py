"""A send that may still run keeps its step in flight (castore.inflight): two runs of one task
without a lock in one process. Each send is held by an event the test controls, so the order
is fixed: no sleeps."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakeshop import DEADLINE_S, HeldSend, Ledger

import castore

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


def attempt(verb: str, run: castore.Run, ledger: Ledger) -> Callable[[], object]:
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
