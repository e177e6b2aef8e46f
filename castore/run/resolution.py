"""Decisions a person makes about a task: resolve an effect's outcome, accept drift (audited).

Each decision is its own snapshot naming who decided and why; nothing is accepted silently.
"""

from __future__ import annotations

import getpass

from castore.errors import UsageError
from castore.format import identity
from castore.format.effects import check_transition, moved_record
from castore.format.records import (
    EffectRecord,
    EffectState,
    Frontier,
    Plan,
    Transition,
    TransitionKind,
)
from castore.run import gate, inflight
from castore.run.run import Run
from castore.run.settings import planned_record


def default_actor() -> str:
    """user@host of whoever runs this process: the default `who` of a decision."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{identity.host_name()}"


def _require(text: str | None, what: str) -> str:
    if not text or not text.strip():
        raise UsageError(f"{what} is required: say who decided and why, for the audit trail")
    return text.strip()


def resolve(
    run: Run,
    step_id: str,
    *,
    receipt: str | None = None,
    not_done: bool = False,
    reason: str | None = None,
    who: str | None = None,
    submitter_ended: bool = False,
) -> str:
    """Record a person's decision on an in-flight effect: CONFIRMED with `receipt`, or
    NOT_DONE (it did not happen; it may be submitted again with the same key). NOT_DONE is
    refused while the effect's send may still run (castore.inflight): in this process, or in
    the live process of this host that submitted it, unless the person says its send has
    ended (`submitter_ended`: that process lives on, doing other work)."""
    if (receipt is None) == (not not_done):
        raise UsageError("resolve an effect either as confirmed (with a receipt) or as not done")
    if receipt is not None and not receipt.strip():
        raise UsageError("a receipt is a non-empty str: the service's id or URL for the operation")
    actor = _require(who or default_actor(), "who")
    record = _in_flight(run, step_id)
    kept = tuple(r for r in run.head.effects if r.step != step_id)
    if receipt is not None:
        target, why, effects = EffectState.CONFIRMED, reason, kept  # CONFIRMED leaves the list
        check_transition(step_id, record.state, target)
    else:
        # Not done, while a send of it may still run: nobody can know that yet.
        doing = f"resolving effect {step_id!r} as not done"
        inflight.refuse(run, step_id, doing, across_processes=not submitter_ended)
        target, why = EffectState.NOT_DONE, _require(reason, "a reason")
        effects = (*kept, moved_record(record, target, run.now_ms(), why))
    transition = Transition(
        TransitionKind.RESOLVE,
        step_id,
        effect_from=record.state,
        effect_to=target,
        receipt=receipt,
        who=actor,
        why=why,
    )
    return run.advance(transition, effects, move_frontier=receipt is not None)


def _in_flight(run: Run, step_id: str) -> EffectRecord:
    """The record of effect `step_id` if its outcome is open; else UsageError saying what
    the step is: not in the plan, a plain step, settled already, or not sent."""
    record = run.head.effect(step_id)
    if record is not None and record.state in (EffectState.SUBMITTED, EffectState.UNRESOLVED):
        return record
    raise UsageError(
        f"{_nothing_to_decide(run, step_id, record)}. Only a SUBMITTED or UNRESOLVED effect "
        "needs a decision (see `castore status`)"
    )


def _nothing_to_decide(run: Run, step_id: str, record: EffectRecord | None) -> str:
    task = run.task_id
    effect = _is_effect(run, step_id, record)
    if effect is None:
        if run.grows:
            return (
                f"task {task!r} has no step {step_id!r}: its plan grows, and no step of that "
                f"id was decided (`castore log {task}` lists the steps it has)"
            )
        return (
            f"task {task!r} has no step {step_id!r} in its plan (its effect steps: {_listed(run)})"
        )
    if not effect:
        listed = "" if run.grows else f" (its effect steps: {_listed(run)})"
        return (
            f"step {step_id!r} of task {task!r} is a plain step, not an effect step{listed}; "
            "only an effect's outcome is ever decided"
        )
    if run.done(step_id):
        return (
            f"effect {step_id!r} of task {task!r} is settled already: CONFIRMED with receipt "
            f"{run.receipt(step_id)!r}; nothing is left to decide"
        )
    if record is None:
        return f"effect {step_id!r} of task {task!r} has not been reached yet; nothing to decide"
    return (
        f"effect {step_id!r} of task {task!r} is {record.state.value}, not in flight: "
        "it will be submitted with its key when the task resumes; nothing to decide"
    )


def _is_effect(run: Run, step_id: str, record: EffectRecord | None) -> bool | None:
    """Whether the task's step `step_id` is an effect, or None if the task has no such step:
    a plan step, or (a growing plan) a step decided as it ran, done or at the frontier."""
    for step in run.plan.steps:
        if step.id == step_id:
            return step.effect
    if record is not None:  # an effect has its record from its decision until CONFIRMED
        return True
    if run.done(step_id):
        return run.outcome(step_id).effect
    frontier = run.frontier_step()
    if frontier is not None and frontier.id == step_id:
        return frontier.effect
    return None


def _listed(run: Run) -> str:
    effects = [step.id for step in run.plan.steps if step.effect]
    return ", ".join(effects) if effects else "none"


def override(
    run: Run, new_plan: Plan | None, new_plan_id: str | None, *, who: str, why: str
) -> str:
    """Accept plan and/or environment drift: a snapshot that records the new plan and the live
    environment as the task's anchor, with who accepted it and why."""
    actor, reason = _require(who, "who"), _require(why, "why")
    frontier, effects = run.head.frontier, run.head.effects
    replaced = None
    if new_plan is not None and new_plan_id is not None and new_plan_id != run.plan_id:
        if run.grows or new_plan.grows:
            # Its decided steps are the task's own history, which no remap onto another
            # plan could keep exact (their positions, the rolling digest, their keys).
            raise UsageError(
                f"task {run.task_id!r}: an override cannot change the plan of a task whose "
                "plan grows, or make a plan grow; start a new task with the new plan (a "
                "fork carries what this one did)"
            )
        frontier = _remap_frontier(run, new_plan)
        replaced = run.plan_id
        planned = planned_record(run.task_id, new_plan, new_plan_id, frontier.index, run.now_ms())
        if planned is not None and run.head.effect(planned.step) is None:
            effects = (*effects, planned)  # the new frontier is an effect: persist its key
    transition = Transition(TransitionKind.OVERRIDE, who=actor, why=reason, replaced=replaced)
    run.env_unverified = False  # the live environment is accepted as the new anchor
    snapshot_id = run.advance(transition, effects, frontier=frontier, plan_id=new_plan_id)
    if new_plan is not None and new_plan_id is not None:
        run.plan, run.plan_id = new_plan, new_plan_id
    gate.check_frontier(run.task_id, run.head, run.plan)
    return snapshot_id


