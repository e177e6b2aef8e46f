"""Errors of a task: finding, resuming, advancing it, its effects (castore.errors)."""

from __future__ import annotations

from castore.errors.storage import FormatVersionError, IntegrityError
from castore.errors.usage import CastoreError


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
    """Another worker on this host holds the task's lock (or, on S3, its lease)."""

    def __init__(self, task_id: str, waited: float, *, lease: bool = False) -> None:
        self.task = task_id
        self.waited = waited
        self.lease = lease
        holder = "leased by another worker" if lease else "held by another worker on this host"
        super().__init__(
            f"task {task_id!r} is {holder} (waited {waited:g}s); "
            "let it finish, or pass a longer lock_timeout"
            + (" (a dead holder's lease is taken over after its term)" if lease else "")
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
