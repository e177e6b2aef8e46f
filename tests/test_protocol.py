"""The side-effect protocol: every row of the next-action table, driven through real crashes.

A child process (a script this module writes, run with sys.executable) opens the task and
submits an effect against the lab service (a real process with a durable ledger) and is
SIGKILLed at a named crash point. The parent then resumes, checks `run.next_action()` is the
table's row, drives it, and judges by the service's own ledger file: never two applications.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import tree_snapshot

import castore
from castore import Action, EffectState
from castore.format.effects import ALLOWED, CLOCK_TOLERANCE_MS, check_transition
from castore.lab.service import (
    ServiceClient,
    ServiceError,
    ServiceProcess,
    applied_counts,
    read_ledger,
    start_service,
)

TASK = "order-7"
PLAN = castore.Plan.build("checkout", "prep", castore.effect("pay", "prep"), "after")
KEY = castore.derive_key(TASK, castore.plan_id(PLAN), "pay")
# A resubmission window of 60 s: the declared retention less the clock tolerance.
WINDOW_S = 60
RETENTION_S = CLOCK_TOLERANCE_MS // 1000 + WINDOW_S
CHILD_TIMEOUT_S = 60.0

# The crashing worker. Its plan must be PLAN above (a different one would be plan drift).
CHILD = """
import json, sys, time
import castore
from castore.lab.service import ServiceClient

cfg = json.loads(sys.argv[1])
offset = cfg["offset_ms"]
store = castore.Store.open(
    cfg["store"], create=True, clock=lambda: time.time_ns() // 1_000_000 + offset
)
client = ServiceClient(cfg["url"])
plan = castore.Plan.build("checkout", "prep", castore.effect("pay", "prep"), "after")
if cfg["declare"] == "lookup":
    def lookup(key):
        receipt = client.lookup(key)
        return castore.NOT_FOUND if receipt is None else castore.found(receipt)
    service = castore.Service("payments", reconcile=lookup)
elif cfg["declare"] == "idempotent":
    service = castore.Service("payments", idempotent=True, retention=cfg["retention"])
else:
    service = castore.Service("payments")
with store.open_task(cfg["task"], plan) as run:
    if run.next_step == "prep":
        run.commit_step("prep", {"amount": 4200})
    run.perform(
        "pay", service, lambda key: client.apply(key, "pay", {"amount": 4200}), key=cfg["key"]
    )
    run.commit_step("after", "done")
