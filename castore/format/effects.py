"""The side-effect protocol: effect states, legal transitions and the next action per state.

This module decides; `run` commits. Nothing here touches the store, so every row of the
next-action table (docs/explanation/protocol.md) is a pure function of an effect record,
what its service can do, and the time.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from datetime import timedelta

from castore.errors import IllegalTransitionError, UsageError
from castore.format.model import attrs
from castore.format.records import EffectRecord, EffectState

_S = EffectState
# How far castore assumes the clocks of a task's writers and of its services may disagree
# without showing it (the value Kerberos tolerates). A resubmission relies on the service's
# retention window, measured by the service's clock from a time another host's clock wrote
# down: the window castore uses is the declared retention minus this, and any skew the chain
# itself shows, however small, means no automatic resubmission at all.
CLOCK_TOLERANCE_MS = 5 * 60 * 1000
# The protocol's transitions (docs/explanation/protocol.md), plus SUBMITTED → SUBMITTED: a
# resubmission with the same key is committed too, so that only the worker whose commit won
# may send it.
ALLOWED: dict[EffectState, frozenset[EffectState]] = {
    _S.PLANNED: frozenset({_S.SUBMITTED}),
    _S.SUBMITTED: frozenset({_S.SUBMITTED, _S.CONFIRMED, _S.UNRESOLVED, _S.NOT_DONE}),
    _S.UNRESOLVED: frozenset({_S.CONFIRMED, _S.NOT_DONE}),
    _S.NOT_DONE: frozenset({_S.SUBMITTED}),
    _S.CONFIRMED: frozenset(),
}


def check_transition(step: str, current: EffectState, requested: EffectState) -> None:
    """Raise IllegalTransitionError unless the protocol allows current → requested."""
    if requested not in ALLOWED[current]:
        raise IllegalTransitionError(step, current.value, requested.value)


class Lookup(enum.Enum):
    """What a service's reconcile(key) found."""

    FOUND = "found"
    NOT_FOUND = "not-found"
    UNKNOWN = "unknown"


@attrs.frozen
class Reconciled:
    """The answer of a reconcile(key) callback. Build it with found(), NOT_FOUND or unknown()."""

    outcome: Lookup
    receipt: str | None = None
    reason: str | None = None


def found(receipt: str) -> Reconciled:
    """The service has the operation: here is its receipt."""
    return Reconciled(Lookup.FOUND, receipt=receipt)


NOT_FOUND = Reconciled(Lookup.NOT_FOUND)


def unknown(reason: str) -> Reconciled:
    """The service could not say (timeout, outage, ambiguous answer)."""
    return Reconciled(Lookup.UNKNOWN, reason=reason)


def _seconds(value: float | timedelta | None) -> int | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise UsageError(f"retention {value!r} is negative; give seconds or a timedelta >= 0")
    return int(seconds)


@attrs.frozen
class Service:
    """What the service behind an effect can do; decides what a restart may do about it.

    `idempotent`: the service deduplicates requests by idempotency key for `retention`
    (seconds or a timedelta). `reconcile(key)`: a lookup by key returning found(receipt),
    NOT_FOUND or unknown(reason). With neither, an interrupted effect becomes UNRESOLVED.
    """

    name: str
    idempotent: bool = False
    retention: int | None = attrs.field(default=None, converter=_seconds)
    reconcile: Callable[[str], Reconciled] | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.idempotent and self.retention is None:
            raise UsageError(
                f"service {self.name!r} is idempotent but declares no retention; say how long "
                "it deduplicates keys (e.g. retention=timedelta(hours=24))"
            )


class Action(enum.StrEnum):
    """The one thing to do next for a step (docs/explanation/protocol.md, 'What a restart does')."""

    RUN = "run"  # a plain step: run it and commit its result
    SUBMIT = "submit"  # commit SUBMITTED, then send with the key
    RESUBMIT = "resubmit"  # commit the resubmission, send again with the same key
    RECONCILE = "reconcile"  # ask the service by key what happened
    MARK_UNRESOLVED = "mark-unresolved"  # commit UNRESOLVED: the outcome cannot be known
    ESCALATE = "escalate"  # UNRESOLVED: alert, wait for `castore resolve` or a reconcile
    SKIP = "skip"  # CONFIRMED: continue with the next step
    DONE = "done"  # every step is finished


@attrs.frozen
class NextAction:
    """The next action for one step, with the reason a person can read."""

    action: Action
    step: str | None
    state: EffectState | None = None
    key: str | None = None
    reason: str = ""


@attrs.frozen
class ChainClock:
    """What a task's chain shows of its writers' clocks: its latest time and the largest
    step back in time from a snapshot to its successor (two writers' clocks disagreeing)."""

    latest_ms: int | None = None
    latest_seq: int | None = None
    backwards_ms: int = 0
    backwards_seq: int | None = None

    def seen(self, seq: int, time_ms: int) -> ChainClock:
        """With snapshot `seq` written at `time_ms` taken into account."""
        if self.latest_ms is not None and time_ms <= self.latest_ms:
            return self
        # The constructor, not attrs.evolve (which looks the fields up): once per commit.
        return ChainClock(time_ms, seq, self.backwards_ms, self.backwards_seq)

    def linked(self, parent_ms: int, seq: int, time_ms: int) -> ChainClock:
        """With snapshot `seq` (at `time_ms`) following a parent written at `parent_ms`."""
        clock = self.seen(seq, time_ms)
        if parent_ms - time_ms > clock.backwards_ms:
            clock = ChainClock(clock.latest_ms, clock.latest_seq, parent_ms - time_ms, seq)
        return clock


