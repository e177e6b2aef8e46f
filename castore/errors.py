"""The castore error tree: every error castore raises is a `CastoreError`.

    CastoreError
    ├── UsageError (ValueError)                  the caller asked for something invalid
    │   ├── InvalidTaskIdError                   a task id that cannot become a safe file name
    │   ├── InvalidObjectIdError                 not 64 lowercase hex digits
    │   ├── EncodingError                        a value outside the canonical data model
    │   ├── StepRepeatedError                    a growing plan decides a step id it has
    │   ├── PlanTooLongError                     a growing plan past MAX_GROWN_STEPS
    │   ├── UnsafeDurabilityError                a LangGraph durability mode that can lose a
    │   │                                        tool call's id (castore.langgraph.durability)
    │   └── PayloadError                         a snapshot that must not be written
    │       ├── SecretInPayloadError             a field or value that looks like a credential
    │       ├── SnapshotTooLargeError            over the per-snapshot size budget
    │       └── ObjectTooLargeError              over the size limit of any one object
    ├── StoreError                               the store directory itself
    │   ├── StoreNotFoundError (FileNotFoundError)
    │   ├── StoreExistsError (FileExistsError)
    │   ├── FormatVersionError                   written by a format this reader does not know
    │   └── StoreIOError (OSError)               a system call on a store path failed (errno)
    │       └── DurabilityError                  a write/fsync failed; nothing was published
    │           └── CommitUncertainError         the commit point was taken, its fsync failed
    ├── IntegrityError                           bytes on disk are not what they claim to be
    │   ├── ObjectMissingError (KeyError)
    │   ├── ObjectCorruptError                   hash mismatch, truncation, undecodable
    │   └── UnsafeFileError                      symlink, FIFO or directory where a file belongs
    │       └── OversizedFileError               larger than any file castore writes there
    ├── TaskNotFoundError (KeyError)
    ├── TaskExistsError
    ├── TaskForgottenError                       the task was forgotten: its id is not reused
    ├── ForgetRefusedError                       forget would drop an effect still in flight
    ├── ForkError                                the snapshot to fork from cannot be forked
    ├── TaskBusyError (TimeoutError)             another local worker holds the task's lock
    ├── ConflictError                            lost the compare-and-swap on a task's HEAD
    ├── ResumeRefusedError                       the resumption gate said no
    │   ├── ChainError (also IntegrityError)     HEAD → plan root does not verify
    │   │   └── IllegalHistoryError              hash-valid, but a link the protocol forbids
    │   ├── PlanDriftError                       the caller's plan is not the task's plan
    │   │   └── ReplayDriftError                 the agent asks, at a recorded position,
    │   │                                        for another step than the one recorded
    │   ├── EnvironmentDriftError                the live environment differs from the anchor
    │   ├── KeylessEffectError                   an in-flight effect without idempotency key
    │   └── MalformedFrontierError               frontier out of range, unknown step or version
    │       └── UnknownVersionError (also FormatVersionError)
    ├── EffectError
    │   ├── IllegalTransitionError               a state change PROTOCOL.md does not allow
    │   ├── EffectNotReadyError                  the effect's next action is not what was asked
    │   └── OutcomeUnknownError                  the effect is UNRESOLVED: a person must decide
    ├── StepInFlightError                        a send or call of the step may still run, in
    │                                            this process or another one on this host
    └── WorkerFailedError                        an fsck worker process died before its results

Every message says what to do next. Structured fields (`path`, `task`, `expected`,
`actual`, ...) let callers act without parsing text.
"""

from __future__ import annotations

import errno
import os


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
    """A value outside castore's canonical data model (see docs/FORMAT.md)."""

    def __init__(self, path: str, reason: str, advice: str = "") -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"cannot encode value at {path}: {reason}; "
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


class StoreError(CastoreError):
    """A problem with the store directory as a whole."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The path is not a castore store."""

    def __init__(self, path: str, detail: str = "", advice: str = "") -> None:
        self.path = path
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"no castore store at {path}{extra}; "
            + (
                advice
                or f"create one with `castore init {path}` or point --store / $CASTORE_STORE "
                "at an existing store"
            )
        )


