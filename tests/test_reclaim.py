"""gc reclaims a forgotten task on a format-2 store (issue 13 item 4): the mark
{"pack": null, "through": F-1}, the slots below the tombstone pruned, the objects only they
named removed by gc's handshake; a stale writer loses at the post-link mark check; kills at
the named points leave what the next gc completes; a live fork keeps what it names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import cli, spawn_child
from test_gc_handshake import finish, spawn, wait_stopped
from test_watch import Alerts

import castore
import castore.store
from castore.chain.refs import TaskSlots
from castore.errors import ForkError, TaskForgottenError
from castore.format.plans import plan_id
from castore.maintenance.gc import collect
from castore.watch import Watcher

PLAN = castore.Plan.build("job", "a", "b", "c")
GC = "import sys, castore.maintenance.gc; castore.maintenance.gc.collect(sys.argv[1], grace_s=0)"


def forgotten_task(store: castore.Store, task: str = "t") -> tuple[str, int]:
    """Task `task` with a blob result at 1 and an inline one at 2, then forgotten at 3; the
    blob's id and the tombstone's seq."""
    with store.start(task, PLAN) as run:
        ref = store.put_blob({"only": task, "pad": "x" * 64})
        run.commit_step("a", ref)
        run.commit_step("b", 2)
    done = store.forget(task, who="ana", why="end")
    return ref.blob, done.seq


def task_dir(store: castore.Store, task: str) -> str:
    return store.layout.task_dir(task)


def present(store: castore.Store, task: str) -> list[int]:
    return sorted(int(name) for name in os.listdir(store.layout.chain_dir(task)))


def assert_reclaimed(store: castore.Store, task: str, tombstone_seq: int) -> None:
    """Only the tombstone's slot is left, the mark covers the rest, and the task stays
    forgotten and listed."""
    assert [tombstone_seq] == present(store, task)
    mark = TaskSlots(store.medium, store.objects, task).mark()
    assert mark is not None
    assert (None, tombstone_seq - 1) == (mark.pack, mark.through)
    assert task in store.tasks()
    for verify in (False, True):
        assert True is store.status(task, verify=verify).forgotten
    with pytest.raises(TaskForgottenError):
        store.open_task(task, PLAN)


def test_gc_reclaims_a_forgotten_task_and_the_objects_only_it_named(
    store: castore.Store,
) -> None:
    """gc writes the mark, prunes the slots below the tombstone and, with no grace, removes
    the blob and the snapshots only they named; the mark file is the documented bytes."""
    blob, seq = forgotten_task(store)
    with store.start("other", PLAN) as run:  # shares the plan: it must stay
        run.commit_step("a", 1)
    report = collect(store.root, grace_s=0)
    assert ["t"] == report.reclaimed
    assert_reclaimed(store, "t", seq)
    assert not Path(store.objects.path(blob)).exists()
    assert f"objects/{blob[:2]}/{blob}" in report.removed
    mark_bytes = Path(store.layout.marks_dir("t"), "0000000000000000").read_bytes()
    assert b'{"pack":null,"through":2}\n' == mark_bytes
    with store.resume("other", PLAN) as run:
        assert 1 == run.result("a")
    assert [] == collect(store.root, grace_s=0).reclaimed  # nothing left to do


def test_log_of_a_reclaimed_task_shows_its_tombstone(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore log` shows the tombstone and says the history was reclaimed (not "broken")."""
    forgotten_task(store)
    collect(store.root, grace_s=0)
    code, out, err = cli(capsys, "--store", str(store.root), "log", "t")
    assert 0 == code
    assert 1 == len(out.splitlines())
    assert "forget by ana why: end" in out
    assert "gc reclaimed its history below the tombstone" in err


def test_watch_raises_no_chain_alert_for_a_reclaimed_task(store: castore.Store) -> None:
    """`castore watch` takes a reclaimed task's tombstone for its HEAD, not for a broken
    chain: no alert, on the first read or the next."""
    forgotten_task(store)
    collect(store.root, grace_s=0)
    alerts = Alerts()
    watcher = Watcher(store.root, alerts)
    watcher.check_now()
    watcher.check_now()
    assert [] == [(a.kind, a.task) for a in alerts.all]


