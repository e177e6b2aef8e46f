"""Forged but hash-valid HEADs: resume refuses every link fsck calls `illegal-transition`.

Each HEAD is written with castore's own encoder (every hash verifies); what is wrong is the
history it tells. The service is the lab service (a real process with its own ledger), in the
mode that can neither deduplicate nor be asked: a second send would be a second charge.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import castore
from castore.chain.refs import TaskSlots
from castore.format.records import (
    EffectRecord,
    EffectState,
    Frontier,
    Snapshot,
    Transition,
    TransitionKind,
)
from castore.lab.service import ServiceClient, ServiceProcess, applied_counts, start_service
from castore.maintenance.fsck import check_store
from castore.run.settings import RunSettings, encode_snapshot

S = EffectState
TASK = "order-9"
PLAN = castore.Plan.build("checkout", "prep", castore.effect("pay", "prep"), "after")
KEY = castore.derive_key(TASK, castore.plan_id(PLAN), "pay")
NEITHER = castore.Service("payments")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    """The lab service in mode `none`, its ledger in tmp_path."""
    with start_service(tmp_path / "ledger.jsonl", "none") as running:
        yield running


def forge(store: castore.Store, **changes: Any) -> tuple[str, int]:
    """Commit a hand-made successor of HEAD with castore's own encoder: (its id, its seq)."""
    chain = store.verify(TASK)
    snapshot = attrs.evolve(chain.head, seq=chain.head.seq + 1, parent=chain.head_id, **changes)
    data = encode_snapshot(snapshot, RunSettings())
    slots = TaskSlots(store.medium, store.objects, TASK)
    return slots.commit(data, snapshot.seq, chain.head_id), snapshot.seq


def sent_and_lost(store: castore.Store, client: ServiceClient) -> Snapshot:
    """Commit "prep", send "pay" (the service applies it) and lose the answer: SUBMITTED."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("prep", 1)
        with pytest.raises(ConnectionError):
            _send_and_lose(run, client)
        return run.head


def _send_and_lose(run: castore.Run, client: ServiceClient) -> None:
    with run.effect("pay", NEITHER) as call:
        client.apply(call.key, "pay", {"amount": 1})
        raise ConnectionError("the answer was lost")


def confirmed(store: castore.Store, client: ServiceClient) -> Snapshot:
    """Commit "prep" and "pay" (sent once, CONFIRMED): the frontier is at "after"."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("prep", 1)
        run.perform("pay", NEITHER, lambda key: client.apply(key, "pay", {"amount": 1}))
        return run.head


def _move(step: str, old: S | None, new: S | None, **fields: Any) -> Transition:
    return Transition(TransitionKind.EFFECT, step=step, effect_from=old, effect_to=new, **fields)


def back_to_planned(head: Snapshot) -> dict[str, Any]:
    record = attrs.evolve(head.effects[0], state=S.PLANNED)
    return {"effects": (record,), "transition": _move("pay", S.SUBMITTED, S.PLANNED)}


def back_to_planned_unnamed(head: Snapshot) -> dict[str, Any]:
    record = attrs.evolve(head.effects[0], state=S.PLANNED)
    return {"effects": (record,), "transition": Transition(TransitionKind.OVERRIDE, who="x")}


def vanished(head: Snapshot) -> dict[str, Any]:
    return {"effects": (), "transition": _move("pay", S.SUBMITTED, S.NOT_DONE, why="gone")}


def new_key(head: Snapshot) -> dict[str, Any]:
    record = attrs.evolve(head.effects[0], state=S.NOT_DONE, key="cas-forged", reason="x")
    return {"effects": (record,), "transition": _move("pay", S.SUBMITTED, S.NOT_DONE, why="x")}


def later_first_submission(head: Snapshot) -> dict[str, Any]:
    old = head.effects[0]
    assert old.first_submitted_ms is not None
    record = attrs.evolve(old, attempts=2, first_submitted_ms=old.first_submitted_ms + 10**9)
    return {"effects": (record,), "transition": _move("pay", S.SUBMITTED, S.SUBMITTED)}


def made_idempotent(head: Snapshot) -> dict[str, Any]:
    record = attrs.evolve(
        head.effects[0], state=S.UNRESOLVED, idempotent=True, retention_s=10**6, reason="x"
    )
    return {"effects": (record,), "transition": _move("pay", S.SUBMITTED, S.UNRESOLVED, why="x")}


def confirmed_goes_back(head: Snapshot) -> dict[str, Any]:
    record = EffectRecord("pay", KEY, S.PLANNED, head.time_ms)
    return {"effects": (record,), "transition": Transition(TransitionKind.OVERRIDE, who="x")}


def frontier_backwards(head: Snapshot) -> dict[str, Any]:
    return {
        "frontier": Frontier(0, "prep"),
        "transition": Transition(TransitionKind.STEP, step="after"),
    }


def receipt_changed(head: Snapshot) -> dict[str, Any]:
    return {"transition": _move("pay", None, S.CONFIRMED, receipt="rcpt-forged")}


