"""The side-effect protocol in action: submit, confirm, reconcile and settle effects of a run.

Persist the key before the request (SUBMITTED), send with that key, persist the receipt after
confirmation (CONFIRMED): two durable commits per effect. Only the worker whose SUBMITTED
commit won may send. An exception from the service call leaves the effect SUBMITTED, to be
reconciled on the next resume, unless the caller says the failure is definitive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar, cast

from castore import crashpoints
from castore.chain.outcomes import Outcome
from castore.errors import EffectNotReadyError, OutcomeUnknownError, UsageError
from castore.format.effects import (
    Action,
    Lookup,
    NextAction,
    Reconciled,
    Service,
    check_transition,
    effect_action,
    moved_record,
    submitted_record,
    unknown,
)
from castore.format.model import attrs
from castore.format.records import EffectRecord, EffectState, Transition, TransitionKind
from castore.run import gate, inflight
from castore.run.contract import Position, RunView

_SENDABLE = (Action.SUBMIT, Action.RESUBMIT)
_SETTLING = (Action.RECONCILE, Action.MARK_UNRESOLVED, Action.ESCALATE)
R = TypeVar("R")
T = TypeVar("T")


def next_action(run: RunView, step_id: str | None) -> NextAction:
    """The one next action for a step, per the table in docs/explanation/protocol.md."""
    frontier = run.head.frontier
    if step_id is None:
        if frontier.step is None:
            return NextAction(Action.DONE, None, reason="every step is finished")
        step_id = frontier.step
    if run.done(step_id):
        return NextAction(Action.SKIP, step_id, reason="already finished")
    record = run.head.effect(step_id)
    if record is not None:
        return effect_action(record, run.now_ms(), run.chain_clock)
    if step_id != frontier.step:
        raise UsageError(f"step {step_id!r} is not the next step (next: {frontier.step!r})")
    return NextAction(Action.RUN, step_id, reason="a plain step: run it and commit its result")


def _open_record(run: RunView, step_id: str) -> EffectRecord:
    record = run.head.effect(step_id)
    if record is None:
        raise UsageError(
            f"step {step_id!r} of task {run.task_id!r} is not an open effect (next step: "
            f"{run.head.frontier.step!r}); effects run in plan order"
        )
    return record


def _replace(run: RunView, new: EffectRecord | None, step_id: str) -> tuple[EffectRecord, ...]:
    """HEAD's open effects with `step_id`'s record replaced by `new` (dropped if None)."""
    kept = tuple(r for r in run.head.effects if r.step != step_id)
    return kept if new is None else (*kept, new)


def _transition(
    record: EffectRecord, to: EffectState, receipt: str | None = None, why: str | None = None
) -> Transition:
    return Transition(
        TransitionKind.EFFECT,
        step=record.step,
        effect_from=record.state,
        effect_to=to,
        receipt=receipt,
        why=why,
    )


class _AlreadyDone(BaseException):
    """Raised in the block of an effect found CONFIRMED on entry, where it reads `call.key`
    (the permission to send): it unwinds the block before anything is sent, and the context
    manager swallows it. A BaseException, so that the block's `except Exception` cannot."""


class Call:
    """An effect whose SUBMITTED commit won: the caller may send the request with `key`.

    Of an effect that was already CONFIRMED on entry (`done`), `receipt` is the recorded
    receipt and `key`, `confirm` and `not_done` end the block before it sends again."""

    def __init__(self, run: RunView, record: EffectRecord, *, done: bool = False) -> None:
        self.run = run
        self.step = record.step
        self._key: str = record.key or ""
        self.attempt = record.attempts
        self.receipt: str | None = run.receipt(record.step) if done else None
        self.settled = done
        self.done = done

    @property
    def key(self) -> str:
        """The idempotency key to send the request with."""
        if self.done:
            raise _AlreadyDone
        return self._key

    def confirm(self, receipt: str) -> str:
        """The service confirmed: commit CONFIRMED with the receipt; returns the snapshot id."""
        if self.done:
            raise _AlreadyDone
        if not isinstance(receipt, str) or not receipt:
            raise UsageError(
                "a receipt is a non-empty str: the service's id or URL for the operation"
            )
        crashpoints.reach("effect.sent")
        record = _open_record(self.run, self.step)
        check_transition(self.step, record.state, EffectState.CONFIRMED)
        # A confirmed effect explains whatever it changed: its snapshot anchors the live env.
        self.run.env_unverified = False
        snapshot_id = self.run.advance(
            _transition(record, EffectState.CONFIRMED, receipt=receipt),
            _replace(self.run, None, self.step),
            move_frontier=True,
        )
        self.run.record_outcome(Outcome(self.step, self.run.head.seq, receipt=receipt))
        self.receipt, self.settled = receipt, True
        crashpoints.reach("effect.confirmed")
        return snapshot_id

    def not_done(self, reason: str) -> str:
        """The service definitively refused (it did not apply the operation): commit NOT_DONE.
        The effect may be submitted again later, with the same key."""
        if self.done:
            raise _AlreadyDone
        record = _open_record(self.run, self.step)
        new = moved_record(record, EffectState.NOT_DONE, self.run.now_ms(), reason)
        snapshot_id = self.run.advance(
            _transition(record, EffectState.NOT_DONE, why=reason),
            _replace(self.run, new, self.step),
        )
        self.settled = True
        return snapshot_id