class StoreExistsError(StoreError, FileExistsError):
    """`init` was asked to create a store where something already is."""

    def __init__(self, path: str, detail: str = "") -> None:
        self.path = path
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"{path} already exists and is not an empty directory{extra}; "
            "choose a new path, or open the existing store instead of initialising it"
        )


class FormatVersionError(StoreError):
    """Data written by a format version this reader does not understand."""

    def __init__(self, path: str, found: object, supported: tuple[int, ...]) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        super().__init__(
            f"{path} uses castore format version {found!r}; this castore reads "
            f"{', '.join(map(str, supported))}. Upgrade castore to read it; do not edit the store"
        )


# What a person can do about each errno, so that a permission problem never reads as a full
# disk (and the reverse). Everything else is the disk's or the filesystem's health.
_ADVICE = {
    errno.EACCES: "check the permissions: the user running castore needs read and write "
    "access to the store's directories and files (owner, group, mode)",
    errno.EPERM: "check the permissions and attributes (owner, group, mode, immutable flag) "
    "of the store's directories and files",
    errno.EROFS: "the filesystem is mounted read-only; remount it read-write",
    errno.ENOSPC: "free some space on the store's filesystem",
    errno.EDQUOT: "free some space or raise the disk quota of the user running castore",
    errno.ENOTDIR: "a component of the path is not a directory: check the store path",
    errno.EISDIR: "a directory stands where castore expects a file: inspect it by hand",
    errno.ELOOP: "a symlink stands where castore expects a real file: inspect it by hand",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
    errno.ENFILE: "the system ran out of file descriptors: close other programs or raise it",
    errno.ENAMETOOLONG: "the path is too long for this filesystem: use a shorter store path",
}
_ADVICE[errno.ENOENT] = (
    "it vanished while castore used it: another process or a person removed it; "
    "run `castore fsck` to see what the store lacks"
)
_DISK_ADVICE = "check the disk's health (dmesg) and the filesystem (mount, network)"


def io_advice(code: int | None) -> str:
    """What to do about an OSError with errno `code`: permissions, space, or the disk."""
    return _ADVICE.get(code or 0, _DISK_ADVICE)


class StoreIOError(StoreError, OSError):
    """A system call on a path of the store failed: `operation` on `path`, with `errno`.

    Raised for what the operating system refused or could not do (permissions, I/O errors,
    a path component that is not a directory), read or write; an absent file is reported by
    the error of what was looked for (StoreNotFoundError, ObjectMissingError, ...)."""

    def __init__(self, path: str, operation: str, cause: OSError, outcome: str = "") -> None:
        self.path = path
        self.operation = operation
        done = f"{outcome}; " if outcome else ""
        super().__init__(
            cause.errno,
            f"{operation} {path} failed: {_reason(cause)}; {done}{io_advice(cause.errno)}, "
            "then retry",
        )


class DurabilityError(StoreIOError):
    """A write, fsync or publish failed; nothing was published."""

    def __init__(self, path: str, operation: str, cause: OSError) -> None:
        self.path = path
        self.operation = operation
        OSError.__init__(
            self,
            cause.errno,
            f"{operation} failed for {path}: {_reason(cause)}; nothing was published. "
            f"{_capital(io_advice(cause.errno))}, then retry the call (never retry an fsync "
            "on the same file: castore starts over with a new temp file)",
        )


def _reason(cause: OSError) -> str:
    """The operating system's words for `cause` (not the message of a castore error that
    wraps it, which would repeat its own advice)."""
    return os.strerror(cause.errno) if cause.errno else str(cause)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


class CommitUncertainError(DurabilityError):
    """The commit point was taken but could not be made durable: it may or may not survive."""

    def __init__(self, path: str, cause: OSError) -> None:
        self.path = path
        self.operation = "syncing the chain directory after the commit point"
        OSError.__init__(
            self,
            cause.errno,
            f"the commit {path} was written (its chain slot exists), but syncing the chain "
            f"directory failed ({_reason(cause)}): other workers may already see it, "
            "and a power loss may still undo it. This run stops; "
            f"{io_advice(cause.errno)}, then resume the task to see where it stands",
        )


class IntegrityError(CastoreError):
    """Bytes on disk are not what their name or position says they are."""

    def __init__(self, message: str, path: str = "", object_id: str = "") -> None:
        self.path = path
        self.object_id = object_id
        super().__init__(message)


