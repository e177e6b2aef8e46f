"""Reading a task's plan object: verified by its hash, decoded (long plans in C), or
refused with a ChainError that names the task and the object."""

from __future__ import annotations

from castore.chain.objects import ObjectStore
from castore.errors import CastoreError, ChainError, FormatVersionError, StoreIOError
from castore.format import codec
from castore.format.fastdecode import decode_canonical
from castore.format.layout import validate_object_id
from castore.format.plans import remember_digest
from castore.format.records import Plan


def check_plan_bytes(objects: ObjectStore, task_id: str, plan_id: str) -> None:
    """Check that the plan object `plan_id` is there and hashes to its id (no decoding)."""
    try:
        objects.check(plan_id)
    except (FormatVersionError, StoreIOError):
        raise
    except CastoreError as exc:
        raise ChainError(task_id, f"plan {plan_id}: {exc}", object_id=plan_id) from exc


def read_plan(objects: ObjectStore, task_id: str, plan_id: str) -> Plan:
    """A plan object, verified and decoded; ChainError (or FormatVersionError) if it is not."""
    try:
        plan_body = objects.get(validate_object_id(plan_id), "plan")
        fast = decode_canonical(plan_body, Plan)
        if fast is not None:
            # Its canonical bytes hashed to plan_id (objects.get checked): that is its digest.
            remember_digest(fast, plan_id)
            return fast
        return codec.from_builtins(codec.decode_value(plan_body), Plan)
    except (FormatVersionError, StoreIOError):
        raise
    except CastoreError as exc:
        raise ChainError(task_id, f"plan {plan_id}: {exc}", object_id=str(plan_id)) from exc
    except Exception as exc:
        raise ChainError(
            task_id, f"plan {plan_id} is not a valid plan: {exc}", object_id=plan_id
        ) from exc
