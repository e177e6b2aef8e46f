"""Plan validation and the plan digest."""

from __future__ import annotations

from castore import codec
from castore.digest import hash_bytes
from castore.errors import UsageError
from castore.fastdecode import encode_sorted
from castore.records import Plan, Step

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
    """The framed object bytes of a plan. Every resume hashes the caller's plan: its steps
    (all of the bytes of a long plan) are encoded in C when they hold exact types only, the
    name and meta as any record's fields are; anything else takes the general path."""
    if not _plain_steps(plan.steps):
        return codec.encode_record("plan", plan)
    try:
        steps = encode_sorted(plan.steps)
    except UnicodeEncodeError:  # a lone surrogate: the general path says where
        return codec.encode_record("plan", plan)
    body = b'{"meta":%s,"name":%s,"steps":%s}' % (
        codec.encode_value(codec.to_builtins(plan.meta)),
        codec.encode_value(plan.name),
        steps,
    )
    return codec.frame("plan", body)


def _plain_steps(steps: object) -> bool:
    """True if `steps` is a tuple of Steps made of exact strs and bools (what the general
    path encodes the same way, fastdecode.encode_sorted)."""
    return type(steps) is tuple and all(
        type(step) is Step
        and type(step.id) is str
        and type(step.effect) is bool
        and type(step.after) is tuple
        and all(type(dep) is str for dep in step.after)
        for step in steps
    )


def plan_id(plan: Plan) -> str:
    """The plan digest: the id its object has (or would have) in any store."""
    return hash_bytes(plan_bytes(plan))