def _remap_frontier(run: Run, plan: Plan) -> Frontier:
    """Where the task stands in the new plan: every step before its frontier must be done."""
    done = [run.done(s.id) for s in plan.steps]
    # The new frontier is the first step not done; nothing after it may be done already,
    # and the step the task is at (if any) must be that one.
    index = done.index(False) if False in done else len(plan.steps)
    out_of_place = [s.id for s in plan.steps[index:] if run.done(s.id)]
    step = run.head.frontier.step
    if step is not None and _index_in(plan, step) != index:
        out_of_place.append(plan.steps[index].id)
    if out_of_place:
        raise UsageError(
            f"the new plan puts {', '.join(out_of_place)} where the task's history cannot "
            "follow (steps before its next step must be done, steps after it not); castore "
            "cannot accept such a plan as the same task. Start a new task"
        )
    for record in run.head.effects:
        if not plan.steps[_index_in(plan, record.step)].effect:
            raise UsageError(
                f"the new plan makes {record.step!r} a plain step, but it is an open effect "
                f"({record.state.value}); settle or resolve it first"
            )
    return Frontier(index, plan.steps[index].id if index < len(plan.steps) else None)


def _index_in(plan: Plan, step: str) -> int:
    try:
        return plan.index(step)
    except KeyError:
        raise UsageError(
            f"the new plan has no step {step!r}, which the task is at; keep it in the plan"
        ) from None
