"""castore fsck: a read-only verifier that yields findings and never raises for the damage
it finds. Objects are checked in parallel on large stores; then every task's chain; then
what no task refers to.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

import attrs

from castore import codec
from castore.digest import hash_bytes
from castore.errors import CastoreError, UsageError
from castore.fsck.findings import CODES, Finding, Severity
from castore.fsck.objects import ObjectReport, check_batch, check_object
from castore.fsck.tasks import PlanShape, TaskCheck
from castore.fsck.tree import (
    Inventory,
    missing_directories,
    slot_inodes,
    walk_objects,
    walk_top,
)
from castore.fsio import read_regular
from castore.layout import TASKS_DIR, Layout, decode_task_id, encode_task_id
from castore.objects import ObjectStore
from castore.records import Plan
from castore.store import Store
from castore.verify import named_ids

__all__ = ["CODES", "Finding", "Severity", "Summary", "check_store"]

PARALLEL_FROM = 2000  # objects; below this a process pool costs more than it saves
BATCH = 500
Progress = Callable[[int, int], None]


@attrs.define
class Summary:
    """Counts of one fsck run; `exit_status` is 0 (no error) or 1 (errors found)."""

    objects: int = 0
    tasks: int = 0
    by_severity: Counter[str] = attrs.field(factory=Counter)
    by_code: Counter[str] = attrs.field(factory=Counter)
    seconds: float = 0.0

    def add(self, finding: Finding) -> None:
        self.by_severity[finding.severity.value] += 1
        self.by_code[finding.code] += 1

    @property
    def exit_status(self) -> int:
        return 1 if self.by_severity[Severity.ERROR.value] else 0

    def to_json(self) -> dict[str, object]:
        return {
            "objects": self.objects,
            "tasks": self.tasks,
            "errors": self.by_severity[Severity.ERROR.value],
            "warnings": self.by_severity[Severity.WARNING.value],
            "infos": self.by_severity[Severity.INFO.value],
            "codes": dict(sorted(self.by_code.items())),
            "seconds": round(self.seconds, 3),
            "exit_status": self.exit_status,
        }


def _run_objects(
    root: str, items: list[tuple[str, str]], jobs: int, progress: Progress | None
) -> Iterator[ObjectReport]:
    batches = [items[i : i + BATCH] for i in range(0, len(items), BATCH)]
    done = 0
    if jobs > 1 and len(items) >= PARALLEL_FROM:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for reports in pool.map(check_batch, [root] * len(batches), batches):
                done += len(reports)
                if progress:
                    progress(done, len(items))
                yield from reports
        return
    for batch in batches:
        reports = check_batch(root, batch)
        done += len(reports)
        if progress:
            progress(done, len(items))
        yield from reports


def check_store(
    path: str | os.PathLike[str],
    *,
    task: str | None = None,
    stuck_after: float = 3600.0,
    jobs: int | None = None,
    progress: Progress | None = None,
    summary: Summary | None = None,
) -> Iterator[Finding]:
    """Yield every finding in the store at `path` (or in one task and what it names).

    Raises StoreNotFoundError / FormatVersionError only when the path is not a store it can
    read at all; damage is always a finding.
    """
    started = time.monotonic()
    store = Store.open(path)  # refuses a non-store before anything else is read
    root = store.root
    tally = summary if summary is not None else Summary()
    for finding in _check(
        store,
        root,
        task=task,
        stuck_after=stuck_after,
        jobs=jobs or os.cpu_count() or 1,
        progress=progress,
        tally=tally,
    ):
        tally.add(finding)
        yield finding
    tally.seconds = time.monotonic() - started


def _check(
    store: Store,
    root: str,
    *,
    task: str | None,
    stuck_after: float,
    jobs: int,
    progress: Progress | None,
    tally: Summary,
) -> Iterator[Finding]:
    inventory = walk_objects(root)
    if task is None:
        yield from walk_top(root)
        yield from missing_directories(root)
        yield from inventory.findings
    named: list[tuple[str, str]] = []
    for name, task_id in _tasks(root, task):
        if task_id is None:
            yield Finding("bad-task-name", f"{TASKS_DIR}/{name}", "not the encoding of any task id")
        else:
            named.append((name, task_id))
    # A snapshot object is the same inode as its chain slot: the task pass reads the slot
    # anyway, so it checks the object there instead of reading and decoding it twice.
    linked = slot_inodes(root, [name for name, _ in named])
    deferred = {
        i: (p, inventory.inodes[i])
        for i, p in inventory.objects.items()
        if inventory.inodes.get(i) in linked
    }
    direct = {i: p for i, p in inventory.objects.items() if i not in deferred}
    reports = _reports(
        root, direct, task=task, store=store, jobs=jobs, progress=progress, tally=tally
    )
    tally.objects += len(deferred)
    for report in reports.values():
        yield from _explained(_wrong_name_or_rot(report, inventory.objects), inventory)
    intact = {object_id for object_id, report in reports.items() if not report.damaged}
    if task is not None:
        # Only the task's own objects were checked; anything present counts as known.
        intact |= {i for i in inventory.objects if i not in reports}
    context = _TaskContext(
        root=root,
        intact=intact,
        present=set(inventory.objects),
        kinds={i: r.kind for i, r in reports.items() if r.kind is not None},
        deferred=deferred,
        now_ms=int(time.time() * 1000),
        stuck_after_ms=int(stuck_after * 1000),
    )
    referenced: set[str] = set()
    checked: set[str] = set()
    unreadable = False
    tally.tasks = len(named)
    parallel = jobs > 1 and len(named) > 1 and len(inventory.objects) >= PARALLEL_FROM
    for result in _run_tasks(context, named, jobs if parallel else 1):
        yield from _explained(result.findings, inventory)
        referenced |= result.refs
        checked |= result.checked
        unreadable = unreadable or result.unreadable
    for object_id in sorted(set(deferred) - checked):  # its slot could not be read
        report = check_object(root, deferred[object_id][0], object_id)
        yield from _wrong_name_or_rot(report, inventory.objects)
    # With a chain that cannot be read, what it names is unknown: nothing is called
    # unreachable (gc keeps every object then, too).
    if task is None and not unreadable:
        for object_id in sorted(set(inventory.objects) - referenced):
            relpath = inventory.objects[object_id]
            yield Finding("unreachable-object", relpath, "no task refers to it", object_id)


@attrs.frozen
class _TaskContext:
    """What every task check needs from the object pass (inherited by forked workers)."""

    root: str
    intact: set[str]
    present: set[str]
    kinds: dict[str, str]
    deferred: dict[str, tuple[str, int]]  # checked through their slot: id -> (path, inode)
    now_ms: int
    stuck_after_ms: int


@attrs.frozen
class _TaskResult:
    findings: tuple[Finding, ...]
    refs: frozenset[str]
    checked: frozenset[str]
    unreadable: bool


_CONTEXT: list[_TaskContext] = []  # set before a pool forks: workers inherit it, no pickling


def _check_tasks(named: list[tuple[str, str]]) -> list[_TaskResult]:
    """Check some tasks (a unit of work for a worker process, or the whole job serially)."""
    context = _CONTEXT[-1]
    plans = _PlanCache(ObjectStore(Layout(context.root)), context.intact)
    results = []
    for name, task_id in named:
        check = TaskCheck(
            context.root,
            name=name,
            task_id=task_id,
            read_plan=plans.get,
            known=context.intact,
            present=context.present,
            kinds=context.kinds,
            deferred=context.deferred,
            now_ms=context.now_ms,
            stuck_after_ms=context.stuck_after_ms,
        )
        findings = tuple(check.run())
        checked = frozenset(check.checked)
        results.append(_TaskResult(findings, frozenset(check.refs), checked, check.unreadable))
    return results


def _run_tasks(
    context: _TaskContext, named: list[tuple[str, str]], jobs: int
) -> Iterator[_TaskResult]:
    _CONTEXT.append(context)
    try:
        if jobs <= 1:
            yield from _check_tasks(named)
            return
        size = max(1, len(named) // (jobs * 4))
        batches = [named[i : i + size] for i in range(0, len(named), size)]
        # fork: the workers inherit the context (sets of every object id) without pickling.
        fork = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=fork) as pool:
            for results in pool.map(_check_tasks, batches):
                yield from results
    finally:
        _CONTEXT.pop()


def _explained(findings: Iterable[Finding], inventory: Inventory) -> Iterator[Finding]:
    """Drop `hard-linked-object` when the extra name is a leftover temp file of the same
    inode (a crash between link() and unlink() of the temp): its temp-file finding says it."""
    for finding in findings:
        inode = inventory.inodes.get(finding.object_id or "")
        if finding.code != "hard-linked-object" or inode not in inventory.temp_inodes:
            yield finding


def _wrong_name_or_rot(report: ObjectReport, present: dict[str, str]) -> Iterator[Finding]:
    """A valid object under a wrong name is only that if the object it really is exists;
    otherwise its bytes changed and still happen to decode: a hash mismatch (bit rot)."""
    for finding in report.findings:
        if finding.code == "object-wrong-name" and report.actual not in present:
            message = f"its bytes hash to {report.actual}"
            yield attrs.evolve(finding, code="hash-mismatch", message=message)
        else:
            yield finding


def _reports(
    root: str,
    objects: dict[str, str],
    *,
    task: str | None,
    store: Store,
    jobs: int,
    progress: Progress | None,
    tally: Summary,
) -> dict[str, ObjectReport]:
    if task is not None:
        wanted = _task_objects(store, task)
        objects = {i: p for i, p in objects.items() if i in wanted}
    items = sorted((relpath, object_id) for object_id, relpath in objects.items())
    tally.objects = len(items)
    return {r.object_id: r for r in _run_objects(root, items, jobs, progress)}


def _task_objects(store: Store, task: str) -> set[str]:
    """The objects one task's slots name (read without verifying: fsck reports damage)."""
    slots_dir = store.layout.chain_dir(task)
    if not os.path.isdir(slots_dir):
        raise UsageError(f"no task {task!r} in {store.root}; see `castore status`")
    wanted: set[str] = set()
    for name in os.listdir(slots_dir):
        try:
            data = read_regular(os.path.join(slots_dir, name))
            entry = codec.decode_value(codec.unframe(data)[1])
        except (CastoreError, OSError, ValueError):
            continue
        wanted.add(hash_bytes(data))
        wanted.update(named_ids(entry))
    return wanted


def _tasks(root: str, only: str | None) -> Iterator[tuple[str, str | None]]:
    if only is not None:
        yield encode_task_id(only), only
        return
    tasks_dir = os.path.join(root, TASKS_DIR)
    if not os.path.isdir(tasks_dir) or os.path.islink(tasks_dir):
        return
    for name in sorted(os.listdir(tasks_dir)):
        try:
            yield name, decode_task_id(name)
        except UsageError:
            yield name, None


class _PlanCache:
    """Plan shapes by id, decoded once; None for a plan that is missing or damaged."""

    def __init__(self, objects: ObjectStore, intact: set[str]) -> None:
        self._objects, self._intact = objects, intact
        self._plans: dict[str, PlanShape | None] = {}

    def get(self, plan_id: str) -> PlanShape | None:
        try:
            return self._plans[plan_id]
        except KeyError:
            shape = self._plans[plan_id] = self._load(plan_id)
            return shape

    def _load(self, plan_id: str) -> PlanShape | None:
        if plan_id not in self._intact:
            return None
        try:
            body = self._objects.get(plan_id, "plan")
            return PlanShape.of(codec.from_builtins(codec.decode_value(body), Plan))
        except Exception:  # noqa: BLE001 - its own object finding already says what is wrong
            return None
