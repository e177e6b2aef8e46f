"""Retention: forget every task that finished long enough ago (`gc --forget-finished-after`).

A task qualifies when its HEAD is finished (no step left, no effect record open), is not a
tombstone already, and is older than the retention period by its own time stamp. That time
was written by the worker's clock, which may be off: a HEAD is old only once it is older
than the period plus the clock tolerance castore assumes everywhere (effects.py), so a HEAD
dated in the future is never old. Off unless asked for.
"""

from __future__ import annotations

from castore.errors import ConflictError, UsageError
from castore.format.effects import CLOCK_TOLERANCE_MS
from castore.format.model import attrs
from castore.run.resolution import default_actor
from castore.store import Store


@attrs.frozen
class Retired:
    """A task retention forgot (or, in a dry run, would forget)."""

    task: str
    head: str
    age_s: float


def old_enough(head_time_ms: int, now_ms: int, after_s: float) -> bool:
    """True if a HEAD written at `head_time_ms` is older than `after_s` whatever the writer's
    clock error within the tolerance (a HEAD in the future is not old)."""
    return now_ms - head_time_ms > after_s * 1000 + CLOCK_TOLERANCE_MS


def forget_finished(
    store: Store, after_s: float, *, now_ms: int, dry_run: bool = False
) -> list[Retired]:
    """Commit `forget` for each finished task older than `after_s` (see the module docstring);
    a task whose HEAD moved meanwhile is left alone. What was (or would be) forgotten."""
    if after_s <= 0:
        raise UsageError("--forget-finished-after must be more than zero (as in 30d)")
    retired = []
    who = f"castore gc ({default_actor()})"
    why = f"retention: finished, HEAD older than {after_s:g}s"
    for task in store.tasks():
        status = store.status(task)  # HEAD alone; a broken one has `error` and is skipped
        if status.error or status.forgotten or not status.finished or status.head is None:
            continue
        if status.updated_ms is None or not old_enough(status.updated_ms, now_ms, after_s):
            continue
        if not dry_run:
            try:
                store.forget(task, who=who, why=why, only_if_head=status.head)
            except ConflictError:
                continue  # a writer moved HEAD since it was read: not this run's to decide
        retired.append(Retired(task, status.head, (now_ms - status.updated_ms) / 1000))
    return retired
