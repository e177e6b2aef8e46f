"""The legal history of a task: what may change between a snapshot and its successor.

fsck (finding `illegal-transition`) and resume (`IllegalHistoryError`) judge every link of a
chain with this one function. A snapshot can be hash-valid and still tell a history the
protocol forbids (an effect back from SUBMITTED to PLANNED, a key swapped, a frontier moved
back): resuming from it could send a side effect again, so both refuse the same things.
Nothing follows a tombstone (a `forget` transition).
"""

from __future__ import annotations

from castore.format.effects import ALLOWED
from castore.format.growth import growth_changes
from castore.format.model import attrs
from castore.format.records import EffectRecord, EffectState, Snapshot, Transition, TransitionKind

_MOVES_AN_EFFECT = (TransitionKind.EFFECT, TransitionKind.RESOLVE)
# What the service declared at the latest submission: only a SUBMITTED commit writes them.
_CAPABILITIES = ("idempotent", "retention_s", "reconcilable")
_RECORD_FIELDS = tuple(field.name for field in attrs.fields(EffectRecord))


def illegal_changes(parent: Snapshot, child: Snapshot) -> list[str]:
    """Every change from `parent` to `child` (its successor) that the protocol does not
    allow, one message each; [] for a legal link. Also accepts fsck's snapshot views."""
    if parent.transition.kind is TransitionKind.FORGET:
        # A stale writer's commit after the tombstone would bring a forgotten task back.
        return [f"sequence {child.seq} follows the tombstone at {parent.seq}: nothing follows it"]
    transition = child.transition
    moved = transition.step if transition.kind in _MOVES_AN_EFFECT else None
    problems = _frontier_changes(parent, child, moved) + growth_changes(parent, child)
    if transition.kind is TransitionKind.FORGET:
        problems += _tombstone_changes(transition)
    if moved is None and parent.effects == child.effects:
        return problems  # the common case: a plain step, no effect record changed
    before = {r.step: r for r in parent.effects}
    after = {r.step: r for r in child.effects}
    # The step the transition names is judged even when neither list has it (a forged
    # CONFIRMED for an effect confirmed long ago would otherwise pass as a change of nothing).
    named = {moved} if moved is not None else set()
    for step in sorted(set(before) | set(after) | named):
        old, new = before.get(step), after.get(step)
        if step == moved:
            problems += _moved(step, old, new, child)
        elif (problem := _unnamed(step, old, new, child.frontier.step)) is not None:
            problems.append(problem)
    if transition.receipt is not None and transition.effect_to is not EffectState.CONFIRMED:
        problems.append(
            f"{moved or transition.step}: a receipt on a transition that confirms nothing"
        )
    return problems


def _tombstone_changes(transition: Transition) -> list[str]:
    """A tombstone ends the task as HEAD left it: it names no step and moves no effect (the
    frontier and effect records stay as they were, which the other checks see to)."""
    named = [
        name
        for name in ("step", "result", "result_ref", "effect_from", "effect_to", "receipt")
        if getattr(transition, name) is not None
    ]
    return [f"a forget transition records {', '.join(named)}"] if named else []


def _unnamed(
    step: str, old: EffectRecord | None, new: EffectRecord | None, frontier: str | None
) -> str | None:
    """What is wrong with a record no transition names, if anything: it may only appear,
    as PLANNED, when the frontier reaches its step."""
    if old is None:
        if new is None or (new.state is EffectState.PLANNED and step == frontier):
            return None
        if new.state is EffectState.PLANNED:
            return (
                f"{step}: a PLANNED record appears away from the frontier ({frontier!r}): "
                "a finished effect cannot start again"
            )
        return f"{step}: None -> {new.state} without a transition naming it"
    if new is None:
        return (
            f"{step}: {old.state} -> None without a transition naming it "
            "(only a transition to CONFIRMED removes a record)"
        )
    if _fields(old) != _fields(new):
        return f"{step}: {old.state} -> {new.state} without a transition naming it"
    return None


def _fields(record: EffectRecord) -> tuple[object, ...]:
    """A record's values: fsck compares its decoded views with records, which never equal."""
    return tuple(getattr(record, name) for name in _RECORD_FIELDS)


def _moved(
    step: str, old: EffectRecord | None, new: EffectRecord | None, child: Snapshot
) -> list[str]:
    """The record of the effect the transition names, before and after it."""
    transition = child.transition
    to = transition.effect_to
    problems = []
    if transition.effect_from != (old.state if old is not None else None):
        problems.append(
            f"{step}: the transition says from {transition.effect_from}, "
            f"the parent has {old.state if old is not None else None}"
        )
    target = new.state if new is not None else to
    if old is None or target is None or target not in ALLOWED.get(old.state, ()):
        problems.append(f"{step}: {old.state if old else None} -> {target} is not allowed")
        return problems
    if to is EffectState.CONFIRMED and new is not None:
        problems.append(f"{step}: CONFIRMED, but its record stays open as {new.state}")
    elif to is not EffectState.CONFIRMED and new is None:
        problems.append(
            f"{step}: the record vanished at {old.state} -> {to}; only CONFIRMED removes it"
        )
    elif new is not None:
        if new.state is not to:
            problems.append(f"{step}: the transition says to {to}, the record is {new.state}")
        problems += _rewritten(step, old, new)
    return problems


def _rewritten(step: str, old: EffectRecord, new: EffectRecord) -> list[str]:
    """Fields a move must keep: a new key, or a later first submission (a retention window
    that seems not to have passed), or capabilities the service never declared would let a
    restart resend what it must not."""
    kept = ["key", "first_submitted_ms"]
    if old.state is EffectState.PLANNED:
        kept = []  # the first submission brings the key (maybe the caller's) and its time
    elif old.first_submitted_ms is None:
        kept = ["key"]
    if new.state is not EffectState.SUBMITTED:  # only a submission declares capabilities
        kept += _CAPABILITIES
    changed = [name for name in kept if getattr(old, name) != getattr(new, name)]
    if not changed:
        return []
    fields = ", ".join(
        f"{name} {getattr(old, name)!r} -> {getattr(new, name)!r}" for name in changed
    )
    return [f"{step}: {old.state} -> {new.state} rewrites {fields}"]


def _frontier_changes(parent: Snapshot, child: Snapshot, moved: str | None) -> list[str]:
    """The frontier moves one step, and only when a plain step finishes or an effect is
    CONFIRMED; an override (a person's audited decision) may remap it to a new plan."""
    transition = child.transition
    if transition.kind is TransitionKind.OVERRIDE or child.plan != parent.plan:
        return []
    before, after = parent.frontier, child.frontier
    finishes = transition.kind is TransitionKind.STEP or (
        moved is not None and transition.effect_to is EffectState.CONFIRMED
    )
    problems = []
    # A STEP that decides its step as it records it (format v2) finishes what it names.
    decides = transition.decided is not None and before.step is None
    if finishes and transition.step != before.step and not decides:
        problems.append(
            f"{transition.step}: finished by a {transition.kind!s}-kind transition, but the "
            f"frontier is {before.step!r}"
        )
    expected = before.index + 1 if finishes else before.index
    if after.index != expected:
        problems.append(
            f"frontier moved from {before.index} ({before.step!r}) to {after.index} "
            f"({after.step!r}) by a {transition.kind!s}-kind transition; expected {expected}"
        )
    return problems
