"""castore fsck: a read-only verifier that yields findings and never raises for the damage
it finds.

Worker processes check every task: each chain slot is read once and judged both as a link
of the chain and as the snapshot object it is (the same inode), and each plan or blob a
chain names is checked where its id says it lives. Meanwhile this process lists objects/;
then it checks directly whatever the task pass did not cover, and reports what no task
refers to. Every file is reached through the store's medium (a POSIX directory, an S3
prefix: there the work stays in this process, and a slot is its snapshot's only copy).

May import: castore.store and what is below it (it reads the store's files itself, never
through a writer's code path, and writes nothing but with --quarantine).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from castore.errors import StoreNotFoundError, UsageError
from castore.format.layout import (
    TASKS_DIR,
    chain_key,
    decode_task_id,
    encode_task_id,
    object_relpath,
)
from castore.format.model import attrs
from castore.maintenance.fsck.coverage import Coverage
from castore.maintenance.fsck.findings import CODES, Finding, Severity
from castore.maintenance.fsck.objects import ObjectReport
from castore.maintenance.fsck.tree import (
    Inventory,
    is_directory,
    marker_finding,
    missing_directories,
    walk_objects,
    walk_top,
)
from castore.maintenance.fsck.workers import TaskContext, Workers
from castore.medium import oserrors
from castore.medium.select import open_medium
from castore.store import Store

__all__ = ["CODES", "Finding", "Severity", "Summary", "check_store"]

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


@oserrors.translating_iterator
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
    read at all, UnsafeFileError when its objects/ or tasks/ is a symlink or not a directory
    (it cannot even be opened safely); damage is always a finding. `progress(done, total)`
    is called as objects are checked, with done < total, and once at the end with done ==
    total.
    """
    started = time.monotonic()
    tally = summary if summary is not None else Summary()
    try:
        store = Store.open(path)  # refuses a non-store before anything else is read
    except StoreNotFoundError:
        # A missing or empty marker: say what the directory is (an interrupted init, or a
        # store that lost its marker, which is checked all the same) instead of refusing.
        found = marker_finding(open_medium(path)) if task is None else None
        if found is None:
            raise
        tally.add(found[0])
        yield found[0]
        if not found[1]:
            return
        store = Store.unmarked(path)
    # Workers are forked on POSIX only: a forked S3 client would share its parent's
    # connections (and the work there is waiting on requests, not on the CPU).
    jobs = (jobs or os.cpu_count() or 1) if store.medium.kind == "posix" else 1
    for finding in _check(
        store,
        task=task,
        stuck_after=stuck_after,
        jobs=jobs,
        progress=progress,
        tally=tally,
    ):
        tally.add(finding)
        yield finding
    tally.seconds = time.monotonic() - started


def _check(
    store: Store,
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
    medium = store.medium
    context = TaskContext(medium, int(time.time() * 1000), int(stuck_after * 1000))
    with Workers(jobs) as pool:
        # The task pass starts first: the workers read every chain (and every snapshot object
        # through its slot, the same inode) while this process lists objects/.
        results = pool.tasks(context, named)
        inventory = walk_objects(medium)
        if task is None:
            yield from walk_top(medium)
            yield from missing_directories(medium)
            yield from inventory.findings
        coverage = Coverage(
            inventory, names_may_be_lost=store.format_version >= 2, aliases=medium.aliases
        )
        unreadable = False
        chain_findings: list[Finding] = []  # reported after the objects they may point at
        for result in results:
            chain_findings.extend(_explained(result.findings, inventory))
            chain_findings.extend(coverage.add_task(result))
            unreadable = unreadable or result.unreadable
            if progress and coverage.checked < len(inventory.inodes):
                progress(coverage.checked, len(inventory.inodes))
        # What no readable slot covered: objects no chain reaches, plans and blobs named only
        # in damaged chains, snapshot objects whose slot is a copy. With --task, only what
        # that task names.
        wanted = None if task is None else coverage.refers_to()
        coverage.add_reports(pool.objects(medium, coverage.unchecked(wanted)))
        if progress:
            progress(coverage.checked, coverage.checked)  # done: the last call, done == total
        tally.objects = coverage.checked
        tally.tasks = len(named)
        for report in sorted(coverage.reports.values(), key=lambda r: r.path):
            yield from _explained(_wrong_name_or_rot(report, inventory.inodes), inventory)
        yield from chain_findings
        yield from coverage.slot_findings()
    # With a chain that cannot be read, what it names is unknown: nothing is called
    # unreachable (gc keeps every object then, too).
    if task is None and not unreadable:
        for object_id in sorted(inventory.inodes.keys() - coverage.referenced - coverage.clean):
            relpath = object_relpath(object_id)
            yield Finding("unreachable-object", relpath, "no task refers to it", object_id)


def _explained(findings: Iterable[Finding], inventory: Inventory) -> Iterator[Finding]:
    """Drop `hard-linked-object` when the extra name is a leftover temp file of the same
    inode (a crash between link() and unlink() of the temp): its temp-file finding says it."""
    for finding in findings:
        inode = inventory.inodes.get(finding.object_id or "")
        if finding.code != "hard-linked-object" or inode not in inventory.temp_inodes:
            yield finding


def _wrong_name_or_rot(report: ObjectReport, present: dict[str, int | None]) -> Iterator[Finding]:
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
        if not store.medium.exists(chain_key(only)):
            raise UsageError(f"no task {only!r} in {store.root}; see `castore status`")
        yield encode_task_id(only), only
        return
    if not is_directory(store.medium, TASKS_DIR):
        return
    for name in sorted(store.medium.names(TASKS_DIR)):
        try:
            yield name, decode_task_id(name)
        except UsageError:
            yield name, None
