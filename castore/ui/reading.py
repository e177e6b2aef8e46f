"""The tasks page's reading: every task's status from its HEAD, as `castore status` reads it,
sorted into the five states a person on call filters by (pure reading; never writes)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Literal

from castore.chain import status as chain_status
from castore.chain.planread import read_plan
from castore.chain.refs import TaskSlots
from castore.chain.status import TaskStatus
from castore.chain.verify import verify_head
from castore.errors import CastoreError, FormatVersionError, IntegrityError, TaskNotFoundError
from castore.format.model import attrs
from castore.store import Store

State = Literal["unresolved", "stuck", "broken", "running", "done"]
# The order of the counts and of the filter's links: what needs a person first.
STATES: tuple[State, ...] = ("unresolved", "stuck", "broken", "running", "done")
DEFAULT_STUCK_AFTER_S = 300.0  # castore watch's default: the same effect is stuck on both


@attrs.frozen
class Row:
    """One task of the tasks page: its status, its state, and how far its plan got."""

    status: TaskStatus
    state: State
    done_steps: int | None = None  # steps done (HEAD's frontier), None for a broken chain
    plan_steps: int | None = None  # steps in a fixed plan; None for a growing or unread plan

    @property
    def task(self) -> str:
        return self.status.task

    def age_s(self, now: float) -> float | None:
        """Seconds since the task's last commit (None if its HEAD could not be read)."""
        updated = self.status.updated_ms
        return None if updated is None else max(0.0, now - updated / 1000)

    @property
    def steps_text(self) -> str:
        if self.done_steps is None:
            return "-"
        if self.status.decided is not None:
            return f"{self.done_steps} ({self.status.decided} decided)"
        if self.plan_steps is None:
            return str(self.done_steps)
        return f"{self.done_steps}/{self.plan_steps}"

    @property
    def next_text(self) -> str:
        """The next step and what a restart does there: `charge (submit)`, or `done`."""
        status = self.status
        if status.error:
            return "fsck"
        if status.finished or status.forgotten:
            return "done"
        step = status.step or "its next decision"
        return f"{step} ({status.next_action})"


def state_of(status: TaskStatus, stuck_after: float) -> State:
    """What a person filters by: a broken chain first (its effects cannot be known), then an
    effect UNRESOLVED, then one SUBMITTED longer than `stuck_after` (as `castore watch`
    judges it), then finished or forgotten tasks, and the rest is running."""
    if status.error:
        return "broken"
    if any(effect.state == "UNRESOLVED" for effect in status.effects):
        return "unresolved"
    if any(e.state == "SUBMITTED" and e.age_s >= stuck_after for e in status.effects):
        return "stuck"
    if status.finished or status.forgotten:
        return "done"
    return "running"


class TaskReader:
    """Reads rows from one store; remembers plans by id (immutable objects, shared by many
    tasks), so that 5,000 tasks of one plan cost one plan read."""

    def __init__(self, store: Store, stuck_after: float = DEFAULT_STUCK_AFTER_S) -> None:
        self.store = store
        self.stuck_after = stuck_after
        self._plan_steps: dict[str, int | None] = {}

    def rows(self, tasks: Iterable[str] | None = None) -> list[Row]:
        """A row for each task (every task of the store by default), sorted by id; a task
        that went away while it was being read (forgotten and collected) is left out."""
        found = []
        now_ms = time.time_ns() // 1_000_000
        for task in self.store.tasks() if tasks is None else tasks:
            row = self.row(task, now_ms)
            if row is not None:
                found.append(row)
        return found

    def row(self, task: str, now_ms: int) -> Row | None:
        """The row of one task, from HEAD alone (status's reading: `Store.status`, with
        HEAD's frontier kept for the step count); None if the task is no longer there."""
        slots = TaskSlots(self.store.medium, self.store.objects, task)
        try:
            self.store.medium.require_dir(slots.task_key)
            verified = verify_head(slots)
        except TaskNotFoundError:
            return None
        except (IntegrityError, FormatVersionError) as exc:  # a planted file included
            broken = chain_status.broken(task, exc)
            return Row(broken, "broken")
        status = chain_status.describe(verified, now_ms)
        head = verified.head
        plan_steps = None if head.grown is not None else self._steps_of(task, head.plan)
        return Row(status, state_of(status, self.stuck_after), head.frontier.index, plan_steps)

    def _steps_of(self, task: str, plan_id: str) -> int | None:
        if plan_id not in self._plan_steps:
            try:
                self._plan_steps[plan_id] = len(read_plan(self.store.objects, task, plan_id).steps)
            except (CastoreError, OSError):
                return None  # the step count is a nicety: the task page says what is wrong
        return self._plan_steps[plan_id]


def counts(rows: Iterable[Row]) -> dict[str, int]:
    """How many tasks are in each state, and in all (`tasks`)."""
    found = dict.fromkeys(("tasks", *STATES), 0)
    for row in rows:
        found["tasks"] += 1
        found[row.state] += 1
    return found


def age_text(seconds: float | None) -> str:
    """An age for people, as `castore status` gives it: 45s, 5.0m, 1.5h, 2.0d."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