def _ready(run: RunView, step_id: str, service: Service) -> NextAction:
    """The effect's next action once the rows that do not send are applied (what settle
    does): submit, resubmit or skip; OutcomeUnknownError for an outcome nobody knows."""
    action = next_action(run, step_id)
    if action.action in _SETTLING:
        settle(run, service)
        action = next_action(run, step_id)
    if action.action is Action.ESCALATE:
        record = _open_record(run, step_id)
        raise OutcomeUnknownError(run.task_id, step_id, record.key or "", record.reason)
    return action


@contextlib.contextmanager
def effect(run: RunView, step_id: str, service: Service, key: str | None) -> Iterator[Call]:
    """Apply the effect's next action (a rerun after a crash or an exception in the block
    reconciles, resubmits or escalates first), then commit SUBMITTED (the claim to send),
    yield the call and check it was settled. An effect that is CONFIRMED by then yields a
    done call: the block ends at its first use of `call.key`. StepInFlightError while a
    send of it may still run: in any run of this process, or in the live process of this
    host that submitted it (castore.run.inflight)."""
    if not run.done(step_id):
        inflight.refuse(run, step_id, f"sending or reconciling effect {step_id!r} again")
    action = _ready(run, step_id, service)
    if action.action is Action.SKIP:
        # The block stops at its first use of the key: the effect happened already.
        with contextlib.suppress(_AlreadyDone):
            yield Call(run, EffectRecord(step_id, None, EffectState.CONFIRMED, 0), done=True)
        return
    if action.action not in _SENDABLE:
        raise EffectNotReadyError(step_id, str(action.state), action.action.value)
    record = _open_record(run, step_id)
    if key is not None and record.state is not EffectState.PLANNED and key != record.key:
        raise UsageError(
            f"effect {step_id!r} was submitted with key {record.key!r}; resubmit with the same "
            "key, never a new one (a new key would make the service apply it twice)"
        )
    new = submitted_record(record, service, key or record.key or "", run.now_ms())
    if not new.key:
        raise UsageError(f"effect {step_id!r} needs an idempotency key")
    # Registered before the link: a run of this process that reads this SUBMITTED sees that
    # its send may run. The block's end (or a lost commit) ends the registration.
    with inflight.sending(run, step_id):
        run.advance(_transition(record, EffectState.SUBMITTED), _replace(run, new, step_id))
        crashpoints.reach("effect.submitted")
        call = Call(run, new)
        yield call  # an exception from the body leaves the effect SUBMITTED: reconciled on resume
    if not call.settled:
        raise UsageError(
            f"the body of effect {step_id!r} ended without call.confirm(receipt) or "
            "call.not_done(reason); it stays SUBMITTED and will be reconciled on resume"
        )


def _ask(service: Service, key: str) -> Reconciled:
    if service.reconcile is None:
        raise UsageError(
            f"service {service.name!r} declared a reconcile lookup when the effect was submitted; "
            "pass a Service with reconcile=... to reconcile it"
        )
    try:
        answer = service.reconcile(key)
    except Exception as exc:  # noqa: BLE001 - any failure of the lookup means "don't know"
        return unknown(f"reconcile raised {type(exc).__name__}: {exc}")
    if not isinstance(answer, Reconciled):
        return unknown(f"reconcile returned {answer!r}, not found()/NOT_FOUND/unknown()")
    return answer