def test_a_v1_store_is_never_reclaimed(store: castore.Store) -> None:
    """forget and fork write v2 records: a v1 store refuses them until `castore upgrade`,
    and gc writes no mark in it."""
    with store.start("t", PLAN) as run:
        run.commit_step("a", 1)
    Path(store.layout.marker).write_bytes(b'{"format":"castore","version":1}\n')
    v1 = castore.Store.open(store.root)
    with pytest.raises(castore.UsageError, match="castore upgrade"):
        v1.forget("t", who="ana", why="end")
    with pytest.raises(castore.UsageError, match="castore upgrade"):
        v1.fork("t@1", "copy")
    assert [] == collect(store.root, grace_s=0).reclaimed
    assert [0, 1] == present(store, "t")


def test_a_live_fork_keeps_what_it_names_after_its_source_is_reclaimed(
    store: castore.Store,
) -> None:
    """Fork t@2, forget t, gc with no grace: t's slots and its own objects go, the blob the
    fork carries stays, and the fork resumes with it."""
    blob, seq = forgotten_task_after_fork(store)
    report = collect(store.root, grace_s=0)
    assert ["t"] == report.reclaimed
    assert_reclaimed(store, "t", seq)
    assert Path(store.objects.path(blob)).exists()
    with store.resume("copy", PLAN) as run:
        assert ({"only": "t", "pad": "x" * 64}, 2) == (run.result("a"), run.result("b"))
        run.commit_step("c", 3)
    with pytest.raises(ForkError, match="forgotten and gc reclaimed its history"):
        store.fork("t@1", "another")
    store.fork("copy@0", "another")  # what the fork carries, it carries on
    with store.resume("another", PLAN) as run:
        assert ({"only": "t", "pad": "x" * 64}, "c") == (run.result("a"), run.next_step)


def test_gc_keeps_everything_when_a_forks_tree_cannot_be_read(store: castore.Store) -> None:
    """A fork whose outcomes tree is missing might name anything: gc removes no object and
    reports the tree as unreadable, as for any chain it cannot read."""
    blob, _ = forgotten_task_after_fork(store)
    tree = store.history("copy")[0][1].fork
    assert tree is not None
    os.unlink(store.objects.path(tree.outcomes))
    report = collect(store.root, grace_s=0)
    assert ([], [tree.outcomes]) == (report.removed, list(report.unreadable_objects))
    assert report.unreadable
    assert Path(store.objects.path(blob)).exists()


def forgotten_task_after_fork(store: castore.Store) -> tuple[str, int]:
    with store.start("t", PLAN) as run:
        ref = store.put_blob({"only": "t", "pad": "x" * 64})
        run.commit_step("a", ref)
        run.commit_step("b", 2)
    store.fork("t@2", "copy")
    return ref.blob, store.forget("t", who="ana", why="end").seq


@pytest.mark.parametrize("point", ["reclaim.marked", "reclaim.pruned"])
def test_gc_killed_while_reclaiming_leaves_what_the_next_gc_completes(
    store: castore.Store, children: list[subprocess.Popen[str]], point: str
) -> None:
    """SIGKILL inside the reclaim: the mark is written (and maybe the slots pruned), the task
    is forgotten either way, and the next gc finishes the job."""
    blob, seq = forgotten_task(store)
    with_crash = spawn_child(children, GC, str(store.root), crash=point)
    assert -9 == with_crash.wait(timeout=60)
    mark = TaskSlots(store.medium, store.objects, "t").mark()
    assert mark is not None
    assert seq - 1 == mark.through
    expected = [seq] if point == "reclaim.pruned" else list(range(seq + 1))
    assert expected == present(store, "t")
    with pytest.raises(TaskForgottenError):
        store.resume("t", PLAN)
    collect(store.root, grace_s=0)
    assert_reclaimed(store, "t", seq)
    assert not Path(store.objects.path(blob)).exists()