class ObjectMissingError(IntegrityError, KeyError):
    """A referenced object does not exist."""

    def __init__(self, object_id: str, path: str) -> None:
        super().__init__(
            f"object {object_id} is missing (expected at {path}); run `castore fsck` to see "
            "what else is damaged, and restore the store from a backup",
            path=path,
            object_id=object_id,
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class ObjectCorruptError(IntegrityError):
    """An object whose bytes do not hash to its name, or do not decode."""

    def __init__(self, object_id: str, path: str, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"object {object_id} at {path} is corrupt: {reason}; castore will not use it. "
            "Run `castore fsck --quarantine` and restore the object from a backup",
            path=path,
            object_id=object_id,
        )


class UnsafeFileError(IntegrityError):
    """A symlink, FIFO, device or directory where a regular file belongs."""

    def __init__(self, path: str, found: str, expected: str = "regular file") -> None:
        self.found = found
        super().__init__(
            f"{path} is a {found}, not a {expected}; castore never follows or uses it. "
            "Something outside castore planted it: inspect and remove it by hand",
            path=path,
        )


class OversizedFileError(UnsafeFileError):
    """A file larger than anything castore writes where it lies: never read into memory."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        self.found = f"file of {size} bytes (too large: at most {limit})"
        IntegrityError.__init__(
            self,
            f"{path} is too large: {size} bytes, at most {limit} (no file castore writes there "
            "is larger); castore will not read it. Something outside castore put it there: "
            "inspect it, then move it away (`castore fsck --quarantine` for objects)",
            path=path,
        )


class TaskNotFoundError(CastoreError, KeyError):
    """No task with this id exists in the store."""

    def __init__(self, task_id: str) -> None:
        self.task = task_id
        super().__init__(
            f"no task {task_id!r} in this store; start it with `store.start(...)` "
            "or list tasks with `castore status`"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class TaskExistsError(CastoreError):
    """`start` was asked to create a task that already exists."""

    def __init__(self, task_id: str) -> None:
        self.task = task_id
        super().__init__(
            f"task {task_id!r} already exists; resume it with `store.resume(...)` "
            "(or `store.open(...)`, which starts or resumes)"
        )


class TaskForgottenError(CastoreError):
    """The task ends with a tombstone (`castore forget`): it is never started or resumed
    again, and its id is never reused."""

    def __init__(self, task_id: str, when: str, who: str | None, why: str | None) -> None:
        self.task = task_id
        self.when = when
        self.who = who
        self.why = why
        reason = f" ({why})" if why else ""
        super().__init__(
            f"task {task_id!r} was forgotten at {when} by {who}{reason}; a forgotten task is "
            "never started or resumed again and its id is not reused: use a new task id "
            "(`castore fork` starts one from an earlier snapshot of another task)"
        )


class ForgetRefusedError(CastoreError):
    """forget was asked to end a task whose effect is in flight (SUBMITTED or UNRESOLVED)."""

    def __init__(self, task_id: str, step: str, state: str, key: str | None) -> None:
        self.task = task_id
        self.step = step
        self.state = state
        self.key = key
        super().__init__(
            f"task {task_id!r}: effect {step!r} is {state} (key {key}), its outcome not "
            "settled; forgetting the task would lose the only record of it. Settle it first "
            f"(resume and reconcile, or `castore resolve {task_id} {step} ...`), or forget "
            "it anyway with --force-in-flight (store.forget(..., force_in_flight=True))"
        )


class ForkError(CastoreError):
    """The snapshot asked for cannot start a fork."""

    def __init__(self, task_id: str, seq: int, reason: str, advice: str) -> None:
        self.task = task_id
        self.seq = seq
        self.reason = reason
        super().__init__(f"cannot fork task {task_id!r} at sequence {seq}: {reason}; {advice}")


class TaskBusyError(CastoreError, TimeoutError):
    """Another worker on this host holds the task's lock."""

    def __init__(self, task_id: str, waited: float) -> None:
        self.task = task_id
        self.waited = waited
        super().__init__(
            f"task {task_id!r} is held by another worker on this host (waited {waited:g}s); "
            "let it finish, or pass a longer lock_timeout"
        )


class ConflictError(CastoreError):
    """Another writer advanced the task first: this writer's commit did not happen."""

    def __init__(self, task_id: str, expected: str, actual: str, seq: int) -> None:
        self.task = task_id
        self.expected = expected
        self.actual = actual
        self.seq = seq
        super().__init__(
            f"task {task_id!r} moved on: expected HEAD {expected[:16]} but sequence {seq} is "
            f"already {actual[:16]}; this commit was not made and nothing was sent. Resume the "
            "task to continue from the new HEAD"
        )


class ResumeRefusedError(CastoreError):
    """The resumption gate refused to resume a task."""

    def __init__(self, message: str, task_id: str) -> None:
        self.task = task_id
        super().__init__(message)


class ChainError(ResumeRefusedError, IntegrityError):
    """The chain from HEAD back to the plan root does not verify."""

    def __init__(
        self,
        task_id: str,
        reason: str,
        path: str = "",
        object_id: str = "",
        *,
        seq: int | None = None,
    ) -> None:
        self.task = task_id
        self.reason = reason
        self.path = path
        self.object_id = object_id
        self.seq = seq
        where = f" at slot {seq}" if seq is not None else ""
        # Said of resume, log, status and resolve alike: none of them uses a broken chain.
        Exception.__init__(
            self,
            f"task {task_id!r}: the chain is broken{where}: {reason}. castore will not resume "
            f"the task nor show its history until it verifies: run `castore fsck --task "
            f"{task_id}` to see what is damaged, and restore the named object from a backup",
        )

    def at_slot(self, seq: int) -> ChainError:
        """The same error, saying which slot of the chain it was found at."""
        return ChainError(self.task, self.reason, self.path, self.object_id, seq=seq)


class IllegalHistoryError(ChainError):
    """Every hash verifies, but a snapshot changes its parent in a way the protocol forbids."""

    def __init__(self, task_id: str, seq: int, object_id: str, problems: list[str]) -> None:
        self.task = task_id
        self.seq = seq
        self.problems = problems
        self.reason = problems[0]
        self.path = ""
        self.object_id = object_id
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        Exception.__init__(
            self,
            f"task {task_id!r}: snapshot {seq} ({object_id}) is intact but records an illegal "
            f"history: {problems[0]}{more}; refusing to resume, since it could send a side "
            f"effect again. Run `castore fsck --task {task_id}` and restore the task from a "
            "backup; no override accepts a forged history",
        )


class PlanDriftError(ResumeRefusedError):
    """The plan given to resume is not the plan the task was started with."""

    def __init__(self, task_id: str, expected: str, actual: str, diff: str) -> None:
        self.expected = expected
        self.actual = actual
        self.diff = diff
        super().__init__(
            f"task {task_id!r} was started with plan {expected[:16]} but resume was given plan "
            f"{actual[:16]}:\n{diff}\nIf this is another job that reused the task id, give it "
            "a task id of its own: that is the usual fix (a task id names one job, for ever). "
            "To continue this task, resume it with its original plan; to change a fixed plan "
            "on purpose, accept it with an audited override: store.override(task, who=..., "
            "why=..., plan=new_plan)",
            task_id,
        )


class ReplayDriftError(PlanDriftError):
    """A resumed agent's code asked, at position `position`, for step `requested` (effect or
    not, argument digest `requested_args`), but the task recorded `recorded` there."""

    def __init__(
        self,
        task_id: str,
        position: int,
        recorded: str | None,
        requested: str,
        *,
        what: str = "",
        recorded_args: str | None = None,
        requested_args: str | None = None,
    ) -> None:
        self.position = position
        self.recorded = recorded
        self.requested = requested
        self.recorded_args = recorded_args
        self.requested_args = requested_args
        self.expected, self.actual, self.diff = str(recorded), requested, what
        found = f"step {recorded!r}" if recorded is not None else "no step"
        detail = f" ({what})" if what else ""
        ResumeRefusedError.__init__(
            self,
            f"task {task_id!r} recorded {found} at position {position}, and the agent's code "
            f"now asks for step {requested!r} there{detail}: the code no longer replays the "
            "recorded run. Run the code that made the task (same step ids, same arguments, "
            "same order), or start a new task",
            task_id,
        )


class EnvironmentDriftError(ResumeRefusedError):
    """The live environment digest differs from the anchor recorded at HEAD."""

    def __init__(self, task_id: str, expected: str | None, actual: str | None) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"task {task_id!r}: the environment changed behind its back (anchor {expected}, "
            f"live {actual}); find out what changed it, then resume with an audited override "
            "(who, why) if it is safe to continue",
            task_id,
        )


