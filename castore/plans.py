"""Plan validation and the plan digest."""

from __future__ import annotations

from castore import codec
from castore.digest import hash_bytes
from castore.errors import UsageError
from castore.records import Plan

MAX_STEP_ID = 200


def validate_plan(plan: Plan) -> None:
    """Refuse a plan castore could not run: no steps, bad or duplicate ids, forward deps."""
    if not plan.steps:
        raise UsageError(f"plan {plan.name!r} has no steps; give it at least one")
    seen: set[str] = set()
    for step in plan.steps:
        if not isinstance(step.id, str) or not step.id or len(step.id) > MAX_STEP_ID:
            raise UsageError(
                f"step id {step.id!r}: use a non-empty str of at most {MAX_STEP_ID} chars"
            )
        if not step.id.isprintable():  # status and log print it: one id, one line, as is
            raise UsageError(
                f"step id {step.id!r} is not printable (a control, format or separator "
                "character other than space); choose one that prints as itself"
            )
        if step.id in seen:
            raise UsageError(f"plan {plan.name!r} has step {step.id!r} twice; step ids are unique")
        for dep in step.after:
            if dep not in seen:
                raise UsageError(
                    f"step {step.id!r} runs after {dep!r}, which is not an earlier step; "
                    "list steps in an order that respects their dependencies"
                )
        seen.add(step.id)


def plan_bytes(plan: Plan) -> bytes:
    """The framed object bytes of a plan."""
    return codec.encode_record("plan", plan)


def plan_id(plan: Plan) -> str:
    """The plan digest: the id its object has (or would have) in any store."""
    return hash_bytes(plan_bytes(plan))