Forgery = Callable[[Snapshot], dict[str, Any]]
CASES: list[tuple[Forgery, Callable[..., Snapshot], str]] = [
    (back_to_planned, sent_and_lost, "pay: SUBMITTED -> PLANNED is not allowed"),
    (back_to_planned_unnamed, sent_and_lost, "pay: SUBMITTED -> PLANNED without a transition"),
    (vanished, sent_and_lost, "pay: the record vanished at SUBMITTED -> NOT_DONE"),
    (new_key, sent_and_lost, f"rewrites key '{KEY}' -> 'cas-forged'"),
    (later_first_submission, sent_and_lost, "rewrites first_submitted_ms"),
    (made_idempotent, sent_and_lost, "rewrites idempotent False -> True"),
    (confirmed_goes_back, confirmed, "pay: a PLANNED record appears away from the frontier"),
    (frontier_backwards, confirmed, "frontier moved from 2 ('after') to 0 ('prep')"),
    (receipt_changed, confirmed, "pay: None -> CONFIRMED is not allowed"),
]


@pytest.mark.parametrize("case", CASES, ids=[case[0].__name__ for case in CASES])
def test_resume_refuses_a_forged_history_and_nothing_is_sent_again(
    store: castore.Store,
    service: ServiceProcess,
    tmp_path: Path,
    case: tuple[Forgery, Callable[..., Snapshot], str],
) -> None:
    """A hash-valid HEAD with an illegal link: IllegalHistoryError naming the slot, the
    effect and the change; fsck flags the same slot; the ledger still holds one charge."""
    forgery, setup, problem = case
    client = service.client()
    head = setup(store, client)
    forged, seq = forge(store, **forgery(head))
    with pytest.raises(castore.IllegalHistoryError) as caught, store.open_task(TASK, PLAN) as run:
        run.perform("pay", NEITHER, lambda key: client.apply(key, "pay", {"amount": 1}))
    error = caught.value
    assert (TASK, seq, forged) == (error.task, error.seq, error.object_id)
    assert any(problem in message for message in error.problems), error.problems
    assert f"snapshot {seq} ({forged})" in str(error)
    assert f"castore fsck --task {TASK}" in str(error)
    assert isinstance(error, castore.ChainError)
    assert isinstance(error, castore.ResumeRefusedError)
    findings = [f for f in check_store(store.root, jobs=1) if f.code == "illegal-transition"]
    assert {(f"tasks/{TASK}/chain/{seq:016d}", forged)} == {(f.path, f.object_id) for f in findings}
    assert sorted(error.problems) == sorted(f.message for f in findings)  # one rule for both
    assert {KEY: 1} == applied_counts(tmp_path / "ledger.jsonl")


def test_a_decision_on_a_forged_history_is_refused_too(
    store: castore.Store, service: ServiceProcess
) -> None:
    """resolve and override verify the same chain: no decision is recorded on a forgery."""
    forge(store, **back_to_planned(sent_and_lost(store, service.client())))
    slots = TaskSlots(store.medium, store.objects, TASK)
    count = slots.head_seq()
    with pytest.raises(castore.IllegalHistoryError):
        store.resolve(TASK, "pay", not_done=True, reason="checked", who="ana@ops")
    with pytest.raises(castore.IllegalHistoryError):
        store.override(TASK, who="ana@ops", why="accept it", env="x")
    assert count == slots.head_seq()


def test_every_legal_history_still_resumes(store: castore.Store, service: ServiceProcess) -> None:
    """Submit, lose, mark unresolved, resolve not-done, submit again, confirm, resolve flow:
    every link castore itself writes passes the history rules (no false refusal)."""
    client = service.client()
    sent_and_lost(store, client)
    with store.resume(TASK, PLAN) as run:
        assert castore.Action.ESCALATE == run.settle(NEITHER).action
    store.resolve(TASK, "pay", not_done=True, reason="not in the ledger", who="ana@ops")
    with store.resume(TASK, PLAN) as run:
        run.perform("pay", NEITHER, lambda key: f"rcpt-{key}")
        run.commit_step("after", 2)
        assert run.finished
    assert [] == [f for f in check_store(store.root, jobs=1) if f.code == "illegal-transition"]


def test_fsck_judges_a_slot_with_other_findings_against_its_clean_parent(
    store: castore.Store,
) -> None:
    """An override that keeps a PLANNED record unchanged, its slot made writable (so fsck
    gives it the full check, after a clean parent): no `illegal-transition` (a decoded view
    never equals a record, so the rule compares field values)."""
    with store.start(TASK, PLAN, env="a" * 64) as run:
        run.commit_step("prep", 1)
    store.override(TASK, who="ana@ops", why="rotated", env="b" * 64)
    seq = 2  # 0 start, 1 prep, 2 the override
    assert EffectState.PLANNED == store.verify(TASK).head.effects[0].state
    os.chmod(TaskSlots(store.medium, store.objects, TASK).path(seq), 0o644)
    codes = {f.code for f in check_store(store.root, jobs=1)}
    assert "illegal-transition" not in codes
    assert codes  # the writable slot itself is reported