class KeylessEffectError(ResumeRefusedError):
    """An effect is in flight but has no idempotency key to reconcile or deduplicate it by."""

    def __init__(self, task_id: str, step: str) -> None:
        self.step = step
        super().__init__(
            f"task {task_id!r}: effect {step!r} is SUBMITTED without an idempotency key, so "
            "its outcome cannot be reconciled and resending could duplicate it; decide with "
            f"`castore resolve {task_id} {step} --confirmed RECEIPT | --not-done --reason TEXT`",
            task_id,
        )


class MalformedFrontierError(ResumeRefusedError):
    """The frontier at HEAD does not fit the plan."""

    def __init__(self, task_id: str, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"task {task_id!r}: malformed frontier: {reason}; the snapshot was not written by "
            "a compatible castore. Run `castore fsck --task` and do not resume blindly",
            task_id,
        )


class UnknownVersionError(MalformedFrontierError, FormatVersionError):
    """A snapshot or plan on the resume path was written by an unknown format version."""

    def __init__(self, task_id: str, cause: FormatVersionError) -> None:
        self.task = task_id
        self.reason = f"unknown format version {cause.found!r} in {cause.path}"
        self.path, self.found, self.supported = cause.path, cause.found, cause.supported
        Exception.__init__(
            self,
            f"task {task_id!r}: {cause}; refusing to resume it with this castore",
        )