def reconcile(run: RunView, step_id: str, service: Service) -> NextAction:
    """Look an in-flight effect up by key and commit what the service says."""
    inflight.refuse(run, step_id, f"reconciling effect {step_id!r}")
    record = _open_record(run, step_id)
    if record.state not in (EffectState.SUBMITTED, EffectState.UNRESOLVED):
        raise EffectNotReadyError(step_id, record.state.value, next_action(run, step_id).action)
    answer = _ask(service, record.key or "")
    if answer.outcome is Lookup.FOUND and answer.receipt:
        run.env_unverified = False  # the effect happened: it explains any change it made
        run.advance(
            _transition(record, EffectState.CONFIRMED, answer.receipt, "reconciled: found by key"),
            _replace(run, None, step_id),
            move_frontier=True,
        )
        run.record_outcome(Outcome(step_id, run.head.seq, receipt=answer.receipt))
    elif answer.outcome is Lookup.NOT_FOUND:
        why = "the service has no operation with this key"
        new = moved_record(record, EffectState.NOT_DONE, run.now_ms(), why)
        run.advance(_transition(record, EffectState.NOT_DONE, why=why), _replace(run, new, step_id))
        _verify_environment(run)
    elif record.state is EffectState.SUBMITTED:
        why = answer.reason or "the service could not say"
        _mark_unresolved(run, record, why)
    return next_action(run, step_id)


def _mark_unresolved(run: RunView, record: EffectRecord, why: str) -> None:
    new = moved_record(record, EffectState.UNRESOLVED, run.now_ms(), why)
    run.advance(
        _transition(record, EffectState.UNRESOLVED, why=why), _replace(run, new, record.step)
    )


def _verify_environment(run: RunView) -> None:
    """The deferred gate check: nothing in flight explains a difference any more."""
    if run.env_unverified and not gate.in_flight(run.head):
        gate.check_environment(run.task_id, run.head, run.live_env())
        run.env_unverified = False


def settle(run: RunView, service: Service) -> NextAction:
    """Apply the non-sending rows of the table to the frontier effect; return what is left."""
    action = next_action(run, None)
    if action.step is not None and action.action in _SETTLING:
        inflight.refuse(run, action.step, f"settling effect {action.step!r}")
    if action.action is Action.RECONCILE and action.step is not None:
        action = reconcile(run, action.step, service)
    if action.action is Action.MARK_UNRESOLVED and action.step is not None:
        _mark_unresolved(run, _open_record(run, action.step), action.reason)
        action = next_action(run, action.step)
    if action.action is Action.ESCALATE and action.step is not None and service.reconcile:
        action = reconcile(run, action.step, service)  # a later reconcile may settle it
    return action


@attrs.frozen
class Send:
    """The perform generator's request: send the request to the service with `key` and
    send the receipt back in (the caller's send is the one thing castore does not run)."""

    key: str


def perform_steps(
    run: RunView, step_id: str, service: Service, key: str | None
) -> Generator[Send, str, str]:
    """Drive one effect to CONFIRMED per the next-action table, yielding one `Send` where
    the request must go out; returns the receipt. The one implementation of perform: the
    sync driver answers with `send(key)`, the async one with `await send(key)`. Closing the
    generator at its `Send` (an exception or a cancellation in the caller's send) leaves
    the effect SUBMITTED, as it must: the request may have left. A growing plan's effect
    goes through the replay cursor first: decided (its key durable) before anything is
    submitted; at a recorded position, its recorded receipt is returned, nothing sent."""
    if replay_effect(run, step_id) is Position.DONE:
        return run.receipt(step_id) or ""
    with effect(run, step_id, service, key) as call:
        receipt = yield Send(call.key)
        call.confirm(receipt)
    return call.receipt or ""


def replay_effect(run: RunView, step_id: str) -> Position | None:
    """`run.at(step, effect=True)` on a growing plan (None on a fixed one, whose effects
    are planned already): checked against the record on a replay, else decided."""
    return run.at(step_id, effect=True) if run.grows else None


def perform(
    run: RunView, step_id: str, service: Service, send: Callable[[str], str], key: str | None
) -> str:
    """Drive one effect to CONFIRMED per the next-action table; returns its receipt."""
    return drive(perform_steps(run, step_id, service, key), lambda request: send(request.key))


def drive(steps: Generator[R, Any, T], answer: Callable[[R], Any]) -> T:
    """RunView a step generator to its end, answering each request with `answer`; a failure in
    `answer` closes the generator (its `finally` and context managers run) and propagates."""
    try:
        request = next(steps)
        while True:
            try:
                reply = answer(request)
            except BaseException:
                steps.close()
                raise
            request = steps.send(reply)
    except StopIteration as stop:
        return cast("T", stop.value)
