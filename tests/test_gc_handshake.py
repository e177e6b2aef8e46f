"""gc never removes an object of an acknowledged commit, whatever the grace period and however
a writer and gc pause and interleave (gc.py, refs.py): real processes stopped inside a commit
and inside gc at named points, and a race of several writers with effects against gc running
with no grace period at all."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import helpers
import pytest
from helpers import cli

import castore
from castore.maintenance.fsck import Severity, check_store
from castore.maintenance.gc import collect

DEADLINE = 60.0
PLAN = castore.Plan.build("hs", "a", "b")

# A writer: start task argv[2] (plan PLAN), store a blob (argv[3] "disk": through another
# Store, so the commit must read it back instead of using the bytes it remembers), commit step
# "a" naming it, print the acknowledgement. The pause point comes from the environment.
WRITER = """
import sys
import castore
root, task, source = sys.argv[1], sys.argv[2], sys.argv[3]
plan = castore.Plan.build("hs", "a", "b")
putter = castore.Store.open(root)
ref = putter.put_blob({"payload": "x" * 100, "task": task})
store = castore.Store.open(root) if source == "disk" else putter
with store.start(task, plan) as run:
    print("started", flush=True)
    snapshot_id = run.commit_step("a", ref)
print("ack", snapshot_id, ref.blob, flush=True)
"""
GC = "import sys, castore.maintenance.gc; castore.maintenance.gc.collect(sys.argv[1], grace_s=0)"


def spawn(
    children: list[subprocess.Popen[str]], code: str, *args: str, pause: str | None = None
) -> subprocess.Popen[str]:
    return helpers.spawn_child(children, code, *args, pause=pause)


def wait_stopped(proc: subprocess.Popen[str]) -> None:
    helpers.wait_stopped(proc, DEADLINE)


def finish(proc: subprocess.Popen[str]) -> str:
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=DEADLINE)
    assert 0 == proc.returncode, err
    return out


def assert_acknowledged_commit_whole(store: castore.Store, task: str, out: str) -> None:
    """The commit the writer acknowledged is HEAD, resumes, its blob reads, fsck is clean."""
    ack = [line.split() for line in out.splitlines() if line.startswith("ack ")]
    assert 1 == len(ack), out
    _, snapshot_id, blob = ack[0]
    with store.resume(task, PLAN) as run:
        assert (snapshot_id, 1) == (run.head_id, run.head.seq)
        assert {"payload": "x" * 100, "task": task} == run.result("a")
    assert Path(store.objects.path(blob)).exists()
    errors = [f for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]
    assert [] == errors


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_gc_that_read_the_slots_before_the_link_keeps_the_commits_objects(
    store: castore.Store, children: list[subprocess.Popen[str]], source: str
) -> None:
    """The issue's interleaving: the writer stops with its snapshot and blob published but not
    linked; gc (no grace) reads the slots and stops; the writer links and acknowledges; gc
    goes on to remove what it found unnamed: it must see the new slot and keep both."""
    writer = spawn(children, WRITER, store.root, "t/1", source, pause="commit.before_link:2")
    wait_stopped(writer)
    gc = spawn(children, GC, store.root, pause="gc.slots_read")
    wait_stopped(gc)
    out = finish(writer)
    finish(gc)
    assert_acknowledged_commit_whole(store, "t/1", out)


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_gc_that_removed_the_objects_before_the_link_is_repaired_by_the_writer(
    store: castore.Store, children: list[subprocess.Popen[str]], source: str
) -> None:
    """The other order: gc sets the unlinked snapshot and blob aside, reads the slots again
    (no new one yet) and stops; the writer links its slot, finds the objects gone and stores
    them again before it acknowledges; gc then unlinks what it set aside."""
    writer = spawn(children, WRITER, store.root, "t/1", source, pause="commit.before_link:2")
    wait_stopped(writer)
    gc = spawn(children, GC, store.root, pause="gc.reread")
    wait_stopped(gc)
    out = finish(writer)
    finish(gc)
    assert_acknowledged_commit_whole(store, "t/1", out)


def test_gc_running_out_a_whole_pass_during_the_writers_pause(
    store: castore.Store, children: list[subprocess.Popen[str]]
) -> None:
    """gc (no grace) runs start to end while the writer is stopped just before its link: the
    snapshot object and the blob are removed; the writer stores both again and acknowledges."""
    writer = spawn(children, WRITER, store.root, "t/1", "disk", pause="commit.before_link:2")
    wait_stopped(writer)
    removed = collect(store.root, grace_s=0).removed
    assert 2 <= len(removed)  # the snapshot object and the blob were really removed
    out = finish(writer)
    assert_acknowledged_commit_whole(store, "t/1", out)


# A worker of the race: task argv[2], ROUNDS rounds of a blob step and an effect, each
# acknowledged commit printed. What gc removes before a commit names it (with no grace period:
# a blob just stored) is a failed call that commits nothing; the worker stores it again.
RACER = """
import sys
import castore
root, task, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = []
for i in range(rounds):
    steps += [f"blob{i}", castore.effect(f"pay{i}")]
