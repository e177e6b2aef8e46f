"""A task being worked on: its verified HEAD, and commits that advance it one step at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from castore.chain.briefview import view_of
from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcome
from castore.chain.refs import TaskSlots
from castore.chain.trees import stored_result
from castore.chain.verify import VerifiedChain
from castore.errors import (
    PlanTooLongError,
    StepRepeatedError,
    UsageError,
)
from castore.format import limits
from castore.format.effects import NextAction, Service
from castore.format.layout import validate_object_id
from castore.format.plans import roll_digest, validate_step_id
from castore.format.records import Grown, Step, Transition, TransitionKind
from castore.medium.tasklock import HeldLock
from castore.run import journal, protocol
from castore.run.brief import Brief, make_brief
from castore.run.contract import Position
from castore.run.core import RunCore
from castore.run.replay import Replay
from castore.run.settings import (
    RunSettings,
)

if TYPE_CHECKING:
    from castore.run.protocol import Call

_REACHED_KEPT = 1 << 16  # object ids remembered as reached by this run's commits


class Run(RunCore):
    """The handle an agent works through. Only a run whose commits keep winning may act."""

    def __init__(
        self,
        objects: ObjectStore,
        slots: TaskSlots,
        chain: VerifiedChain,
        settings: RunSettings,
        lock: HeldLock | None,
    ) -> None:
        super().__init__(objects, slots, chain, settings, lock)
        self._replay = Replay(self)

    @property
    def position(self) -> int:
        """The replay cursor: how many positions the agent's code has passed (via `at`,
        `decide`, `append`) in this process; 0 on every start and resume."""
        return self._replay.cursor

    def at(self, step_id: str, *, effect: bool = False, args: str | None = None) -> Position:
        """The agent's code is at its next position and wants step `step_id` (an effect if
        `effect`; `args`, a journaled call's argument digest). DONE: the step is recorded
        there (its outcome is `run.outcome(step_id)`). PENDING: it is decided and not done,
        maybe by this call, which commits the decision (a growing plan) before it returns;
        do its work and commit it (asked again before that, as a retry after the work
        raised asks, it is PENDING again). PlanDriftError (ReplayDriftError) if the task recorded
        another step, kind or argument digest there."""
        return self._replay.at(step_id, effect, args)

    def decide(self, step_id: str, *, effect: bool = False, args: str | None = None) -> None:
        """`at`, for a step that must not be done yet: UsageError if it is."""
        if self.at(step_id, effect=effect, args=args) is Position.DONE:
            raise UsageError(
                f"step {step_id!r} of task {self.task_id!r} is done already (position "
                f"{self.position - 1}); use run.at() to replay it"
            )

    def append(self, step_id: str, result: Any = None, *, args: str | None = None) -> str | None:
        """Decide plain step `step_id` and record its `result` in one commit (a growing
        plan; data already in hand). At a position already recorded it checks the step is
        the one recorded and commits nothing (returns None); else the snapshot id."""
        return self._replay.append(step_id, result, args)

    def finish(self) -> str:
        """A growing task says it is done (a FINISH commit; nothing but seal or forget may
        follow); returns HEAD's id. Refused while a step is decided and not done."""
        return self._replay.finish()

    @property
    def next_step(self) -> str | None:
        """The step to do next, or None when every step is done."""
        return self.head.frontier.step

    def pending(self) -> Iterator[str]:
        """Yield the next step until the plan is done; the caller commits each one."""
        while (step := self.next_step) is not None:
            yield step
            if self.next_step == step:
                raise UsageError(
                    f"step {step!r} was yielded but not committed; commit it with "
                    "run.commit_step(...) (or run its effect) before asking for the next one"
                )

    # -- journaled calls (the rules are in castore.run.journal) ------------------------------
    def call(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once as plain step `step_id` and record its result; a
        replay returns the recorded result without calling `fn`. Wrap `fn` with
        `castore.vouch(fn, "$.field")` to vouch for model output the secret guard refuses."""
        return journal.call(self, step_id, fn, args, kwargs)

    def brief(self, *, budget_tokens: int = 512, now_ms: int | None = None) -> Brief:
        """The resume brief of this task (castore.run.brief.make_brief), from what the run holds."""
        view = view_of(
            self.task_id,
            self.head,
            self.head_id,
            self.plan,
            clock=self.chain_clock,
            outcomes=self._outcomes,
        )
        return make_brief(view, budget_tokens=budget_tokens, now_ms=now_ms)

    # -- effects (the protocol itself is in castore.run.protocol) --------------------------
    def next_action(self, step_id: str | None = None) -> NextAction:
        """The one next action for `step_id` (default: the frontier step), per the table of
        docs/explanation/protocol.md."""
        return protocol.next_action(self, step_id)

    def effect(
        self, step_id: str, service: Service, *, key: str | None = None
    ) -> AbstractContextManager[Call]:
        """Submit effect `step_id`: SUBMITTED is durable before the body runs; the body
        sends the request with `call.key` and ends with `call.confirm(receipt)`."""
        protocol.replay_effect(self, step_id)
        return protocol.effect(self, step_id, service, key)

    def perform(
        self, step_id: str, service: Service, send: Callable[[str], str], *, key: str | None = None
    ) -> str:
        """Drive effect `step_id` to CONFIRMED whatever its state: submit, resubmit, reconcile
        or mark it unresolved, per the next-action table. Returns the receipt.
        StepInFlightError while a send of it may still run, in any run of this process or
        in the live process of this host that submitted it (castore.run.inflight): the service
        may not have it yet."""
        return protocol.perform(self, step_id, service, send, key)

    def reconcile(self, step_id: str, service: Service) -> NextAction:
        """Ask the service by key what happened to an in-flight effect, and commit the answer."""
        return protocol.reconcile(self, step_id, service)

    def settle(self, service: Service) -> NextAction:
        """After a restart: reconcile or mark unresolved the frontier effect, as the table says;
        returns what is left to do (submit, resubmit, skip, escalate, ...)."""
        return protocol.settle(self, service)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(finish=exc is None)

    # -- committing ----------------------------------------------------------------------
    def commit_step(self, step_id: str, result: Any = None, *, args: str | None = None) -> str:
        """Record that plain step `step_id` finished with `result`; returns the snapshot id.
        `args`: the argument digest of a journaled call, recorded with it (format v2).

        Pass a `BlobRef` from `store.put_blob(...)` for a large result.
        """
        step = self._frontier_step(step_id)
        if step.effect:
            raise UsageError(
                f"step {step_id!r} is an effect: run it with `with run.effect({step_id!r}) as "
                "call:` so its key is persisted before the request"
            )
        inline, ref = self.checked_result(step_id, result)
        return self.record_step(step_id, inline, ref, args=args)

    def checked_result(self, step_id: str, result: Any) -> tuple[Any, str | None]:
        """(inline value, object id) of step `step_id`'s result: a stored object's reference
        must name an object of its kind in this store."""
        stored = stored_result(result)  # a BlobRef, RawRef or TreeRef: (id, kind)
        inline, ref = (None, stored[0]) if stored else (result, None)
        if ref is not None:
            self._objects.restore(validate_object_id(ref))  # gc took it before this commit
        kind = self._objects.kind_of(stored[0]) if stored is not None else None
        if stored is not None and kind is None:
            # gc on another client may remove it between restore's look and this read (the
            # look answered from a cache): store it again if this process has its bytes.
            self._objects.restore(stored[0], known_gone=True)
            kind = self._objects.kind_of(stored[0])
        if stored is not None and kind != stored[1]:
            raise UsageError(
                f"{stored[1]} {ref} is not in this store; store it with store.put_{stored[1]}()"
            )
        return inline, ref

    def record_step(
        self,
        step_id: str,
        inline: Any,
        ref: str | None,
        *,
        args: str | None = None,
        decided: Step | None = None,
    ) -> str:
        """Commit the STEP transition of `step_id` (checked by the caller); `decided`: the
        step is decided by this very commit (a growing plan's `append`)."""
        transition = Transition(
            TransitionKind.STEP,
            step=step_id,
            result=inline,
            result_ref=ref,
            decided=decided,
            args=args,
        )
        grown = None
        if decided is not None:
            grown = self.grown_by(decided, args)
        index = self.head.frontier.index
        snapshot_id = self.advance(transition, self.head.effects, move_frontier=True, grown=grown)
        self._outcomes.record(Outcome(step_id, self.head.seq, inline, ref, args=args, index=index))
        self._replay.passed(index)
        return snapshot_id

    def grown_by(self, step: Step, args: str | None) -> Grown:
        """HEAD's `grown` once `step` is decided (refusing a repeat or a plan too long)."""
        grown = self.head.grown
        if grown is None:
            raise UsageError(
                f"task {self.task_id!r} has a fixed plan ({self.plan.name!r}): only a plan "
                "made with Plan.grow decides steps as it runs"
            )
        if grown.finished:
            raise UsageError(f"task {self.task_id!r} is finished: nothing more may be decided")
        if grown.steps >= limits.MAX_GROWN_STEPS:
            raise PlanTooLongError(self.task_id, limits.MAX_GROWN_STEPS)
        validate_step_id(step.id)
        repeated, first = self._first_position(step.id)
        if repeated:
            raise StepRepeatedError(self.task_id, step.id, first)
        return Grown(grown.steps + 1, roll_digest(grown.digest, step, args))

    def _first_position(self, step_id: str) -> tuple[bool, int | None]:
        """(True, its position) if the task has step `step_id` already, else (False, None)."""
        if self._base_ids is None:
            self._base_ids = {step.id: position for position, step in enumerate(self.plan.steps)}
        if step_id in self._base_ids:
            return True, self._base_ids[step_id]
        if self.head.frontier.step == step_id:
            return True, self.head.frontier.index
        if self._outcomes.has(step_id):
            return True, self._outcomes[step_id].index
        return False, None

    def frontier_step(self) -> Step | None:
        """The step at the frontier (decided, not done), or None."""
        frontier = self.head.frontier
        if frontier.step is None:
            return None
        if frontier.index < len(self.plan.steps):
            return self.plan.steps[frontier.index]
        # A decided step: an effect has its record (PLANNED at least) until it is CONFIRMED.
        return Step(frontier.step, self.head.effect(frontier.step) is not None)

    def _frontier_step(self, step_id: str) -> Step:
        step = self.frontier_step()
        if step is None or step.id != step_id:
            what = "the next step" if not self.grows else "the decided step"
            raise UsageError(
                f"step {step_id!r} is not {what} of task {self.task_id!r} "
                f"(next: {self.head.frontier.step!r}); steps run in plan order"
                + ("; decide it first with run.at() or run.decide()" if self.grows else "")
            )
        return step
