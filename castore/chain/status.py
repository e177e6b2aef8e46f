"""Where each task stands: HEAD, frontier, open effects with ages, and the next action."""

from __future__ import annotations

import json
from typing import Any

from castore.chain.verify import VerifiedHead
from castore.errors import CastoreError
from castore.format import codec
from castore.format.effects import Action, NextAction, effect_action, when_text
from castore.format.model import attrs
from castore.format.records import TransitionKind


@attrs.frozen
class EffectStatus:
    """One open effect as `castore status` shows it."""

    step: str
    key: str | None
    state: str
    age_s: float
    attempts: int
    next_action: str
    reason: str


@attrs.frozen
class TaskStatus:
    """One task as `castore status` shows it; `error` is set when its chain does not verify."""

    task: str
    seq: int | None = None
    head: str | None = None
    plan: str | None = None
    step: str | None = None
    finished: bool = False
    updated_ms: int | None = None
    effects: tuple[EffectStatus, ...] = ()
    next_action: str = ""
    reason: str = ""
    error: str | None = None
    forgotten: bool = False  # HEAD is a tombstone (`castore forget`): the task has ended
    # A growing plan's (format v2): steps decided at run time, and the plan digest at HEAD;
    # None (and left out of the JSON) for a fixed plan.
    decided: int | None = None
    plan_digest: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The status as a dict of JSON values (a fixed plan's leaves out `decided` and
        `plan_digest`): what each task's line of `castore status --json` holds."""
        data: dict[str, Any] = codec.to_builtins(self)
        for name in _GROWING:
            if data[name] is None:
                del data[name]
        return data

    def to_json(self) -> str:
        """The status as one line of JSON text (keys sorted)."""
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)


_GROWING = ("decided", "plan_digest")


def frontier_action(verified: VerifiedHead, now_ms: int) -> NextAction:
    """The task's next action from its HEAD alone (the capabilities recorded at submit)."""
    head = verified.head
    record = head.effect(head.frontier.step) if head.frontier.step is not None else None
    if record is not None:
        return effect_action(record, now_ms, verified.clock)
    if head.frontier.step is None and head.grown is not None and not head.grown.finished:
        return NextAction(
            Action.RUN, None, reason="a growing plan: the agent decides its next step"
        )
    if head.frontier.step is None:
        return NextAction(Action.DONE, None, reason="every step is finished")
    return NextAction(Action.RUN, head.frontier.step, reason="a plain step")


def describe(verified: VerifiedHead, now_ms: int) -> TaskStatus:
    """The status of a task from its verified HEAD (all a status shows is recorded there)."""
    head = verified.head
    effects = tuple(
        EffectStatus(
            step=record.step,
            key=record.key,
            state=record.state.value,
            age_s=max(0.0, (now_ms - record.since_ms) / 1000),
            attempts=record.attempts,
            next_action=(action := effect_action(record, now_ms, verified.clock)).action.value,
            reason=action.reason,
        )
        for record in head.effects
    )
    action = frontier_action(verified, now_ms)
    transition = head.transition
    if transition.kind is TransitionKind.FORGET:
        when = when_text(head.time_ms)
        action = NextAction(
            Action.DONE, None, reason=f"forgotten at {when} by {transition.who}: {transition.why}"
        )
        effects = ()  # the task has ended: nothing is left to do about them (log shows them)
    return TaskStatus(
        task=verified.task,
        seq=head.seq,
        head=verified.head_id,
        plan=head.plan,
        step=head.frontier.step,
        finished=head.grown.finished
        if head.grown is not None
        else head.frontier.step is None and not head.effects,
        updated_ms=head.time_ms,
        effects=effects,
        next_action=action.action.value,
        reason=action.reason,
        forgotten=transition.kind is TransitionKind.FORGET,
        decided=head.grown.steps if head.grown is not None else None,
        plan_digest=head.grown.digest if head.grown is not None else None,
    )


def broken(task_id: str, error: CastoreError) -> TaskStatus:
    """The status of a task whose chain does not verify."""
    return TaskStatus(
        task=task_id, next_action="fsck", reason="chain does not verify", error=str(error)
    )