plan = castore.Plan.build("race", *steps)
service = castore.Service("pay", idempotent=True, retention=3600)
store = castore.Store.open(root)
with store.open_task(task, plan) as run:
    print("ack", run.head.seq, run.head_id, "-", flush=True)
    for i in range(rounds):
        while True:
            try:
                ref = store.put_blob({"task": task, "i": i})
                run.commit_step(f"blob{i}", ref)
                break
            except castore.ObjectMissingError:
                continue  # gc took the blob before the commit named it: nothing committed
        print("ack", run.head.seq, run.head_id, ref.blob, flush=True)
        run.perform(f"pay{i}", service, lambda key: f"receipt-{key}")
        print("ack", run.head.seq, run.head_id, "-", flush=True)
print("exit", flush=True)
"""
RACERS = 3
ROUNDS = 25


def test_writers_with_effects_racing_gc_without_grace_lose_no_acknowledged_commit(
    store: castore.Store, children: list[subprocess.Popen[str]]
) -> None:
    """Three writers (blob results and effects) and gc looping with grace 0: every commit a
    writer acknowledged is in its chain, every blob it named reads back, fsck is clean."""
    race_writers_against_gc(store, store.root, children, garbage=50, rounds=ROUNDS)
    errors = [f for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]
    assert [] == errors


def race_writers_against_gc(
    store: castore.Store,
    where: str,
    children: list[subprocess.Popen[str]],
    *,
    garbage: int,
    rounds: int,
) -> None:
    """RACERS writer processes (RACER, `rounds` rounds each) and gc looping with grace 0 in a
    thread of this one, on the store at `where` (a path or an s3:// URL) that `garbage`
    unnamed blobs give gc something to remove all along: every commit a writer acknowledged
    is in its chain and every blob it named reads back."""
    for i in range(garbage):
        store.put_blob({"garbage": i})
    stop = threading.Event()
    removed: list[str] = []
    failures: list[BaseException] = []

    def gc_loop() -> None:
        while not stop.is_set():
            try:
                removed.extend(collect(where, grace_s=0).removed)
            except BaseException as exc:  # noqa: BLE001 - reported by the caller's assert
                failures.append(exc)
                return

    thread = threading.Thread(target=gc_loop, daemon=True)
    thread.start()
    try:
        racers = [spawn(children, RACER, where, f"race/{n}", str(rounds)) for n in range(RACERS)]
        outputs = [proc.communicate(timeout=DEADLINE * 3) for proc in racers]
    finally:
        stop.set()
        thread.join(DEADLINE)
    assert [] == failures
    for proc, (out, err) in zip(racers, outputs, strict=True):
        assert (0, "exit") == (proc.returncode, out.splitlines()[-1]), err
    assert len(removed) >= garbage, "gc did not run against the writers"
    for n, (out, _) in enumerate(outputs):
        chain = {snap.seq: oid for oid, snap in store.history(f"race/{n}")}
        acked = [line.split()[1:] for line in out.splitlines() if line.startswith("ack ")]
        assert 1 + 2 * rounds == len(acked)
        for seq, snapshot_id, blob in acked:
            assert snapshot_id == chain[int(seq)]
            if blob != "-":
                assert {"task": f"race/{n}", "i": (int(seq) - 1) // 3} == store.get_blob(blob)


def test_gc_that_cannot_list_objects_is_an_error_not_removed_0(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An objects/ gc cannot read (EACCES) is a StoreIOError naming it, exit 7, not a report
    of "removed 0 file(s)" with exit 0."""
    real_scandir = os.scandir
    objects_dir = store.layout.objects

    def scandir(path: object = ".") -> object:
        if os.fspath(path) == objects_dir:  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", objects_dir)
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(castore.errors.StoreIOError) as caught:
        collect(store.root, grace_s=0)
    assert objects_dir == caught.value.path
    assert "Permission denied" in str(caught.value)
    code, out, err = cli(capsys, "gc", store.root, "--grace", "0")
    assert (7, "") == (code, out)
    assert objects_dir in err
    assert "removed 0" not in err


def test_an_object_a_killed_gc_left_aside_is_linked_back_by_the_next_gc(
    store: castore.Store,
) -> None:
    """gc killed between a set-aside and its put back leaves a committed result blob under
    a temp name only: the next gc gives it its name back instead of removing it. (A
    snapshot's name it gives back from its slot first: test_lost_names.py.)"""
    with store.start("t/1", PLAN) as run:
        blob = store.put_blob({"big": 1}).blob
        head = run.commit_step("a", castore.BlobRef(blob))
    path = Path(store.objects.path(blob))
    aside = path.with_name(".tmp-gchost-4242-0123456789ab")
    os.rename(path, aside)
    then = 1_000_000_000.0
    os.utime(aside, (then, then), follow_symlinks=False)
    report = collect(store.root, grace_s=3600)
    assert ([f"objects/{blob[:2]}/{blob}"], []) == (report.restored, report.names_restored)
    assert (True, False) == (path.exists(), aside.exists())
    assert head == store.verify("t/1").head_id
    errors = [f for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]
    assert [] == errors