class EffectError(CastoreError):
    """A problem with a side effect's lifecycle."""


class IllegalTransitionError(EffectError):
    """A state change the effect protocol does not allow."""

    def __init__(self, step: str, current: str, requested: str) -> None:
        self.step = step
        self.current = current
        self.requested = requested
        super().__init__(
            f"effect {step!r} cannot go from {current} to {requested}; see the state diagram "
            "in docs/PROTOCOL (README 'Side effects') for the allowed transitions"
        )


class EffectNotReadyError(EffectError):
    """The effect's next action is not the one that was asked for."""

    def __init__(self, step: str, state: str, next_action: str) -> None:
        self.step = step
        self.state = state
        self.next_action = next_action
        super().__init__(
            f"effect {step!r} is {state}; its next action is {next_action!r}, so it cannot "
            "be done now. Call run.next_action(step) and follow it: run.settle(service) applies "
            "the rows that do not send (reconcile, mark unresolved), run.perform(...) and "
            "`with run.effect(...)` apply every row"
        )


class OutcomeUnknownError(EffectError):
    """The effect is UNRESOLVED: castore will not guess whether it happened."""

    def __init__(self, task_id: str, step: str, key: str, reason: str | None = None) -> None:
        self.task = task_id
        self.step = step
        self.key = key
        self.reason = reason
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"task {task_id!r}: the outcome of effect {step!r} (key {key}) is unknown{why}; "
            "castore will not resend it. Check the service, then run "
            f"`castore resolve {task_id} {step} --confirmed RECEIPT` or `--not-done --reason TEXT`"
        )


class StepInFlightError(CastoreError):
    """A send or journaled call of the step may still be running: in this process (a run's
    effect block or call, or a sync function a cancelled castore.aio await left in a pool
    thread), or in another live process on this host that submitted the effect. Until it has
    ended the step may not be reconciled, sent, marked or called again (castore.run.inflight).
    `pid`: that other process, None for this one."""

    def __init__(
        self, task_id: str, step: str, doing: str, why: str, retry: str, *, pid: int | None = None
    ) -> None:
        self.task = task_id
        self.step = step
        self.doing = doing
        self.pid = pid
        super().__init__(f"task {task_id!r}: {doing} is refused: {why}; {retry}")


class WorkerFailedError(CastoreError):
    """A worker process of fsck died, or failed, before it sent all of its results."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(
            f"an fsck worker process failed: {detail}; run fsck again, or with --jobs 1 to "
            "check in one process"
        )
