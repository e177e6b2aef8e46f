"""`castore upgrade`: turn a format v1 store into a v2 store, crash-safe and resumable.

Three steps, each one a re-run repeats or skips (docs/FORMAT.md §18):
1. verify the whole store as fsck does; any error and the store is left as it is;
2. replace castore.json by the v2 marker (the medium's `replace`; on POSIX temp file, fsync,
   rename over, fsync of the root): the only write that changes the format, and it is atomic;
3. seal each task's history (`castore.maintenance.sealing.seal_task`, when this castore has it).

A v1 store is a valid v2 store once its marker says so: v2 reads v1 objects as they are, so
step 2 needs to rewrite nothing, and a crash anywhere leaves a store that is v1 (nothing
written, or at most a temp file of the marker) or v2 (what is left, sealing, is done by the
next upgrade, or by the tasks' runs, which seal as they go).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from castore import crashpoints
from castore.errors import CastoreError, ConflictError, TaskBusyError, TaskForgottenError
from castore.format.layout import MARKER_KEY
from castore.format.marker import marker_bytes
from castore.format.model import attrs
from castore.maintenance.fsck import Finding, Severity, Summary, check_store
from castore.medium.base import Medium
from castore.store import Store

__all__ = ["TARGET_VERSION", "SealProblem", "UpgradeReport", "upgrade", "write_marker"]

TARGET_VERSION = 2
SealTask = Callable[[Store, str], Any]


@attrs.frozen
class SealProblem:
    """A task upgrade could not seal: `busy` (a writer committed first: its run seals it)
    or `failed` (the message says why; a re-run of upgrade tries again)."""

    task: str
    kind: str
    message: str


@attrs.frozen
class UpgradeReport:
    """What `upgrade` found and did. `refused`: errors were found and nothing was written."""

    root: str
    from_version: int
    to_version: int
    dry_run: bool
    findings: tuple[Finding, ...]
    checked: dict[str, object]  # fsck's summary of the check (objects, tasks, counts)
    marker_written: bool = False
    seal_available: bool = False
    sealed: tuple[str, ...] = ()
    seal_problems: tuple[SealProblem, ...] = ()

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    @property
    def refused(self) -> bool:
        return bool(self.errors)

    @property
    def exit_status(self) -> int:
        """0 done (or, dry run, doable); 1 refused, or a task whose seal failed (fsck's)."""
        failed = any(p.kind == "failed" for p in self.seal_problems)
        return 1 if self.refused or failed else 0


def upgrade(
    root: str | os.PathLike[str], *, dry_run: bool = False, jobs: int | None = None
) -> UpgradeReport:
    """Upgrade the store at `root` to format TARGET_VERSION (see the module docstring).
    A store that is already at it is only sealed (a re-run after a crash finishes the job);
    with `dry_run`, only the check runs. FormatVersionError for a marker this castore does
    not know, StoreNotFoundError if `root` is not a store."""
    store = Store.open(root)  # refuses a marker of an unknown version, or no store at all
    found = store.format_version
    findings, checked = _verify(store.root, jobs)
    report = UpgradeReport(store.root, found, TARGET_VERSION, dry_run, findings, checked)
    seal_task = _seal_function()
    report = attrs.evolve(report, seal_available=seal_task is not None)
    if report.refused or dry_run:
        return report
    crashpoints.reach("upgrade.verified")
    if found < TARGET_VERSION:
        write_marker(store.medium, TARGET_VERSION)
        report = attrs.evolve(report, marker_written=True)
    crashpoints.reach("upgrade.marker_written")
    if seal_task is None:
        return report  # runs seal as they commit; nothing else needs sealing to be read
    sealed, problems = _seal_all(Store.open(store.root), seal_task)
    return attrs.evolve(report, sealed=sealed, seal_problems=problems)


def _verify(root: str, jobs: int | None) -> tuple[tuple[Finding, ...], dict[str, object]]:
    """fsck's findings, with errors kept only if a second check finds them too: a writer
    committing during the first (a slot linked after its object's fan-out was listed) can
    show an error that is not there. Damage stays; a race does not repeat."""
    summary = Summary()
    first = tuple(check_store(root, jobs=jobs, summary=summary))
    if not any(f.severity is Severity.ERROR for f in first):
        return first, summary.to_json()
    summary = Summary()
    second = tuple(check_store(root, jobs=jobs, summary=summary))
    before = {_where(f) for f in first if f.severity is Severity.ERROR}
    kept = tuple(f for f in second if f.severity is not Severity.ERROR or _where(f) in before)
    return kept, summary.to_json()


def _where(finding: Finding) -> tuple[str, str, str | None]:
    return finding.code, finding.path, finding.task


def write_marker(medium: Medium, version: int) -> None:
    """Replace castore.json by the marker of `version` in one step: readers see the old
    marker or the new one, never a mix. On POSIX (temp file, fsync, rename over, fsync of
    the root) a crash before the rename leaves a temp file only (fsck: temp-file; gc removes
    it), after it and before the fsync either marker; rename() replaces the name itself:
    nothing there is followed."""
    medium.replace(MARKER_KEY, marker_bytes(version))


def _seal_function() -> SealTask | None:
    """`castore.maintenance.sealing.seal_task` if this castore has it, else None (imported
    late: sealing is optional to an upgrade, and nothing else here needs it)."""
    try:
        module = importlib.import_module("castore.maintenance.sealing")
    except ModuleNotFoundError as exc:
        if exc.name != "castore.maintenance.sealing":
            raise  # castore.chain.seal exists but something it imports does not: a real error
        return None
    seal_task: SealTask | None = getattr(module, "seal_task", None)
    return seal_task


def _seal_all(store: Store, seal_task: SealTask) -> tuple[tuple[str, ...], tuple[SealProblem, ...]]:
    sealed: list[str] = []
    problems: list[SealProblem] = []
    for task, problem in _seal_each(store, seal_task):
        if problem is None:
            sealed.append(task)
        else:
            problems.append(problem)
        crashpoints.reach("upgrade.sealed")
    return tuple(sealed), tuple(problems)


def _seal_each(store: Store, seal_task: SealTask) -> Iterator[tuple[str, SealProblem | None]]:
    for task in store.tasks():
        try:
            seal_task(store, task)
        except TaskForgottenError:
            continue  # ended for good: nothing follows its tombstone, gc reclaims its history
        except (ConflictError, TaskBusyError) as exc:
            # A writer committed first, or holds the task: its next run seals it (a run
            # opened while the store was v1 writes v1 until it resumes), or a re-run of upgrade.
            yield task, SealProblem(task, "busy", str(exc))
        except CastoreError as exc:
            yield task, SealProblem(task, "failed", str(exc))
        else:
            yield task, None
