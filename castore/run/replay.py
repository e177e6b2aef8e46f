"""The replay cursor of a run: where the agent's code is, position by position, against what
the task recorded (growing plans, format v2; fixed plans take the same checks).

A resumed agent runs its code from the top: every position it passes was either recorded
(DONE: the recorded outcome stands in for the work), is decided and not done (PENDING: a
crash came during its work), or is new (a growing plan decides it, durably, before the work
starts). Code that asks, at a recorded position, for another step is drift: acting on it
would give a recorded effect's key to another request, or replay another run's results.
The DONE path costs one outcome look-up; only an error or a look-back reads history.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from castore import crashpoints
from castore.errors import ReplayDriftError, UsageError
from castore.format.plans import validate_step_id
from castore.format.records import Frontier, Snapshot, Step, Transition, TransitionKind
from castore.run.contract import Position, RunView


def _kind(effect: bool) -> str:
    return "an effect" if effect else "a plain step"


class Replay:
    """The cursor of one run (a run's `at`, `append` and `finish` are implemented here)."""

    def __init__(self, run: RunView) -> None:
        self._run = run
        self.cursor = 0

    def passed(self, index: int) -> None:
        """The step at `index` was just done: a cursor standing there moves past it (code
        that commits a step without asking `at` first keeps its place)."""
        if self.cursor == index:
            self.cursor = index + 1

    # -- at ---------------------------------------------------------------------------------
    def at(self, step_id: str, effect: bool, args: str | None) -> Position:
        validate_step_id(step_id)
        if args is not None and not isinstance(args, str):
            raise UsageError(f"args of step {step_id!r} is a digest (a str), not {args!r}")
        run, cursor = self._run, self.cursor
        frontier = run.head.frontier
        if cursor < frontier.index:
            self._check_done(cursor, step_id, effect, args)
            self.cursor += 1
            return Position.DONE
        if cursor > frontier.index:
            if frontier.step == step_id:
                # This run passed the decided step (an `at` or a call whose work raised) and
                # its work is not committed: asked again, it is the same position, checked as
                # a reopen would check it, and nothing is decided twice.
                self._check_pending(frontier.index, step_id, effect, args)
                return Position.PENDING
            raise UsageError(
                f"task {run.task_id!r}: step {frontier.step!r} at position {frontier.index} is "
                "decided and not done; do its work first, with the call that decided it (the "
                f"same run.call, run.perform or run.append), before asking for {step_id!r}"
            )
        if frontier.step is not None:
            self._check_pending(cursor, step_id, effect, args)
            self.cursor += 1
            return Position.PENDING
        self._require_growing(step_id)
        self._decide(step_id, effect, args)
        self.cursor += 1
        return Position.PENDING

    def _require_growing(self, step_id: str) -> None:
        run = self._run
        if run.finished:
            raise UsageError(
                f"task {run.task_id!r} is finished; step {step_id!r} cannot follow: start a "
                "new task (or fork this one) to go on"
            )
        if not run.grows:
            raise UsageError(
                f"task {run.task_id!r}: every step of its fixed plan {run.plan.name!r} is "
                f"done ({len(run.plan.steps)}); step {step_id!r} is beyond it. A plan that "
                "decides its steps as it runs is made with Plan.grow"
            )

    def _decide(self, step_id: str, effect: bool, args: str | None) -> str:
        """Commit the DECIDE of `step_id` (an effect's PLANNED record and key with it)."""
        run = self._run
        step = Step(step_id, effect)
        grown = run.grown_by(step, args)
        frontier = Frontier(run.head.frontier.index, step_id)
        effects = run.head.effects
        if effect:
            effects = (*effects, run.planned(step_id))
        transition = Transition(TransitionKind.DECIDE, step=step_id, decided=step, args=args)
        snapshot_id = run.advance(transition, effects, frontier=frontier, grown=grown)
        crashpoints.reach("grow.decided")
        return snapshot_id

    def _check_done(self, cursor: int, step_id: str, effect: bool, args: str | None) -> None:
        """The recorded step at `cursor` (< the frontier) is `step_id`, of that kind and
        (when both are known) with those arguments: an outcome look-up, nothing more."""
        run = self._run
        try:
            outcome = run.outcome(step_id)
        except KeyError:
            outcome = None
        base = run.plan.steps[cursor] if cursor < len(run.plan.steps) else None
        recorded: tuple[str, bool] | None
        if base is not None:
            recorded = base.id, base.effect
        elif outcome is not None and outcome.index == cursor:
            recorded = outcome.step, outcome.effect
        else:
            recorded = self._recorded_at(cursor)
        if recorded != (step_id, effect):
            self._drift(cursor, recorded, step_id, effect)
        if args is not None and outcome is not None and outcome.args not in (None, args):
            raise ReplayDriftError(
                run.task_id,
                cursor,
                step_id,
                step_id,
                what=f"recorded with arguments {outcome.args}, now called with {args}",
                recorded_args=outcome.args,
                requested_args=args,
            )

    def _check_pending(self, cursor: int, step_id: str, effect: bool, args: str | None) -> None:
        """HEAD's decision (the frontier step) is `step_id`, of that kind and arguments."""
        run = self._run
        step = run.frontier_step()
        if step is None:  # the caller saw to it: HEAD decided a step
            raise UsageError(f"task {run.task_id!r} has no decided step at {cursor}")
        if (step.id, step.effect) != (step_id, effect):
            self._drift(cursor, (step.id, step.effect), step_id, effect)
        if args is None or cursor < len(run.plan.steps):
            return
        decided = self._decision(run.head.frontier.index)
        recorded = decided.args if decided is not None else None
        if recorded is not None and recorded != args:
            raise ReplayDriftError(
                run.task_id,
                cursor,
                step_id,
                step_id,
                what=f"decided with arguments {recorded}, now called with {args}",
                recorded_args=recorded,
                requested_args=args,
            )

    def _drift(
        self, cursor: int, recorded: tuple[str, bool] | None, step_id: str, effect: bool
    ) -> None:
        if recorded is None:
            what = "the task's history no longer shows what was done there"
            raise ReplayDriftError(self._run.task_id, cursor, None, step_id, what=what)
        what = ""
        if recorded[1] != effect:
            what = f"{_kind(recorded[1])} was recorded, {_kind(effect)} is asked for"
        raise ReplayDriftError(self._run.task_id, cursor, recorded[0], step_id, what=what)

    # -- looking back (error paths, and a decision's arguments after a crash) ---------------
    def _recorded_at(self, position: int) -> tuple[str, bool] | None:
        """(step id, effect) of the step the task did at `position`, walking back from HEAD
        to the commit that moved the frontier past it."""
        mover: Snapshot | None = None
        for snapshot in self._back_from_head():
            if snapshot.frontier.index <= position:
                break
            mover = snapshot
        if mover is None or mover.transition.step is None:
            return None
        kind = mover.transition.kind
        return mover.transition.step, kind in (TransitionKind.EFFECT, TransitionKind.RESOLVE)

    def _decision(self, index: int) -> Transition | None:
        """The DECIDE transition of the frontier step at `index` (walking back from HEAD)."""
        for snapshot in self._back_from_head():
            if snapshot.frontier.index != index:
                return None
            if snapshot.transition.kind is TransitionKind.DECIDE:
                return snapshot.transition
        return None

    def _back_from_head(self) -> Iterator[Snapshot]:
        """HEAD and its ancestors, newest first, as far as the store still holds them."""
        run = self._run
        snapshot: Snapshot | None = run.head
        while snapshot is not None:
            yield snapshot
            if snapshot.parent is None:
                return
            snapshot = run.snapshot_at(snapshot.seq - 1)

    # -- append and finish --------------------------------------------------------------------
    def append(self, step_id: str, result: Any, args: str | None) -> str | None:
        run = self._run
        validate_step_id(step_id)
        frontier = run.head.frontier
        if self.cursor < frontier.index or frontier.step is not None:
            if self.at(step_id, effect=False, args=args) is Position.DONE:
                return None
            return run.commit_step(step_id, result, args=args)
        self._require_growing(step_id)
        inline, ref = run.checked_result(step_id, result)
        return run.record_step(step_id, inline, ref, args=args, decided=Step(step_id))

    def finish(self) -> str:
        run = self._run
        grown = run.head.grown
        if grown is None:
            raise UsageError(
                f"task {run.task_id!r} has a fixed plan: it is finished when its last step "
                "is done; run.finish() is for a plan made with Plan.grow"
            )
        if grown.finished:
            return run.head_id  # a rerun of the agent's code reaches its end again
        if run.head.effects:
            open_effect = run.head.effects[0]
            raise UsageError(
                f"task {run.task_id!r}: effect {open_effect.step!r} is {open_effect.state.value}; "
                "drive it to CONFIRMED (run.perform, run.settle) before run.finish()"
            )
        if run.head.frontier.step is not None:
            raise UsageError(
                f"task {run.task_id!r}: step {run.head.frontier.step!r} is decided and not "
                "done; commit it before run.finish()"
            )
        finished = type(grown)(grown.steps, grown.digest, finished=True)
        return run.advance(Transition(TransitionKind.FINISH), (), grown=finished)
