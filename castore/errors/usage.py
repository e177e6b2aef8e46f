"""The root of the error tree and the errors of a caller's request (castore.errors)."""

from __future__ import annotations


class CastoreError(Exception):
    """Root of every error castore raises."""


class UsageError(CastoreError, ValueError):
    """The caller asked for something invalid; nothing was changed."""


class StepRepeatedError(UsageError):
    """A growing plan decides a step id that the task already has (at `first`)."""

    def __init__(self, task_id: str, step_id: str, first: int | None) -> None:
        self.task = task_id
        self.step = step_id
        self.first = first
        where = f" at position {first}" if first is not None else ""
        super().__init__(
            f"task {task_id!r} already has step {step_id!r}{where}; step ids in a task are "
            "unique (its effect key derives from it): name each step after what makes it "
            "distinct, e.g. 'search-3' or 'charge-order-17'"
        )


class PlanTooLongError(UsageError):
    """A growing plan would grow past `limit` decided steps."""

    def __init__(self, task_id: str, limit: int) -> None:
        self.task = task_id
        self.limit = limit
        super().__init__(
            f"task {task_id!r} has decided {limit} steps, the most a growing plan may "
            "(castore.format.limits.MAX_GROWN_STEPS); finish it and continue in a new task (a fork "
            "carries its outcomes)"
        )


class InvalidTaskIdError(UsageError):
    """A task id that cannot be mapped to a safe file name."""

    def __init__(self, task_id: object, reason: str) -> None:
        self.task_id = task_id
        self.reason = reason
        super().__init__(
            f"invalid task id {task_id!r}: {reason}; choose a non-empty printable id in NFC "
            "form whose directory name fits 240 bytes (a-z, 0-9, '-', '_' take 1 byte, "
            "others 3)"
        )


class InvalidObjectIdError(UsageError):
    """An object id that is not exactly 64 lowercase hex digits."""

    def __init__(self, object_id: object) -> None:
        self.object_id = object_id
        super().__init__(
            f"invalid object id {object_id!r}: an object id is 64 lowercase hex digits "
            "(a blake3 digest); copy it from `castore log` or `castore status`"
        )


class EncodingError(UsageError):
    """A value outside castore's canonical data model (see docs/FORMAT.md).

    `path` is where in the record the value sits ('$.transition.result.when'); `found`, if
    the encoder knows it, what the value is, worded to follow its place ("is a datetime,
    ..."); `subject` names that place for a person ("step 'a' of task 'nj-1': the result's
    field 'when'"), and the path is then only the detail in brackets."""

    def __init__(
        self,
        path: str,
        reason: str,
        advice: str = "",
        *,
        found: str | None = None,
        subject: str | None = None,
    ) -> None:
        self.path = path
        self.reason = reason
        self.advice = advice
        self.found = found
        self.subject = subject
        if subject is None:
            head = f"cannot encode value at {path}: {reason}"
        elif found is not None:
            head = f"{subject} {found} (at {path})"
        else:
            head = f"{subject}: {reason} (at {path})"
        super().__init__(
            f"{head}; "
            + (
                advice
                or "use only None, bool, 64-bit int, finite float, str and lists/dicts of "
                "those (dict keys are str); store bytes with `store.put_raw(data)` and record "
                "the RawRef it returns"
            )
        )


class PayloadError(UsageError):
    """A snapshot that castore refuses to write."""


class SecretInPayloadError(PayloadError):
    """A field name or value that looks like a credential."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(
            f"refusing to store {path}: {why}; checkpoints must not hold credentials. Keep "
            "the secret outside castore, or name the field in allow_fields if it is not secret"
        )


class SnapshotTooLargeError(PayloadError):
    """The encoded snapshot exceeds the store's size budget."""

    def __init__(self, size: int, budget: int, biggest: str) -> None:
        self.size = size
        self.budget = budget
        self.biggest = biggest
        super().__init__(
            f"snapshot would be {size} bytes, over the budget of {budget}; the largest part is "
            f"{biggest}. Store a large result with `store.put_blob(value)` (bytes: "
            "`store.put_raw(data)`) and record the reference it returns instead"
        )


class ObjectTooLargeError(PayloadError):
    """An object body larger than any castore writes (or reads back)."""

    def __init__(self, kind: str, size: int, limit: int) -> None:
        self.kind = kind
        self.size = size
        self.limit = limit
        super().__init__(
            f"a {kind} of {size} bytes is over castore's limit of {limit} bytes for one "
            "object; split it into several objects (`store.put_blob(value)`, bytes: "
            "`store.put_raw(data)`) and record their references (`store.put_tree` names many)"
        )