FORGET = (
    "import sys, castore\n"
    "castore.Store.open(sys.argv[1]).forget('t', who='ana', why='crash')\n"
    "print('forgotten', flush=True)\n"
)


@pytest.mark.parametrize(
    ("point", "forgotten"),
    [("commit.before_link", False), ("commit.linked", True), ("commit.done", True)],
)
def test_forget_killed_at_each_commit_point(
    store: castore.Store, children: list[subprocess.Popen[str]], point: str, forgotten: bool
) -> None:
    """SIGKILL in forget's commit: before the link nothing happened (the task resumes);
    after it the task is forgotten, and a second forget finds the tombstone."""
    with store.start("t", PLAN) as run:
        run.commit_step("a", 1)
    proc = spawn_child(children, FORGET, str(store.root), crash=point)
    assert -9 == proc.wait(timeout=60)
    assert forgotten == store.status("t").forgotten
    if not forgotten:
        with store.resume("t", PLAN) as run:
            assert "b" == run.next_step
    again = store.forget("t", who="bo", why="again")
    assert (2, forgotten) == (again.seq, again.already)


# A stale writer: resume t (HEAD 1), then stop just before linking its commit of seq 2.
STALE = """
import sys
import castore
import castore.store
from castore.errors import ConflictError
store = castore.Store.open(sys.argv[1])
run = store.resume("t", castore.Plan.build("job", "a", "b", "c"))
try:
    run.commit_step("b", "stale")
    print("committed", flush=True)
except ConflictError as exc:
    print("conflict at", exc.seq, flush=True)
"""


def test_a_stale_writer_of_a_reclaimed_task_loses_at_the_mark_check(
    store: castore.Store, children: list[subprocess.Popen[str]]
) -> None:
    """A writer stopped before linking seq 2; meanwhile another writer commits 2, the task
    is forgotten at 3 and gc prunes slots 0..2. The stale writer's link of 2 succeeds in the
    freed range, and the mark it reads after the link makes it take it back: ConflictError,
    no slot 2, the tombstone still HEAD."""
    with store.start("t", PLAN) as run:
        run.commit_step("a", 1)
    writer = spawn(children, STALE, str(store.root), pause="commit.before_link")
    wait_stopped(writer)
    with store.resume("t", PLAN, lock_timeout=None) as run:
        run.commit_step("b", "winner")
    seq = store.forget("t", who="ana", why="end").seq
    assert ["t"] == collect(store.root, grace_s=0).reclaimed
    out = finish(writer)
    assert "conflict at 2" == out.strip()
    assert_reclaimed(store, "t", seq)
    assert seq == store.status("t").seq


@pytest.mark.parametrize("sealed", [False, True], ids=["slots", "sealed"])
def test_gc_keeps_the_plan_a_tombstone_names(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sealed: bool,
) -> None:
    """A task whose plan no other task shares, forgotten and reclaimed with no grace: the
    plan its tombstone names stays, so fsck finds no error, and status and brief of the task
    succeed (the plan went with the first gc before issue 23)."""
    monkeypatch.setattr(castore.store, "SEAL_EVERY", 2 if sealed else 4096)
    store = castore.Store.init(tmp_path / "store")
    plan = castore.Plan.build("alone", "a", "b", "c")
    with store.start("t", plan) as run:
        run.commit_step("a", store.put_blob({"pad": "x" * 64}))
        run.commit_step("b", 2)
    done = store.forget("t", who="ana", why="end")
    assert ["t"] == collect(store.root, grace_s=0).reclaimed
    assert [done.seq] == present(store, "t")
    assert Path(store.objects.path(plan_id(plan))).exists()
    summary = castore.maintenance.fsck.Summary()
    errors = [
        f"{f.code} {f.path}"
        for f in castore.maintenance.fsck.check_store(store.root, jobs=1, summary=summary)
        if f.severity.value == "error"
    ]
    assert ([], 0) == (errors, summary.exit_status)
    assert store.status("t").forgotten
    code, out, _ = cli(capsys, "--store", str(store.root), "brief", "t")
    assert (0, True) == (code, "forgotten" in out.lower())
