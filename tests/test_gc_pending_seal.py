"""gc leaves alone a pack a seal in progress may still name (FORMAT.md §17 rule 5,
castore/maintenance/pendingseal.py), and removes it once nothing can name it.

Without the rule, a writer paused between publishing a pack and committing the snapshot that
names it loses the pack to gc; its commit stores it again after its link, but a resume
between the two is told the chain is broken (the S3 simulation's seed 8 found this).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import cli, spawn_child, wait_stopped
from sealing import plan_of, v2_store

import castore
import castore.store
from castore.chain import packs
from castore.maintenance import pendingseal
from castore.maintenance.fsck import Severity, check_store
from castore.maintenance.gc import collect

TASK = "sealing"
DEADLINE = 60.0

# The child: seal every 8 commits, commit 12 steps, close (the pause point comes from the
# environment: seal.pack_written stops it with the first pack published and not yet named).
WRITER = """
import sys
import castore, castore.store
castore.store.SEAL_EVERY = 8
plan = castore.Plan.build("sealed", *[f"s{i}" for i in range(12)])
with castore.Store.open(sys.argv[1]).open_task(sys.argv[2], plan) as run:
    for step in run.pending():
        run.commit_step(step, step)
print("done", run.head.seq, flush=True)
"""


def pack_files(root: str | os.PathLike[str]) -> set[str]:
    """The ids of every pack in the store's objects/."""
    found = set()
    for path in Path(root, "objects").rglob("*"):
        if path.is_file() and path.read_bytes().startswith(b"castore 2 pack "):
            found.add(path.name)
    return found


def slot_bytes(store: castore.Store, task: str, count: int) -> list[bytes]:
    assert store.layout is not None  # a directory store
    chain = Path(store.layout.chain_dir(task))
    return [(chain / f"{seq:016d}").read_bytes() for seq in range(count)]


def unsealed_task(store: castore.Store, task: str, steps: int, total: int = 10) -> list[bytes]:
    """`task` (plan_of(total)) with `steps` commits and no seal (the default cadence is far
    off): its slots."""
    with store.open_task(task, plan_of(total)) as run:
        for seq in range(steps):
            run.commit_step(f"s{seq}", f"s{seq}")
    return slot_bytes(store, task, steps)


def no_errors(store: castore.Store) -> None:
    errors = [f for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]
    assert [] == errors


@pytest.mark.parametrize("rule", ["kept", "self-test: without the rule"])
def test_a_writer_paused_between_its_pack_and_the_commit_naming_it_keeps_the_pack(
    tmp_path: Path,
    children: list[subprocess.Popen[str]],
    monkeypatch: pytest.MonkeyPatch,
    rule: str,
) -> None:
    """A real writer stopped at seal.pack_written; gc with no grace at all runs out a whole
    pass. The pack stays (the self-test, with the rule taken out, sees gc remove it); the
    writer goes on, names it, and the task resumes, sealed, with fsck clean."""
    store = v2_store(tmp_path / "store")
    if rule != "kept":
        monkeypatch.setattr(pendingseal.PendingSeals, "holds", lambda self, key: False)
    writer = spawn_child(children, WRITER, str(store.root), TASK, pause="seal.pack_written")
    wait_stopped(writer, DEADLINE)
    published = pack_files(store.root)
    assert 1 == len(published)
    report = collect(store.root, grace_s=0)
    if rule != "kept":
        assert published.isdisjoint(pack_files(store.root))  # what the rule is there for
        assert 0 == report.kept_pending
    else:
        assert published == pack_files(store.root)
        assert 1 == report.kept_pending
        assert not any(key.endswith(tuple(published)) for key in report.removed)
    os.kill(writer.pid, signal.SIGCONT)
    out, err = writer.communicate(timeout=DEADLINE)
    assert 0 == writer.returncode, err
    # 12 steps after the start (seq 12), and the close's seal commit (13) unless the run's
    # own last commit already carried a pack holding HEAD: which one is timing.
    (head,) = [int(line.split()[1]) for line in out.splitlines() if line.startswith("done ")]
    assert head in (12, 13), out
    with store.resume(TASK, plan_of(12)) as run:
        assert head == run.head.seq
        assert run.next_step is None
    assert published <= pack_files(store.root)  # named now (the writer stored it again)
    no_errors(store)


def test_a_pack_above_the_mark_of_its_task_stays_and_goes_once_the_task_is_reclaimed(
    store: castore.Store,
) -> None:
    """An unnamed pack of a live task's unsealed range (a seal that may still commit): kept
    by every gc. Once the task is forgotten and its history reclaimed (the mark passes the
    pack's range), nothing can name it: the next gc removes it."""
    framed = unsealed_task(store, TASK, 6)
    pack_id = store.objects.put_framed(packs.build(framed[:4], prev=None, parent=None))
    for _ in range(2):
        report = collect(store.root, grace_s=0)
        assert 1 == report.kept_pending
        assert Path(store.objects.path(pack_id)).exists()
    store.forget(TASK, who="test", why="done with it")
    report = collect(store.root, grace_s=0)  # reclaims, then removes what is unnamed
    assert [TASK] == report.reclaimed
    assert 0 == report.kept_pending
    assert not Path(store.objects.path(pack_id)).exists()
    no_errors(store)


def test_a_losers_pack_goes_once_another_seal_moved_the_mark_past_it(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack of seqs 0..3 that lost: the task was sealed through 15 by another run since. The
    mark has passed its range, no commit can name it, gc removes it."""
    framed = unsealed_task(store, TASK, 4, total=20)
    loser = store.objects.put_framed(packs.build(framed, prev=None, parent=None))
    monkeypatch.setattr(castore.store, "SEAL_EVERY", 8)
    with store.open_task(TASK, plan_of(20)) as run:
        for step in run.pending():
            run.commit_step(step, step)
    assert len(pack_files(store.root) - {loser}) >= 2  # the seal's own packs, 0..7, 8..15
    report = collect(store.root, grace_s=0)
    assert 0 == report.kept_pending
    assert not Path(store.objects.path(loser)).exists()
    with store.resume(TASK, plan_of(20)) as run:
        assert run.next_step is None
    no_errors(store)


def test_a_forged_pack_of_a_task_the_store_does_not_have_is_not_kept(
    tmp_path: Path, store: castore.Store
) -> None:
    """A valid pack built in another store, of a task this store does not have, planted in
    objects/: no seal here can name it, so rule 5 does not keep it."""
    other = v2_store(tmp_path / "other")
    framed = unsealed_task(other, "ghost", 4)
    forged = packs.build(framed, prev=None, parent=None)
    pack_id = store.objects.put_framed(forged)
    report = collect(store.root, grace_s=0)
    assert 0 == report.kept_pending
    assert not Path(store.objects.path(pack_id)).exists()


def test_gc_says_what_it_kept_for_a_seal_in_progress(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's last line counts the packs kept for a seal in progress."""
    framed = unsealed_task(store, TASK, 6)
    store.objects.put_framed(packs.build(framed[:4], prev=None, parent=None))
    code, out, err = cli(capsys, "gc", str(store.root), "--grace", "0")
    assert 0 == code, err
    last = out.strip().splitlines()[-1]
    assert last.endswith("and 1 pack(s) a seal in progress may still name"), last
