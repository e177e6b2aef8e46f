"""castore fsck: a read-only verifier that yields findings and never raises for the damage
it finds.

Worker processes check every task: each chain slot is read once and judged both as a link
of the chain and as the snapshot object it is (the same inode), and each plan or blob a
chain names is checked where its id says it lives. Meanwhile this process lists objects/;
then it checks directly whatever the task pass did not cover, and reports what no task
refers to.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

import attrs

from castore.errors import UsageError
from castore.fsck.findings import CODES, Finding, Severity
from castore.fsck.objects import ObjectReport, check_object
from castore.fsck.tasks import NamedObjects, SlotCheck, TaskCheck
from castore.fsck.tree import Inventory, missing_directories, walk_objects, walk_top
from castore.layout import (
    CHAIN_DIR,
    TASKS_DIR,
    decode_task_id,
    encode_task_id,
    object_relpath,
    slot_name,
)
from castore.store import Store

__all__ = ["CODES", "Finding", "Severity", "Summary", "check_store"]

BATCH = 500  # objects per unit of work of the direct checks
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


def _check_batch(root: str, batch: list[tuple[str, str]]) -> list[ObjectReport]:
    """Check some objects by path (a unit of work for a worker process)."""
    return [attrs.evolve(check_object(root, relpath, i), record=None) for relpath, i in batch]


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
    read at all; damage is always a finding. `progress(done, total)` is called as objects are
    checked, with done < total, and once at the end with done == total.
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
    named: list[tuple[str, str]] = []
    for name, task_id in _tasks(store, task):
        if task_id is None:
            yield Finding("bad-task-name", f"{TASKS_DIR}/{name}", "not the encoding of any task id")
        else:
            named.append((name, task_id))
    context = _TaskContext(root, int(time.time() * 1000), int(stuck_after * 1000))
    with _Workers(jobs if len(named) >= PARALLEL_TASKS else 1) as workers:
        # The task pass starts first: the workers read every chain (and every snapshot object
        # through its slot, the same inode) while this process lists objects/.
        results = workers.tasks(context, named)
        inventory = walk_objects(root)
        if task is None:
            yield from walk_top(root)
            yield from missing_directories(root)
            yield from inventory.findings
        checks = _ObjectChecks(inventory)
        unreadable = False
        chain_findings: list[Finding] = []  # reported after the objects they may point at
        for result in results:
            chain_findings.extend(_explained(result.findings, inventory))
            chain_findings.extend(checks.add_task(result))
            unreadable = unreadable or result.unreadable
            if progress and checks.checked < len(inventory.inodes):
                progress(checks.checked, len(inventory.inodes))
        # What no readable slot covered: objects no chain reaches, plans and blobs named only
        # in damaged chains, snapshot objects whose slot is a copy. With --task, only what
        # that task names.
        wanted = None if task is None else checks.referenced
        checks.add_reports(workers.objects(root, checks.unchecked(wanted)))
        if progress:
            progress(checks.checked, checks.checked)  # done: the last call, done == total
        tally.objects = checks.checked
        tally.tasks = len(named)
        for report in sorted(checks.reports.values(), key=lambda r: r.path):
            yield from _explained(_wrong_name_or_rot(report, inventory.inodes), inventory)
        yield from chain_findings
        yield from checks.slot_findings()
    # With a chain that cannot be read, what it names is unknown: nothing is called
    # unreachable (gc keeps every object then, too).
    if task is None and not unreadable:
        for object_id in sorted(inventory.inodes.keys() - checks.referenced):
            relpath = object_relpath(object_id)
            yield Finding("unreachable-object", relpath, "no task refers to it", object_id)


class _ObjectChecks:
    """Every object's report, gathered from the task pass and then from direct checks, and
    the findings of slots that only the whole store's listing can make."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.reports: dict[str, ObjectReport] = {}  # objects checked, with what they found
        self.clean: set[str] = set()  # snapshot objects checked through a clean slot
        self.referenced: set[str] = set()
        self._copies: list[tuple[str, str, int, str]] = []  # (name, task id, seq, object id)

    def add_task(self, result: _TaskResult) -> Iterator[Finding]:
        """Take one task's slots and named objects; yield, in slot order, what its slots say
        of objects/."""
        inodes = self.inventory.inodes
        self.referenced |= result.refs
        clean = result.clean_slots()  # snapshot id -> (seq, inode)
        self.referenced.update(clean)
        # The common case in one set operation: every clean slot is its object, listed.
        same = {i for i, _ in {i: ino for i, (_, ino) in clean.items()}.items() & inodes.items()}
        self.clean |= same
        odd: list[tuple[int, str, str]] = []  # (seq, snapshot id, what to say), any order
        for snapshot_id, (seq, _) in clean.items() if len(same) < len(clean) else ():
            if snapshot_id not in same:
                odd.append((seq, snapshot_id, _UNPUBLISHED if snapshot_id not in inodes else ""))
        for slot in result.slots:
            self.referenced.add(slot.snapshot_id)
            inode = inodes.get(slot.snapshot_id)
            if inode == slot.inode:  # the slot is the object: its report is the object's
                if slot.snapshot_id not in self.reports:
                    kind = None if slot.damaged else "snapshot"
                    path = object_relpath(slot.snapshot_id)
                    self.reports[slot.snapshot_id] = ObjectReport(
                        slot.snapshot_id, path, kind, slot.findings
                    )
                if slot.damaged:
                    odd.append((slot.seq, slot.snapshot_id, _DAMAGED))
            else:
                odd.append((slot.seq, slot.snapshot_id, _UNPUBLISHED if inode is None else ""))
        for seq, snapshot_id, what in sorted(odd):
            if what:
                yield _slot_finding(result.name, result.task_id, seq, snapshot_id, what)
            else:  # a copy of the object's bytes: judged once the object itself is checked
                self._copies.append((result.name, result.task_id, seq, snapshot_id))
        self.add_reports(result.named.values())

    def add_reports(self, reports: Iterable[ObjectReport]) -> None:
        for report in reports:
            if report.object_id in self.inventory.inodes:
                self.reports.setdefault(report.object_id, report)

    @property
    def checked(self) -> int:
        """How many objects have been checked, one way or the other."""
        return len(self.reports) + len(self.clean.difference(self.reports))

    def unchecked(self, wanted: set[str] | None) -> list[tuple[str, str]]:
        """(path, id) of every object (of `wanted`, if given) that has no report yet."""
        return sorted(
            (object_relpath(object_id), object_id)
            for object_id in self.inventory.inodes
            if object_id not in self.reports
            and object_id not in self.clean
            and (wanted is None or object_id in wanted)
        )

    def slot_findings(self) -> Iterator[Finding]:
        """Slots that are copies of a damaged object say so (once every report is in)."""
        for name, task_id, seq, object_id in self._copies:
            report = self.reports.get(object_id)
            if report is not None and report.damaged and object_id not in self.clean:
                yield _slot_finding(name, task_id, seq, object_id, _DAMAGED)


