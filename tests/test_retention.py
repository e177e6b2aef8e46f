"""Retention: `gc --forget-finished-after` forgets finished tasks older than the period, by
their HEAD's time with the clock tolerance, and nothing else; off by default."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import cli

import castore
from castore.format.effects import CLOCK_TOLERANCE_MS
from castore.maintenance.gc import collect

PLAN = castore.Plan.build("job", "a", "b")
DAY_MS = 86_400_000
NOW_MS = time.time_ns() // 1_000_000  # the gc's "now" in these tests
THIRTY_DAYS_S = 30 * 86400.0


def task_at(root: Path, task: str, time_ms: int, *, finish: bool = True) -> None:
    """Task `task` whose every snapshot is dated `time_ms` (the writer's clock)."""
    store = castore.Store.open(root, clock=lambda: time_ms)
    with store.start(task, PLAN) as run:
        run.commit_step("a", 1)
        if finish:
            run.commit_step("b", 2)


def forgotten(root: Path) -> list[str]:
    store = castore.Store.open(root)
    return [task for task in store.tasks() if store.status(task).forgotten]


@pytest.fixture
def aged(store: castore.Store) -> Path:
    """Five tasks around the 30-day line (now is NOW_MS)."""
    root = Path(store.root)
    task_at(root, "old", NOW_MS - 31 * DAY_MS)
    task_at(root, "old-unfinished", NOW_MS - 31 * DAY_MS, finish=False)
    task_at(root, "young", NOW_MS - 29 * DAY_MS)
    # Older than 30 days by its stamp, but not by more than a clock could be off.
    task_at(root, "skew-edge", NOW_MS - 30 * DAY_MS - CLOCK_TOLERANCE_MS + 1)
    task_at(root, "future", NOW_MS + 365 * DAY_MS)
    return root


def test_gc_forgets_only_finished_tasks_older_than_the_period(aged: Path) -> None:
    """Only the finished task older than 30 days (plus the clock tolerance) is forgotten;
    an unfinished, a young, a borderline and a future-dated one are left alone."""
    report = collect(aged, forget_finished_after=THIRTY_DAYS_S, now=NOW_MS / 1000)
    assert ["old"] == report.forgotten
    assert ["old"] == forgotten(aged)
    status = castore.Store.open(aged).status("old")  # its history below is reclaimed now
    assert "by castore gc (" in status.reason
    assert "retention: finished" in status.reason
    assert ["old"] == report.reclaimed


def test_retention_is_off_by_default(aged: Path) -> None:
    """A plain gc forgets nothing, however old a finished task is."""
    report = collect(aged, now=NOW_MS / 1000)
    assert ([], []) == (report.forgotten, forgotten(aged))


def test_dry_run_says_what_it_would_forget_and_commits_nothing(
    aged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gc --dry-run --forget-finished-after 30d` names the task and writes no tombstone."""
    report = collect(aged, forget_finished_after=THIRTY_DAYS_S, now=NOW_MS / 1000, dry_run=True)
    assert (["old"], []) == (report.forgotten, forgotten(aged))
    # Through the CLI, whose clock is the real one, a little after NOW_MS: "skew-edge" is
    # just old enough by then.
    args = ["--store", str(aged), "gc", "--dry-run", "--forget-finished-after", "30d"]
    code, out, _ = cli(capsys, *args)
    assert 0 == code
    assert "would forget task old (finished" in out
    assert "task young" not in out
    assert "task future" not in out
    code, out, _ = cli(capsys, *args, "--json")
    assert ["old", "skew-edge"] == json.loads(out)["forgotten"]
    assert [] == forgotten(aged)


def test_retention_leaves_a_task_whose_head_moved(aged: Path) -> None:
    """forget with the HEAD retention read: a task that moved since is not forgotten."""
    store = castore.Store.open(aged)
    with pytest.raises(castore.ConflictError):
        store.forget("old", who="gc", why="retention", only_if_head="0" * 64)
    assert [] == forgotten(aged)


def test_a_zero_retention_period_is_refused(store: castore.Store) -> None:
    """`forget_finished_after=0` would forget every finished task at once: refused."""
    with pytest.raises(castore.UsageError, match="more than zero"):
        collect(store.root, forget_finished_after=0)
