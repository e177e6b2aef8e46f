"""Power loss across forgetting, reclaiming and forking, with the crash model and checker of
tests/test_power_loss.py (read its docstring).

Workload: task "t" (a blob result, an inline one), forked at seq 2 as "copy", forgotten, and
reclaimed by gc (no grace, clock far ahead). Every crash state must be one of: t as it was
(every acknowledged commit there), or t forgotten (its tombstone HEAD, start/resume refuse
it); a sealed mark never without a durable tombstone above it (the fsync gc makes first);
"copy", once acknowledged, resumes with both carried results, whatever happened to t.

(No self-test of its own: the tombstone's commit already fsyncs the chain directory, so gc's
fsync before the mark matters only after a forget killed between its link and its fsync,
which tests/test_reclaim.py covers with a real kill.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import test_power_loss as pl
from test_power_loss import STORE, Op, Verdict
from test_power_loss_gc import assert_clean, run_exploration

import castore
from castore.chain.sealmark import started_by_mark
from castore.errors import CastoreError, TaskForgottenError
from castore.format.layout import task_key
from castore.maintenance.gc import collect

PLAN = castore.Plan.build("plf", "a", "b", "c")
BLOB = {"carried": "x" * 40}
FAR = 10 * 365 * 86400


def workload(base: Path, ops: list[Op]) -> None:
    store = castore.Store.init(base / STORE)
    ops.append(Op("ack_init"))
    with store.start("t", PLAN) as run:
        run.commit_step("a", store.put_blob(BLOB))
        run.commit_step("b", 2)
    store.fork("t@2", "copy")
    store.forget("t", who="ana", why="power")
    assert ["t"] == collect(store.root, grace_s=0, now=time.time() + FAR).reclaimed


@dataclass
class ForgetVerdict(Verdict):
    forgotten: dict[str, int] = field(default_factory=dict)  # task -> tombstone seq


def check(base: Path) -> Verdict:
    """The checks above; the general ones (test_power_loss) for every task not forgotten."""
    verdict = ForgetVerdict()
    root = base / STORE
    pl._check_objects(root, verdict)
    if not (root / "castore.json").exists():
        return verdict
    store = castore.Store.open(root)
    verdict.store = True
    tasks = store.tasks()
    for task in tasks:
        status = store.status(task)
        if status.forgotten and status.seq is not None and status.head is not None:
            _check_forgotten(store, task, status.seq, status.head, verdict)
        elif status.error:
            verdict.problems.append(f"task {task!r}: {status.error}")
        else:
            _check_live(store, task, verdict)
    marked = {task for task in tasks if started_by_mark(store.medium, task_key(task))}
    if marked - set(verdict.forgotten):
        verdict.problems.append(f"{sorted(marked)}: a sealed mark but no tombstone above it")
    for finding in castore.maintenance.fsck.check_store(root, jobs=1):
        # fsck does not know a reclaimed task yet (the fsck package adds it): its pruned slots,
        # and those a prune cut short left below the mark (their objects unlinked first).
        if finding.task in marked and finding.code in _BELOW_THE_MARK:
            continue
        if finding.severity is castore.maintenance.fsck.Severity.ERROR:
            verdict.fsck_errors.append(f"{finding.code} {finding.path}: {finding.message}")
    return verdict


_BELOW_THE_MARK = ("slot-gap", "slot-not-published")


def _check_forgotten(
    store: castore.Store, task: str, seq: int, head: str, verdict: ForgetVerdict
) -> None:
    verdict.forgotten[task] = seq
    verdict.histories[task] = ("",) * seq + (head,)
    for attempt in (lambda: store.resume(task, PLAN), lambda: store.start(task, PLAN)):
        try:
            attempt().close()
            verdict.problems.append(f"task {task!r} is forgotten, yet it opened")
        except TaskForgottenError:
            pass


def _check_live(store: castore.Store, task: str, verdict: ForgetVerdict) -> None:
    try:
        history = store.history(task)
        verdict.histories[task] = tuple(oid for oid, _ in reversed(history))
        if task == "copy":
            with store.resume(task, PLAN) as run:
                if (BLOB, 2) != (run.result("a"), run.result("b")):
                    verdict.problems.append("copy resumed without its carried results")
    except CastoreError as exc:
        verdict.problems.append(f"task {task!r} does not verify or resume: {exc}")


def lost_acks(verdict: Verdict, acks: tuple[Op, ...]) -> list[str]:
    """test_power_loss's, less the commits below a tombstone: forgetting lets them go."""
    forgotten = getattr(verdict, "forgotten", {})
    kept = tuple(
        a
        for a in acks
        if not (a.kind == "ack" and a.seq is not None and a.seq < forgotten.get(a.task or "", 0))
    )
    return REAL_LOST_ACKS(verdict, kept)


REAL_LOST_ACKS = pl.lost_acks


def test_power_loss_across_forget_reclaim_and_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every crash state of the workload: each task is as it was or forgotten, never a mark
    without its tombstone, no acknowledged commit lost (but below a tombstone), the fork
    always resumes with what it carries, fsck finds no error."""
    monkeypatch.setattr(pl, "lost_acks", lost_acks)
    # (check resumes and starts tasks: it takes their locks, so it writes)
    result = run_exploration(tmp_path, workload, monkeypatch, check=check)
    assert_clean(result)
