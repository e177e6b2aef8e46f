"""The resumption gate: every check that must pass before a task may resume (fail closed)."""

from __future__ import annotations

import difflib

from castore.chain.verify import VerifiedChain
from castore.errors import (
    EnvironmentDriftError,
    KeylessEffectError,
    MalformedFrontierError,
    PlanDriftError,
)
from castore.format.growth import frontier_problems
from castore.format.records import EffectState, Plan, Snapshot, Step


def describe_step(step: Step) -> str:
    kind = "effect" if step.effect else "step"
    after = f" after {', '.join(step.after)}" if step.after else ""
    return f"{kind} {step.id}{after}"


def plan_diff(expected: Plan, actual: Plan) -> str:
    """A readable diff of two plans' steps (and name and meta, if those differ)."""
    old = [f"name {expected.name}", *map(describe_step, expected.steps), f"meta {expected.meta}"]
    new = [f"name {actual.name}", *map(describe_step, actual.steps), f"meta {actual.meta}"]
    lines = difflib.unified_diff(old, new, "task's plan", "given plan", lineterm="", n=1)
    return "\n".join(line for line in lines if not line.startswith("@@"))


def check_plan(chain: VerifiedChain, plan: Plan, plan_id: str) -> None:
    """Invariant 2: the caller's plan is the task's plan."""
    if plan_id != chain.plan_id:
        raise PlanDriftError(chain.task, chain.plan_id, plan_id, plan_diff(chain.plan, plan))


def check_plan_id(chain: VerifiedChain, plan_id: str) -> None:
    """Invariant 2 for a caller that names the task's plan by its id (no plan object)."""
    if plan_id != chain.plan_id:
        raise PlanDriftError(
            chain.task,
            chain.plan_id,
            plan_id,
            f"(resumed by plan_id: the task's plan is {chain.plan.name!r} of "
            f"{len(chain.plan.steps)} steps, plan {plan_id[:16]} was named)",
        )


def check_frontier(task_id: str, head: Snapshot, plan: Plan) -> None:
    """Invariant 5: the frontier and the effect records fit the plan (a growing plan's: its
    base steps, then the steps decided so far, the frontier's maybe decided and not done)."""
    if plan.grows or head.grown is not None:
        steps = tuple(step.id for step in plan.steps)
        effects = frozenset(step.id for step in plan.steps if step.effect)
        problems = frontier_problems(steps, effects, bool(plan.grows), head)
        if problems:
            raise MalformedFrontierError(task_id, "; ".join(problems))
        return
    frontier = head.frontier
    if not 0 <= frontier.index <= len(plan.steps):
        raise MalformedFrontierError(
            task_id, f"step index {frontier.index} outside 0..{len(plan.steps)}"
        )
    expected = plan.steps[frontier.index].id if frontier.index < len(plan.steps) else None
    if frontier.step != expected:
        raise MalformedFrontierError(
            task_id, f"step {frontier.step!r} at index {frontier.index}, plan has {expected!r}"
        )
    if not head.effects:
        return  # the usual HEAD: no index of a long plan's steps to build
    position = {step.id: index for index, step in enumerate(plan.steps)}
    for record in head.effects:
        index = position.get(record.step)
        if index is None or not plan.steps[index].effect:
            raise MalformedFrontierError(
                task_id, f"effect record for unknown effect {record.step!r}"
            )
        if index > frontier.index:
            raise MalformedFrontierError(task_id, f"effect {record.step!r} is beyond the frontier")


def check_keys(task_id: str, head: Snapshot) -> None:
    """Invariant 4: nothing is in flight without an idempotency key."""
    for record in head.effects:
        if record.state is not EffectState.PLANNED and not record.key:
            raise KeylessEffectError(task_id, record.step)


def in_flight(head: Snapshot) -> bool:
    """True while an effect's outcome is still open: the environment may differ because of it."""
    return any(r.state in (EffectState.SUBMITTED, EffectState.UNRESOLVED) for r in head.effects)


def check_environment(task_id: str, head: Snapshot, live: str | None) -> None:
    """Invariant 3: the live environment is the one recorded at HEAD."""
    if head.env is not None and live != head.env:
        raise EnvironmentDriftError(task_id, head.env, live)