print("finished", flush=True)
"""


# -- fixtures and helpers ------------------------------------------------------------------------


class Lab:
    """A store path, a child script, and the lab services a test started."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.store_path = tmp_path / "store"
        self.script = tmp_path / "worker.py"
        self.script.write_text(CHILD)
        self.ledger = tmp_path / "ledger.jsonl"
        self.services: list[ServiceProcess] = []
        self.service: ServiceProcess | None = None

    def start(self, mode: str) -> ServiceProcess:
        """Start the lab service (a real process) in `mode`, with a 24 h dedupe window."""
        self.service = start_service(self.ledger, mode)
        self.services.append(self.service)
        return self.service

    @property
    def client(self) -> ServiceClient:
        assert self.service is not None
        return self.service.client()

    def crash(
        self,
        crash_at: str,
        *,
        declare: str,
        key: str | None = None,
        offset_ms: int = 0,
        retention: int = RETENTION_S,
    ) -> None:
        """Run the worker with CASTORE_CRASH_AT=`crash_at` and check it died by SIGKILL."""
        assert self.service is not None
        cfg = {
            "store": str(self.store_path),
            "task": TASK,
            "url": self.service.url,
            "declare": declare,
            "key": key,
            "offset_ms": offset_ms,
            "retention": retention,
        }
        env = {**os.environ, "CASTORE_CRASH_AT": crash_at}
        proc = subprocess.run(
            [sys.executable, str(self.script), json.dumps(cfg)],
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
        assert -signal.SIGKILL == proc.returncode, proc.stderr

    def store(self, offset_ms: int = 0) -> castore.Store:
        """The store, with a clock `offset_ms` ahead of the wall clock."""
        return castore.Store.open(
            self.store_path, clock=lambda: time.time_ns() // 1_000_000 + offset_ms
        )

    def counts(self) -> dict[str, int]:
        """How many times each key was applied, read from the ledger file itself."""
        return applied_counts(self.ledger)

    def receipt_of(self, key: str) -> str:
        """The receipt the service gave the (only) application of `key`."""
        receipts = [e["receipt"] for e in read_ledger(self.ledger) if e["key"] == key]
        assert 1 == len(receipts)
        return str(receipts[0])

    def lookup_service(self) -> castore.Service:
        """The payments service declared with a working lookup by key."""
        client = self.client

        def lookup(key: str) -> castore.Reconciled:
            receipt = client.lookup(key)
            return castore.NOT_FOUND if receipt is None else castore.found(receipt)

        return castore.Service("payments", reconcile=lookup)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A Lab whose services are stopped at the end of the test."""
    found = Lab(tmp_path)
    yield found
    for service in found.services:
        service.stop()


class Sender:
    """A send function that records each call and applies it at the lab service."""

    def __init__(self, client: ServiceClient | None) -> None:
        self.client = client
        self.keys: list[str] = []

    def __call__(self, key: str) -> str:
        self.keys.append(key)
        if self.client is None:
            raise AssertionError(f"castore sent {key!r} although it must not send")
        return self.client.apply(key, "pay", {"amount": 4200})


def never_send(key: str) -> str:
    raise AssertionError(f"castore sent {key!r} although it must not send")


S = EffectState
IDEMPOTENT = castore.Service("payments", idempotent=True, retention=RETENTION_S)
NEITHER = castore.Service("payments")


# -- the next-action table, row by row, through real crashes --------------------------------------


def test_planned_effect_is_submitted_once(lab: Lab) -> None:
    """PLANNED at HEAD (crash right after the step before it) → SUBMIT; the service applies once."""
    lab.start("none")
    lab.crash("commit.done:2", declare="none")  # 1: the task's start, 2: "prep"
    with lab.store().resume(TASK, PLAN) as run:
        action = run.next_action()
        assert (Action.SUBMIT, "pay", EffectState.PLANNED, KEY) == (
            action.action,
            action.step,
            action.state,
            action.key,
        )
        send = Sender(lab.client)
        receipt = run.perform("pay", NEITHER, send)
        assert [KEY] == send.keys
        assert lab.receipt_of(KEY) == receipt
        assert Action.SKIP == run.next_action("pay").action
    assert {KEY: 1} == lab.counts()


def test_submitted_and_found_by_reconcile_is_confirmed_without_resending(lab: Lab) -> None:
    """SUBMITTED + reconcile (crash after the service committed) → RECONCILE → CONFIRMED."""
    lab.start("lookup")
    lab.crash("effect.sent", declare="lookup")
    assert {KEY: 1} == lab.counts()
    with lab.store().resume(TASK, PLAN) as run:
        assert Action.RECONCILE == run.next_action().action
        assert EffectState.SUBMITTED == run.head.effect("pay").state
        assert Action.SKIP == run.settle(lab.lookup_service()).action
        assert None is run.head.effect("pay")
        assert lab.receipt_of(KEY) == run.receipt("pay")
        assert "after" == run.next_step
        assert lab.receipt_of(KEY) == run.perform("pay", lab.lookup_service(), never_send)
    assert {KEY: 1} == lab.counts()


def test_submitted_and_not_found_is_not_done_then_submitted_with_the_same_key(lab: Lab) -> None:
    """SUBMITTED + reconcile not-found (crash before sending) → NOT_DONE → SUBMIT, same key."""
    lab.start("lookup")
    lab.crash("effect.submitted", declare="lookup")
    assert {} == lab.counts()
    with lab.store().resume(TASK, PLAN) as run:
        assert Action.RECONCILE == run.next_action().action
        after = run.settle(lab.lookup_service())
        assert (Action.SUBMIT, EffectState.NOT_DONE, KEY) == (after.action, after.state, after.key)
        assert EffectState.NOT_DONE == run.head.effect("pay").state
        send = Sender(lab.client)
        run.perform("pay", lab.lookup_service(), send)
        assert [KEY] == send.keys
    assert {KEY: 1} == lab.counts()


def _raising_lookup(key: str) -> castore.Reconciled:
    raise ServiceError(f"lookup of {key} timed out")


@pytest.mark.parametrize(
    "answer",
    [
        _raising_lookup,
        lambda key: castore.unknown("the lookup endpoint answered 503"),
        lambda key: "maybe",  # not a Reconciled at all
    ],
    ids=["raises", "unknown", "garbage"],
)
def test_submitted_and_reconcile_unknown_becomes_unresolved(
    lab: Lab, answer: Callable[[str], Any]
) -> None:
    """SUBMITTED + reconcile that raises or answers unknown → UNRESOLVED → perform escalates."""
    lab.start("lookup")
    lab.crash("effect.sent", declare="lookup")
    service = castore.Service("payments", reconcile=answer)
    with lab.store().resume(TASK, PLAN) as run:
        assert Action.RECONCILE == run.next_action().action
        assert Action.ESCALATE == run.settle(service).action
        assert EffectState.UNRESOLVED == run.head.effect("pay").state
        with pytest.raises(castore.OutcomeUnknownError) as caught:
            run.perform("pay", service, never_send)
        assert ("pay", KEY) == (caught.value.step, caught.value.key)
    assert {KEY: 1} == lab.counts()


def test_unresolved_is_settled_by_a_later_successful_reconcile(lab: Lab) -> None:
    """UNRESOLVED → ESCALATE until a later reconcile finds the operation → CONFIRMED."""
    lab.start("lookup")
    lab.crash("effect.sent", declare="lookup")
    with lab.store().resume(TASK, PLAN) as run:
        run.settle(castore.Service("payments", reconcile=_raising_lookup))
    with lab.store().resume(TASK, PLAN) as run:
        assert Action.ESCALATE == run.next_action().action
        assert Action.SKIP == run.settle(lab.lookup_service()).action
        assert lab.receipt_of(KEY) == run.receipt("pay")
    assert {KEY: 1} == lab.counts()


def test_submitted_idempotent_within_retention_is_resubmitted_and_deduplicated(lab: Lab) -> None:
    """SUBMITTED + idempotent within retention → RESUBMIT with the same key; the service dedupes."""
    lab.start("idempotent")
    lab.crash("effect.sent", declare="idempotent")
    original = lab.receipt_of(KEY)
    with lab.store(offset_ms=(WINDOW_S - 5) * 1000).resume(TASK, PLAN) as run:
        assert Action.RESUBMIT == run.next_action().action
        assert Action.RESUBMIT == run.settle(IDEMPOTENT).action  # settle never sends
        send = Sender(lab.client)
        assert original == run.perform("pay", IDEMPOTENT, send)
        assert [KEY] == send.keys
        assert original == run.receipt("pay")
    assert {KEY: 1} == lab.counts()


def test_submitted_idempotent_after_retention_is_marked_unresolved(lab: Lab) -> None:
    """SUBMITTED + idempotent, retention passed → MARK_UNRESOLVED; never resubmitted."""
    lab.start("idempotent")
    lab.crash("effect.sent", declare="idempotent")
    with lab.store(offset_ms=(WINDOW_S + 1) * 1000).resume(TASK, PLAN) as run:
        action = run.next_action()
        assert Action.MARK_UNRESOLVED == action.action
        assert "retention" in action.reason
        assert Action.ESCALATE == run.settle(IDEMPOTENT).action
        assert EffectState.UNRESOLVED == run.head.effect("pay").state
        with pytest.raises(castore.OutcomeUnknownError):
            run.perform("pay", IDEMPOTENT, never_send)
    assert {KEY: 1} == lab.counts()


def test_retention_is_counted_from_the_first_submission(lab: Lab) -> None:
    """A resubmission does not restart the retention window: it runs from the FIRST submit."""
    lab.start("idempotent")
    lab.crash("effect.sent", declare="idempotent")  # first submission at t0
    # A second worker, 40 s later, resubmits (the service dedupes) and dies before CONFIRMED.
    lab.crash("effect.sent", declare="idempotent", offset_ms=40_000)
    store = lab.store(offset_ms=70_000)  # 70 s after the first, 30 s after the second
    record = store.verify(TASK).head.effect("pay")
    assert (EffectState.SUBMITTED, 2) == (record.state, record.attempts)
    assert record.first_submitted_ms < record.since_ms
    with store.resume(TASK, PLAN) as run:
        assert Action.MARK_UNRESOLVED == run.next_action().action
        with pytest.raises(castore.OutcomeUnknownError):
            run.perform("pay", IDEMPOTENT, never_send)
    assert {KEY: 1} == lab.counts()


@pytest.mark.parametrize(
    ("crash_at", "applied"), [("effect.sent", {KEY: 1}), ("effect.submitted", {})]
)
def test_submitted_with_neither_is_marked_unresolved_then_escalated(
    lab: Lab, crash_at: str, applied: dict[str, int]
) -> None:
    """SUBMITTED + neither → MARK_UNRESOLVED → ESCALATE; perform raises OutcomeUnknownError."""
    lab.start("none")
    lab.crash(crash_at, declare="none")
    with lab.store().resume(TASK, PLAN) as run:
        assert Action.MARK_UNRESOLVED == run.next_action().action
        assert Action.ESCALATE == run.settle(NEITHER).action
        with pytest.raises(castore.OutcomeUnknownError) as caught:
            run.perform("pay", NEITHER, never_send)
        assert (TASK, "pay", KEY) == (caught.value.task, caught.value.step, caught.value.key)
        assert "castore resolve" in str(caught.value)
    with lab.store().resume(TASK, PLAN) as run:  # a later worker escalates too, never resends
        assert Action.ESCALATE == run.next_action().action
        with pytest.raises(castore.OutcomeUnknownError):
            run.perform("pay", NEITHER, never_send)
    assert applied == lab.counts()


def test_neither_escalates_straight_from_perform(lab: Lab) -> None:
    """perform on a SUBMITTED effect with neither capability raises without sending."""
    lab.start("none")
    lab.crash("effect.sent", declare="none")
    with lab.store().resume(TASK, PLAN) as run:
        with pytest.raises(castore.OutcomeUnknownError):
            run.perform("pay", NEITHER, never_send)
        assert EffectState.UNRESOLVED == run.head.effect("pay").state
    assert {KEY: 1} == lab.counts()


def test_unresolved_resolved_as_confirmed_moves_the_frontier(lab: Lab) -> None:
    """UNRESOLVED → ESCALATE; store.resolve(receipt=...) → CONFIRMED and the frontier moves."""
    lab.start("none")
    lab.crash("effect.sent", declare="none")
    with lab.store().resume(TASK, PLAN) as run:
        run.settle(NEITHER)
    store = lab.store()
    with store.resume(TASK, PLAN) as run:
        assert Action.ESCALATE == run.next_action().action
    receipt = lab.receipt_of(KEY)  # the person checked the service
    snapshot_id = store.resolve(TASK, "pay", receipt=receipt, who="ana@ops", reason="in ledger")
    newest_id, newest = store.history(TASK)[0]
    assert snapshot_id == newest_id
    assert ("resolve", "ana@ops", "in ledger", EffectState.CONFIRMED) == (
        newest.transition.kind,
        newest.transition.who,
        newest.transition.why,
        newest.transition.effect_to,
    )
    with store.resume(TASK, PLAN) as run:
        assert (Action.SKIP, "after") == (run.next_action("pay").action, run.next_step)
        assert receipt == run.receipt("pay")
        assert receipt == run.perform("pay", NEITHER, never_send)
        run.commit_step("after", "done")
        assert Action.DONE == run.next_action().action
    assert {KEY: 1} == lab.counts()


def test_unresolved_resolved_as_not_done_is_submitted_again_with_the_same_key(lab: Lab) -> None:
    """store.resolve(not_done=True, reason=...) → NOT_DONE → SUBMIT with the same key."""
    lab.start("none")
    lab.crash("effect.submitted", declare="none")
    with lab.store().resume(TASK, PLAN) as run:
        run.settle(NEITHER)
    store = lab.store()
    assert {} == lab.counts()  # the person checked the service: it never saw the key
    store.resolve(TASK, "pay", not_done=True, reason="not in the ledger", who="ana@ops")
    with store.resume(TASK, PLAN) as run:
        action = run.next_action()
        assert (Action.SUBMIT, EffectState.NOT_DONE, KEY) == (
            action.action,
            action.state,
            action.key,
        )
        send = Sender(lab.client)
        receipt = run.perform("pay", NEITHER, send)
        assert [KEY] == send.keys
        assert lab.receipt_of(KEY) == receipt
    assert {KEY: 1} == lab.counts()


def test_resolve_needs_a_reason_for_not_done(store: castore.Store) -> None:
    """resolve(not_done=True) without a reason, or with neither outcome, raises UsageError."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("prep", 1)
        with pytest.raises(ConnectionError, match="reset by peer"):
            _interrupted(run, NEITHER, [])
    with pytest.raises(castore.UsageError):
        store.resolve(TASK, "pay", not_done=True, who="ana@ops")
    with pytest.raises(castore.UsageError):
        store.resolve(TASK, "pay", who="ana@ops")
    assert EffectState.SUBMITTED == store.verify(TASK).head.effect("pay").state


def test_confirmed_effect_is_skipped(lab: Lab) -> None:
    """CONFIRMED at HEAD (crash right after the CONFIRMED commit) → SKIP; then RUN, then DONE."""
    lab.start("none")
    lab.crash("effect.confirmed", declare="none")
    with lab.store().resume(TASK, PLAN) as run:
        assert Action.SKIP == run.next_action("pay").action
        assert (Action.RUN, "after") == (run.next_action().action, run.next_action().step)
        assert lab.receipt_of(KEY) == run.perform("pay", NEITHER, never_send)
        assert (Action.RUN, "after") == (run.settle(NEITHER).action, run.next_step)
        run.commit_step("after", "done")
        assert Action.DONE == run.next_action().action
        assert run.finished
    assert {KEY: 1} == lab.counts()


# -- the effect block, in one process -------------------------------------------------------------


def _prepared(store: castore.Store, **options: Any) -> castore.Run:
    run = store.start(TASK, PLAN, **options)
    run.commit_step("prep", {"amount": 4200})
    return run


def _interrupted(run: castore.Run, service: castore.Service, keys: list[str]) -> None:
    """Submit 'pay' and lose the connection inside the block (the exception propagates)."""
    with run.effect("pay", service) as call:
        keys.append(call.key)
        raise ConnectionError("reset by peer")


def test_exception_inside_the_effect_block_leaves_it_submitted(store: castore.Store) -> None:
    """An exception raised inside `with run.effect(...)` leaves the effect SUBMITTED."""
    keys: list[str] = []
    with _prepared(store) as run:
        with pytest.raises(ConnectionError, match="reset by peer"):
            _interrupted(run, NEITHER, keys)
        assert [KEY] == keys
        assert EffectState.SUBMITTED == run.head.effect("pay").state
    assert EffectState.SUBMITTED == store.verify(TASK).head.effect("pay").state
    with store.resume(TASK, PLAN) as run:
        assert Action.MARK_UNRESOLVED == run.next_action().action


def test_block_without_confirm_raises_and_stays_submitted(store: castore.Store) -> None:
    """A body that neither confirms nor says not_done raises UsageError; it stays SUBMITTED."""
    with _prepared(store) as run:
        with pytest.raises(castore.UsageError), run.effect("pay", NEITHER):
            pass
        assert EffectState.SUBMITTED == run.head.effect("pay").state


def test_call_not_done_records_not_done_and_allows_the_same_key_again(store: castore.Store) -> None:
    """call.not_done(reason) → NOT_DONE with the reason; the next action is SUBMIT, same key."""
    with _prepared(store) as run:
        with run.effect("pay", NEITHER) as call:
            call.not_done("card declined")
        record = run.head.effect("pay")
        assert (EffectState.NOT_DONE, "card declined", KEY) == (
            record.state,
            record.reason,
            record.key,
        )
        assert Action.SUBMIT == run.next_action().action
    with store.resume(TASK, PLAN) as run:
        assert (Action.SUBMIT, KEY) == (run.next_action().action, run.next_action().key)
        with run.effect("pay", NEITHER) as call:
            assert (KEY, 2) == (call.key, call.attempt)
            call.confirm("rcpt-2")
        assert "rcpt-2" == run.receipt("pay")


def test_submitted_is_durable_before_the_request_and_confirmed_after(store: castore.Store) -> None:
    """While send runs, a fresh reader sees SUBMITTED with the key; afterwards CONFIRMED."""
    seen: list[tuple[EffectState, str | None]] = []

    def send(key: str) -> str:
        record = castore.Store.open(store.root).verify(TASK).head.effect("pay")
        seen.append((record.state, record.key))
        return "rcpt-1"

    with _prepared(store) as run:
        run.perform("pay", NEITHER, send)
    assert [(EffectState.SUBMITTED, KEY)] == seen
    newest = store.history(TASK)[0][1]
    assert (EffectState.CONFIRMED, "rcpt-1") == (
        newest.transition.effect_to,
        newest.transition.receipt,
    )


def test_an_effect_costs_two_commits_on_the_happy_path(store: castore.Store) -> None:
    """perform adds exactly two slots: SUBMITTED and CONFIRMED."""
    chain_dir = Path(store.layout.chain_dir(TASK))
    with _prepared(store) as run:
        before = len(os.listdir(chain_dir))
        run.perform("pay", NEITHER, lambda key: "rcpt-1")
        assert before + 2 == len(os.listdir(chain_dir))


def test_effect_step_cannot_be_committed_as_a_plain_step(store: castore.Store) -> None:
    """commit_step on an effect raises UsageError: its key must be persisted before the request."""
    with _prepared(store) as run:
        with pytest.raises(castore.UsageError):
            run.commit_step("pay", "rcpt-1")
        assert EffectState.PLANNED == run.head.effect("pay").state


def test_entering_a_reconcilable_submitted_effect_reconciles_first(store: castore.Store) -> None:
    """run.effect on a SUBMITTED effect whose next action is RECONCILE reconciles on entry:
    not found → NOT_DONE → submitted again with the same key (the block runs once more)."""
    service = castore.Service("payments", reconcile=lambda key: castore.NOT_FOUND)
    keys: list[str] = []
    with _prepared(store) as run:
        with pytest.raises(ConnectionError, match="reset by peer"):
            _interrupted(run, service, keys)
        with run.effect("pay", service) as call:
            assert (KEY, 2) == (call.key, call.attempt)
            call.confirm("rcpt-1")
        kinds = [(s.transition.effect_from, s.transition.effect_to) for _, s in store.history(TASK)]
        assert [
            (S.SUBMITTED, S.CONFIRMED),
            (S.NOT_DONE, S.SUBMITTED),
            (S.SUBMITTED, S.NOT_DONE),
        ] == (kinds[:3])
    assert [KEY] == keys


def test_entering_a_plain_step_as_an_effect_is_not_ready(store: castore.Store) -> None:
    """run.effect on a plain step: EffectNotReadyError naming its next action and run.settle."""
    with store.start(TASK, PLAN) as run, pytest.raises(castore.EffectNotReadyError) as caught:
        run.effect("prep", NEITHER).__enter__()
    assert "run" == caught.value.next_action
    assert "run.settle(service)" in str(caught.value)


# -- legal and illegal transitions ----------------------------------------------------------------

# PROTOCOL.md's diagram, plus SUBMITTED → SUBMITTED (a resubmission with the same key is
# committed too, so only the winner of that commit sends it).
LEGAL = {
    (S.PLANNED, S.SUBMITTED),
    (S.SUBMITTED, S.SUBMITTED),
    (S.SUBMITTED, S.CONFIRMED),
    (S.SUBMITTED, S.UNRESOLVED),
    (S.SUBMITTED, S.NOT_DONE),
    (S.UNRESOLVED, S.CONFIRMED),
    (S.UNRESOLVED, S.NOT_DONE),
    (S.NOT_DONE, S.SUBMITTED),
}
PAIRS = list(itertools.product(EffectState, EffectState))


@pytest.mark.parametrize(("current", "requested"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_check_transition_allows_exactly_the_protocol_diagram(
    current: EffectState, requested: EffectState
) -> None:
    """check_transition passes the diagram's transitions and raises IllegalTransitionError else."""
    if (current, requested) in LEGAL:
        check_transition("pay", current, requested)
        return
    with pytest.raises(castore.IllegalTransitionError) as caught:
        check_transition("pay", current, requested)
    error = caught.value
    assert ("pay", current.value, requested.value) == (error.step, error.current, error.requested)
    assert f"effect 'pay' cannot go from {current.value} to {requested.value}" in str(error)
    assert isinstance(error, castore.EffectError)


def test_allowed_table_is_the_protocol_diagram() -> None:
    """castore's transition table is the diagram, no more, no less."""
    assert LEGAL == {(a, b) for a, targets in ALLOWED.items() for b in targets}


def test_confirmed_effect_cannot_be_resolved_again(store: castore.Store) -> None:
    """A CONFIRMED effect needs no decision: resolve raises UsageError and commits nothing."""
    with _prepared(store) as run:
        run.perform("pay", NEITHER, lambda key: "rcpt-1")
    before = store.verify(TASK).length
    with pytest.raises(castore.UsageError):
        store.resolve(TASK, "pay", receipt="rcpt-2", who="ana@ops")
    assert before == store.verify(TASK).length


# -- keys ------------------------------------------------------------------------------------------


def test_derived_key_is_stable_across_a_restart(lab: Lab) -> None:
    """The key a crashed worker persisted is derive_key(task, plan id, step), the same after."""
    lab.start("lookup")
    lab.crash("effect.submitted", declare="lookup")
    expected = castore.derive_key(TASK, castore.plan_id(PLAN), "pay")
    assert expected == lab.store().verify(TASK).head.effect("pay").key
    with lab.store().resume(TASK, PLAN) as run:
        assert expected == run.next_action().key
    assert castore.derive_key(TASK, castore.plan_id(PLAN), "pay") == expected
    others = {
        castore.derive_key("order-8", castore.plan_id(PLAN), "pay"),
        castore.derive_key(TASK, castore.plan_id(PLAN), "prep"),
        castore.derive_key(TASK, castore.plan_id(castore.Plan.build("x", "pay")), "pay"),
    }
    assert expected not in others
    assert 3 == len(others)


def test_custom_key_is_used_and_kept_across_a_restart(lab: Lab) -> None:
    """A key passed to run.perform/run.effect is the one sent, and the one reconciled after."""
    lab.start("lookup")
    lab.crash("effect.sent", declare="lookup", key="order-7/charge")
    assert {"order-7/charge": 1} == lab.counts()
    with lab.store().resume(TASK, PLAN) as run:
        assert "order-7/charge" == run.next_action().key
        assert Action.SKIP == run.settle(lab.lookup_service()).action
        assert lab.receipt_of("order-7/charge") == run.receipt("pay")
    assert {"order-7/charge": 1} == lab.counts()


def test_custom_key_in_the_effect_block(store: castore.Store) -> None:
    """run.effect(..., key=K) hands K to the body and records it in SUBMITTED."""
    with _prepared(store) as run, run.effect("pay", NEITHER, key="mine-1") as call:
        assert "mine-1" == call.key
        assert "mine-1" == run.head.effect("pay").key
        call.confirm("rcpt-1")


def test_a_different_key_after_submitted_raises_usage_error(lab: Lab) -> None:
    """After SUBMITTED, resubmitting with a different key raises UsageError and changes nothing."""
    lab.start("idempotent")
    lab.crash("effect.sent", declare="idempotent", key="order-7/charge")
    with lab.store().resume(TASK, PLAN) as run:
        assert Action.RESUBMIT == run.next_action().action
        before = tree_snapshot(lab.store_path)
        with pytest.raises(castore.UsageError) as caught, run.effect("pay", IDEMPOTENT, key="new"):
            pass
        assert "same key" in str(caught.value)
        with pytest.raises(castore.UsageError):
            run.perform("pay", IDEMPOTENT, never_send, key="new")
        assert before == tree_snapshot(lab.store_path)
        send = Sender(lab.client)
        original = lab.receipt_of("order-7/charge")
        assert original == run.perform("pay", IDEMPOTENT, send, key="order-7/charge")
        assert ["order-7/charge"] == send.keys
    assert {"order-7/charge": 1} == lab.counts()


# -- two workers resuming the same task at the same time ------------------------------------------

CTX = multiprocessing.get_context("fork")
RACE_ROUNDS = 8


def _race_worker(cfg: dict[str, Any], barrier: Any) -> None:
    """For each task: resume with the other worker, then both try to submit 'pay' at once."""
    log: list[dict[str, Any]] = []
    worker, out = cfg["worker"], cfg["out"]
    try:
        store = castore.Store.open(cfg["root"])
        client = ServiceClient(cfg["url"])
        for task in cfg["tasks"]:
            barrier.wait(CHILD_TIMEOUT_S)
            run = store.resume(task, PLAN, lock_timeout=None)
            barrier.wait(CHILD_TIMEOUT_S)  # both hold a run at the same HEAD (PLANNED)
            entry: dict[str, Any] = {"task": task, "worker": worker, "sent": False}
            try:
                with run.effect("pay", NEITHER) as call:
                    entry["sent"] = True
                    call.confirm(client.apply(call.key, "pay", {"task": task}))
                entry["outcome"] = "won"
            except castore.ConflictError:
                entry["outcome"] = "conflict"
            run.close()
            log.append(entry)
    finally:
        Path(out).write_text(json.dumps(log))


def test_two_workers_resuming_at_once_send_each_effect_once(lab: Lab) -> None:
    """Two processes submit one effect at once: one sends, the other gets ConflictError unsent."""
    lab.start("none")
    store = castore.Store.init(lab.store_path)
    tasks = [f"race-{n}" for n in range(RACE_ROUNDS)]
    for task in tasks:
        with store.start(task, PLAN) as run:
            run.commit_step("prep", 1)
    assert lab.service is not None
    barrier = CTX.Barrier(2)
    outs = [lab.tmp_path / f"worker-{n}.json" for n in range(2)]
    workers = [
        CTX.Process(
            target=_race_worker,
            args=(
                {
                    "root": str(lab.store_path),
                    "url": lab.service.url,
                    "tasks": tasks,
                    "out": str(outs[n]),
                    "worker": n,
                },
                barrier,
            ),
            daemon=True,
        )
        for n in range(2)
    ]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join(CHILD_TIMEOUT_S)
            assert (False, 0) == (worker.is_alive(), worker.exitcode)
    finally:
        for worker in workers:
            if worker.is_alive() and worker.pid is not None:
                os.kill(worker.pid, signal.SIGKILL)
    entries = [entry for out in outs for entry in json.loads(out.read_text())]
    for task in tasks:
        mine = sorted((e["outcome"], e["sent"]) for e in entries if e["task"] == task)
        assert [("conflict", False), ("won", True)] == mine
    keys = {castore.derive_key(task, castore.plan_id(PLAN), "pay") for task in tasks}
    assert dict.fromkeys(keys, 1) == lab.counts()
    for task in tasks:
        with store.resume(task, PLAN) as run:
            key = castore.derive_key(task, castore.plan_id(PLAN), "pay")
            assert Action.SKIP == run.next_action("pay").action
            assert lab.receipt_of(key) == run.receipt("pay")
