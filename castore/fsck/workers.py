"""fsck's units of work, and the pool of worker processes that runs them: batches of tasks
(the task pass), then batches of objects no chain covered (the direct checks)."""

from __future__ import annotations

import multiprocessing
import threading
from array import array
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import attrs

from castore.fsck.findings import Finding
from castore.fsck.named import NamedObjects
from castore.fsck.objects import ObjectReport, check_object
from castore.fsck.tasks import SlotCheck, TaskCheck

BATCH = 500  # objects per unit of work of the direct checks
PARALLEL_TASKS = 8  # below this a process pool costs more than it saves


@attrs.frozen
class TaskContext:
    """What every task check needs besides the tasks (small: sent with every batch)."""

    root: str
    now_ms: int
    stuck_after_ms: int


@attrs.frozen
class TaskResult:
    name: str
    task_id: str
    findings: tuple[Finding, ...]
    slots: tuple[SlotCheck, ...]  # slots with something to report
    # The clean slots, packed (20,000 tuples would cost more to pickle than to check):
    clean_ids: bytes  # their snapshot ids, 32 raw bytes each
    clean_seqs: bytes  # array("q") of their sequence numbers
    clean_inodes: bytes  # array("Q") of their inode numbers
    refs: frozenset[str]  # ids the chain names besides its own slots' snapshots
    named: dict[str, ObjectReport]  # the plans and blobs it named, checked (records dropped)
    unreadable: bool

    def clean_slots(self) -> dict[str, tuple[int, int]]:
        """snapshot id -> (seq, inode) of each clean slot."""
        ids = self.clean_ids.hex()
        return dict(
            zip(
                [ids[start : start + 64] for start in range(0, len(ids), 64)],
                zip(array("q", self.clean_seqs), array("Q", self.clean_inodes), strict=True),
                strict=True,
            )
        )

    @staticmethod
    def pack(clean: list[tuple[int, str, int]]) -> tuple[bytes, bytes, bytes]:
        """The three packed fields of `clean`, (seq, snapshot id, inode) tuples."""
        ids = bytes.fromhex("".join(snapshot_id for _, snapshot_id, _ in clean))
        seqs = array("q", [seq for seq, _, _ in clean]).tobytes()
        return ids, seqs, array("Q", [inode for _, _, inode in clean]).tobytes()


def check_tasks(context: TaskContext, named: list[tuple[str, str]]) -> list[TaskResult]:
    """Check some tasks (a unit of work for a worker process, or the whole job serially)."""
    objects = NamedObjects(context.root)
    results = []
    for name, task_id in named:
        check = TaskCheck(
            context.root,
            name=name,
            task_id=task_id,
            named=objects,
            now_ms=context.now_ms,
            stuck_after_ms=context.stuck_after_ms,
        )
        findings = tuple(check.run())
        own = {slot.snapshot_id for slot in check.slots}
        own.update(snapshot_id for _, snapshot_id, _ in check.clean)
        results.append(
            TaskResult(
                name,
                task_id,
                findings,
                tuple(check.slots),
                *TaskResult.pack(check.clean),
                frozenset(check.refs - own),
                {},
                check.unreadable,
            )
        )
    if results:  # the named objects of the whole batch travel once, with its last task
        reports = {i: attrs.evolve(r, record=None) for i, r in objects.reports.items() if r}
        results[-1] = attrs.evolve(results[-1], named=reports)
    return results


class Workers:
    """Worker processes for the task pass and then for the objects it did not cover, each
    started only where there is enough work to pay for them (and `jobs` > 1)."""

    def __init__(self, jobs: int) -> None:
        self._jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def tasks(self, context: TaskContext, named: list[tuple[str, str]]) -> Iterator[TaskResult]:
        """Results in task order; with a pool, the work has started when this returns."""
        pool = self._started(len(named) >= PARALLEL_TASKS)
        if pool is None:
            return (result for one in named for result in check_tasks(context, [one]))
        size = max(1, len(named) // (self._jobs * 16))  # small: workers finish together
        batches = [named[i : i + size] for i in range(0, len(named), size)]
        futures = [pool.submit(check_tasks, context, batch) for batch in batches]
        return (result for future in futures for result in future.result())

    def objects(self, root: str, items: list[tuple[str, str]]) -> Iterator[ObjectReport]:
        """Reports of the objects at `items` (path, id), in that order."""
        pool = self._started(len(items) >= PARALLEL_OBJECTS)
        if pool is None:
            return iter(check_batch(root, items))
        batches = [items[i : i + BATCH] for i in range(0, len(items), BATCH)]
        chunks = pool.map(check_batch, [root] * len(batches), batches)
        return (report for chunk in chunks for report in chunk)

    def _started(self, worth_it: bool) -> ProcessPoolExecutor | None:
        """The pool (started now if need be), or None: work in this process."""
        if self._pool is None and worth_it and self._jobs > 1 and _may_fork():
            fork = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(max_workers=self._jobs, mp_context=fork)
        return self._pool


PARALLEL_OBJECTS = 200  # objects left to check directly; fewer are checked in this process


def check_batch(root: str, batch: list[tuple[str, str]]) -> list[ObjectReport]:
    """Check some objects by path (a unit of work for a worker process)."""
    return [attrs.evolve(check_object(root, relpath, i), record=None) for relpath, i in batch]


def _may_fork() -> bool:
    """Fork starts workers at once, with the modules this process has imported; but only
    when this process runs no other thread (a Watcher, an application's own): a forked child
    would inherit their locks as they are, held or not. The other start methods re-run the
    caller's main script in each worker, which a script without a __main__ guard does not
    survive; so with other threads, fsck works in this process."""
    return threading.active_count() == 1