def when_text(time_ms: int) -> str:
    """A recorded time as a person reads it: UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time_ms / 1000))


def span(ms: int) -> str:
    """A duration as a person reads it."""
    if ms >= 3_600_000:
        return f"{ms / 3_600_000:.1f} h"
    if ms >= 60_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 1000:.1f} s"


def clock_doubt(record: EffectRecord, now_ms: int, clock: ChainClock | None) -> str | None:
    """Why this host's clock cannot be trusted to say whether the retention window of
    `record` is still open (clock skew, and by how much), or None."""
    first = record.first_submitted_ms
    if first is not None and now_ms < first:
        return (
            f"clock skew: the first submission is dated {span(first - now_ms)} after this "
            "host's clock (a negative age)"
        )
    if clock is None:
        return None
    if clock.latest_ms is not None and clock.latest_ms > now_ms:
        return (
            f"clock skew: snapshot {clock.latest_seq} of the task is dated "
            f"{span(clock.latest_ms - now_ms)} after this host's clock"
        )
    if clock.backwards_ms > 0:
        return (
            f"clock skew: snapshot {clock.backwards_seq} is dated {span(clock.backwards_ms)} "
            "before its parent (the task's writers' clocks disagree)"
        )
    return None


def effect_action(record: EffectRecord, now_ms: int, clock: ChainClock | None = None) -> NextAction:
    """The next action for an open effect record, from what its service declared at submit.
    `clock` is what the task's chain shows of its writers' clocks (a resubmission trusts the
    retention window only when nothing there contradicts this host's clock)."""
    state = record.state
    if state in (_S.PLANNED, _S.NOT_DONE):
        why = "not sent yet" if state is _S.PLANNED else "proved not applied; same key"
        return NextAction(Action.SUBMIT, record.step, state, record.key, why)
    if state is _S.UNRESOLVED:
        why = record.reason or "outcome unknown"
        return NextAction(Action.ESCALATE, record.step, state, record.key, why)
    if record.reconcilable:
        return NextAction(Action.RECONCILE, record.step, state, record.key, "look it up by key")
    if record.idempotent:
        return _idempotent_action(record, now_ms, clock)
    why = "the service can neither deduplicate nor be asked: the outcome is unknown"
    return NextAction(Action.MARK_UNRESOLVED, record.step, state, record.key, why)


def _idempotent_action(record: EffectRecord, now_ms: int, clock: ChainClock | None) -> NextAction:
    """SUBMITTED, and the service only deduplicates: resubmit only inside a window that no
    clock reading contradicts."""
    state = record.state
    doubt = clock_doubt(record, now_ms, clock)
    if doubt is not None:
        why = (
            f"{doubt}; castore cannot tell whether the service still deduplicates key "
            f"{record.key}, so it will not resubmit. Check the service, then record what it "
            "says with `castore resolve`"
        )
        return NextAction(Action.MARK_UNRESOLVED, record.step, state, record.key, why)
    if within_retention(record, now_ms):
        why = "the service deduplicates this key"
        return NextAction(Action.RESUBMIT, record.step, state, record.key, why)
    why = (
        f"retention of {record.retention_s}s (less {CLOCK_TOLERANCE_MS // 1000}s for clock "
        "skew) passed: a resubmission would be a new operation"
    )
    return NextAction(Action.MARK_UNRESOLVED, record.step, state, record.key, why)


def within_retention(record: EffectRecord, now_ms: int) -> bool:
    """True while the service surely still deduplicates the key: counted from the FIRST
    submission (the earliest moment the service may have applied it), never for a negative
    age, and ending CLOCK_TOLERANCE_MS before the declared retention does."""
    if record.retention_s is None or record.first_submitted_ms is None:
        return False
    age = now_ms - record.first_submitted_ms
    return 0 <= age < record.retention_s * 1000 - CLOCK_TOLERANCE_MS


def submitted_record(record: EffectRecord, service: Service, key: str, now_ms: int) -> EffectRecord:
    """The record after a (re)submission is committed: its capabilities are recorded so a
    restart (or `castore status`) can decide without the code that declared them."""
    check_transition(record.step, record.state, _S.SUBMITTED)
    return attrs.evolve(
        record,
        key=key,
        state=_S.SUBMITTED,
        since_ms=now_ms,
        attempts=record.attempts + 1,
        first_submitted_ms=record.first_submitted_ms or now_ms,
        idempotent=service.idempotent,
        retention_s=service.retention,
        reconcilable=service.reconcile is not None,
        reason=None,
    )


def moved_record(
    record: EffectRecord, state: EffectState, now_ms: int, reason: str | None = None
) -> EffectRecord:
    """The record after a transition to UNRESOLVED or NOT_DONE."""
    check_transition(record.step, record.state, state)
    return attrs.evolve(record, state=state, since_ms=now_ms, reason=reason)