_DAMAGED = "missing-object"
_UNPUBLISHED = "slot-not-published"
_SAYS = {
    _DAMAGED: "the snapshot object of this slot is damaged (see its own finding)",
    _UNPUBLISHED: "no object of these bytes in objects/",
}


def _slot_finding(name: str, task_id: str, seq: int, object_id: str, code: str) -> Finding:
    relpath = f"{TASKS_DIR}/{name}/{CHAIN_DIR}/{slot_name(seq)}"
    return Finding(code, relpath, _SAYS[code], object_id, task_id)


PARALLEL_TASKS = 8  # below this a process pool costs more than it saves


@attrs.frozen
class _TaskContext:
    """What every task check needs besides the tasks (small: sent with every batch)."""

    root: str
    now_ms: int
    stuck_after_ms: int


@attrs.frozen
class _TaskResult:
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


def _check_tasks(context: _TaskContext, named: list[tuple[str, str]]) -> list[_TaskResult]:
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
            _TaskResult(
                name,
                task_id,
                findings,
                tuple(check.slots),
                *_TaskResult.pack(check.clean),
                frozenset(check.refs - own),
                {},
                check.unreadable,
            )
        )
    if results:  # the named objects of the whole batch travel once, with its last task
        reports = {i: attrs.evolve(r, record=None) for i, r in objects.reports.items() if r}
        results[-1] = attrs.evolve(results[-1], named=reports)
    return results


class _Workers:
    """A pool of forked worker processes (or none, for jobs=1), for the task pass and then
    for the objects it did not cover."""

    def __init__(self, jobs: int) -> None:
        self._jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def tasks(self, context: _TaskContext, named: list[tuple[str, str]]) -> Iterator[_TaskResult]:
        """Results in task order; with a pool, the work has started when this returns."""
        if self._jobs <= 1:
            return (result for one in named for result in _check_tasks(context, [one]))
        size = max(1, len(named) // (self._jobs * 16))  # small: workers finish together
        batches = [named[i : i + size] for i in range(0, len(named), size)]
        # fork: workers start at once, with the modules this process has imported.
        fork = multiprocessing.get_context("fork")
        self._pool = ProcessPoolExecutor(max_workers=self._jobs, mp_context=fork)
        futures = [self._pool.submit(_check_tasks, context, batch) for batch in batches]
        return (result for future in futures for result in future.result())

    def objects(self, root: str, items: list[tuple[str, str]]) -> Iterator[ObjectReport]:
        if self._pool is None or len(items) < PARALLEL_OBJECTS:
            return iter(_check_batch(root, items))
        batches = [items[i : i + BATCH] for i in range(0, len(items), BATCH)]
        chunks = self._pool.map(_check_batch, [root] * len(batches), batches)
        return (report for chunk in chunks for report in chunk)


PARALLEL_OBJECTS = 200  # objects left to check directly; fewer are checked in this process


def _explained(findings: Iterable[Finding], inventory: Inventory) -> Iterator[Finding]:
    """Drop `hard-linked-object` when the extra name is a leftover temp file of the same
    inode (a crash between link() and unlink() of the temp): its temp-file finding says it."""
    for finding in findings:
        inode = inventory.inodes.get(finding.object_id or "")
        if finding.code != "hard-linked-object" or inode not in inventory.temp_inodes:
            yield finding


def _wrong_name_or_rot(report: ObjectReport, present: dict[str, int]) -> Iterator[Finding]:
    """A valid object under a wrong name is only that if the object it really is exists;
    otherwise its bytes changed and still happen to decode: a hash mismatch (bit rot)."""
    for finding in report.findings:
        if finding.code == "object-wrong-name" and report.actual not in present:
            message = f"its bytes hash to {report.actual}"
            yield attrs.evolve(finding, code="hash-mismatch", message=message)
        else:
            yield finding


def _tasks(store: Store, only: str | None) -> Iterator[tuple[str, str | None]]:
    if only is not None:
        if not os.path.isdir(store.layout.chain_dir(only)):
            raise UsageError(f"no task {only!r} in {store.root}; see `castore status`")
        yield encode_task_id(only), only
        return
    tasks_dir = os.path.join(store.root, TASKS_DIR)
    if not os.path.isdir(tasks_dir) or os.path.islink(tasks_dir):
        return
    for name in sorted(os.listdir(tasks_dir)):
        try:
            yield name, decode_task_id(name)
        except UsageError:
            yield name, None
