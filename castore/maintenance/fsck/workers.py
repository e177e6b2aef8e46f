"""fsck's units of work, and the worker processes that run them: batches of tasks (the task
pass), then batches of objects no chain covered (the direct checks)."""

from __future__ import annotations

import functools
from array import array
from collections.abc import Iterator
from itertools import islice
from typing import Any

from castore.format.model import attrs
from castore.maintenance.forked import ForkedMap, may_fork
from castore.maintenance.fsck.findings import Finding
from castore.maintenance.fsck.named import NamedObjects
from castore.maintenance.fsck.objects import ObjectReport, check_object
from castore.maintenance.fsck.tasks import SlotCheck, TaskCheck
from castore.medium.base import Medium

BATCH = 500  # objects per unit of work of the direct checks
PARALLEL_TASKS = 8  # below this a process pool costs more than it saves


@attrs.frozen
class TaskContext:
    """What every task check needs besides the tasks."""

    medium: Medium
    now_ms: int
    stuck_after_ms: int


@attrs.frozen
class TaskResult:
    name: str
    task_id: str
    findings: tuple[Finding, ...]
    slots: tuple[SlotCheck, ...]  # slots with something to report
    # The clean slots, in slot order, as columns (20,000 tuples would cost more to pickle
    # than to check):
    clean_ids: tuple[str, ...]  # their snapshot ids
    clean_seqs: bytes  # array("q") of their sequence numbers
    clean_inodes: bytes  # array("Q") of their inode numbers
    refs: frozenset[str]  # ids the chain names besides its own slots' snapshots
    # The plans and blobs it named that no earlier result of its worker carried, checked:
    named_clean: tuple[str, ...]  # ids of those with nothing to report
    named: tuple[ObjectReport, ...]  # the others (records dropped)
    unreadable: bool
    # Slots read whose bytes nothing vouches for (TaskCheck.doubted): a missing object name
    # of any other slot is a lost name in a v2 store.
    doubted: frozenset[int] = frozenset()

    def clean_slots(self) -> Iterator[tuple[int, str, int]]:
        """(seq, snapshot id, inode) of each clean slot."""
        seqs, inodes = array("q", self.clean_seqs), array("Q", self.clean_inodes)
        return zip(seqs, self.clean_ids, inodes, strict=True)


def check_tasks(
    context: TaskContext, named: list[tuple[str, str]], objects: NamedObjects
) -> Iterator[TaskResult]:
    """Check some tasks, one result each; `objects` may have served earlier tasks (each
    result carries the named objects checked since the previous one)."""
    reported = len(objects.reports)
    for name, task_id in named:
        check = TaskCheck(
            context.medium,
            name=name,
            task_id=task_id,
            named=objects,
            now_ms=context.now_ms,
            stuck_after_ms=context.stuck_after_ms,
        )
        findings = tuple(check.run())
        check.refs.update(objects.drain_reached())  # the parts of the trees it named
        own = {slot.snapshot_id for slot in check.slots}
        own.update(check.clean_ids)
        new = [r for r in islice(objects.reports.values(), reported, None) if r is not None]
        reported = len(objects.reports)
        yield TaskResult(
            name,
            task_id,
            findings,
            tuple(check.slots),
            tuple(check.clean_ids),
            array("q", check.clean_seqs).tobytes(),
            array("Q", check.clean_inodes).tobytes(),
            frozenset(check.refs - own),
            tuple(r.object_id for r in new if not r.findings),
            tuple(attrs.evolve(r, record=None) for r in new if r.findings),
            check.unreadable or objects.unreadable,
            frozenset(check.doubted),
        )


def _check_task_batch(
    context: TaskContext, objects: NamedObjects, batch: list[tuple[str, str]]
) -> list[TaskResult]:
    """A worker's unit of work. `objects` is the worker's own copy (made by fork) and serves
    all of its units: a plan shared by every task is read once per worker."""
    return list(check_tasks(context, batch, objects))


class Workers:
    """Worker processes for the task pass and then for the objects it did not cover, each
    started only where there is enough work to pay for them (and `jobs` > 1)."""

    def __init__(self, jobs: int) -> None:
        self._jobs = jobs
        self._maps: list[ForkedMap[Any, Any]] = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        for forked in self._maps:
            forked.close()

    def tasks(self, context: TaskContext, named: list[tuple[str, str]]) -> Iterator[TaskResult]:
        """Results in task order; with workers, the work has started when this returns."""
        objects = NamedObjects(context.medium)
        if not self._worth_forking(len(named) >= PARALLEL_TASKS):
            return check_tasks(context, named, objects)
        size = max(1, len(named) // (self._jobs * 16))  # small: workers finish together
        batches = [named[i : i + size] for i in range(0, len(named), size)]
        work = functools.partial(_check_task_batch, context, objects)
        forked = self._started(ForkedMap(work, batches, self._jobs))
        return (result for batch in forked for result in batch)

    def objects(self, medium: Medium, items: list[tuple[str, str]]) -> Iterator[ObjectReport]:
        """Reports of the objects at `items` (path, id), in that order."""
        if not self._worth_forking(len(items) >= PARALLEL_OBJECTS):
            return iter(check_batch(medium, items))
        batches = [items[i : i + BATCH] for i in range(0, len(items), BATCH)]
        work = functools.partial(check_batch, medium)
        forked = self._started(ForkedMap(work, batches, self._jobs))
        return (report for batch in forked for report in batch)

    def _worth_forking(self, enough_work: bool) -> bool:
        return enough_work and self._jobs > 1 and may_fork()

    def _started(self, forked: ForkedMap[Any, Any]) -> ForkedMap[Any, Any]:
        self._maps.append(forked)  # stopped on exit, however the caller leaves
        return forked


PARALLEL_OBJECTS = 200  # objects left to check directly; fewer are checked in this process


def check_batch(medium: Medium, batch: list[tuple[str, str]]) -> list[ObjectReport]:
    """Check some objects by path (a unit of work for a worker process)."""
    return [attrs.evolve(check_object(medium, relpath, i), record=None) for relpath, i in batch]
