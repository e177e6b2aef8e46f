"""Sealing against concurrent readers and writers: a reader that meets a prune starts over
from the new HEAD; two writers racing through seals keep one chain with every commit either
acknowledged; a stale writer's commit into a pruned range loses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for
from sealing import EVERY, plan_of, seal_often, v2_store

import castore
import castore.chain.verify as verify_module
from castore.chain.objects import ObjectStore
from castore.chain.refs import TaskSlots
from castore.chain.verify import verify_chain
from castore.errors import ChainError, ConflictError
from castore.format.layout import parse_slot_name

pytestmark = pytest.mark.usefixtures(seal_often.__name__)
TASK = "raced"
DEADLINE = 120.0


@pytest.fixture
def v2(tmp_path: Path) -> castore.Store:
    return v2_store(tmp_path / "v2")


def test_a_reader_that_meets_a_prune_starts_over_from_the_new_head(
    v2: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk from HEAD 7 is interrupted (before it reads seq 6) by the writer's next commit,
    which names the pack of 0..7, and its prune: the walk meets a pruned object, sees the mark
    moved, and verifies again from HEAD 8 through the pack."""
    plan = plan_of(40)
    writer = v2.start(TASK, plan)
    for _ in range(7):
        writer.commit_step(str(writer.next_step), "r")
    writer._sealer.drain()  # type: ignore[union-attr]  # the pack of 0..7 is ready
    real = verify_module._read_snapshot
    raced: list[int] = []

    def racing(objects: ObjectStore, slots: TaskSlots, object_id: object, seq: int) -> bytes:
        if seq == 6 and not raced:
            raced.append(seq)
            writer.commit_step(str(writer.next_step), "r")  # names the pack of 0..7
            writer._sealer.drain()  # type: ignore[union-attr]  # mark 7, slots 0..7 pruned
        return real(objects, slots, object_id, seq)

    monkeypatch.setattr(verify_module, "_read_snapshot", racing)
    chain = verify_chain(v2.objects, v2._slots(TASK))
    assert [6] == raced
    assert (8, writer.head_id) == (chain.head.seq, chain.head_id)
    assert chain.head.sealed is not None
    assert 7 == chain.head.sealed.through
    writer.close()


def test_a_missing_object_without_a_moved_mark_is_damage(
    v2: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same walk, but the snapshot vanishes (its object name and its slot) without any
    seal: no restart, a ChainError."""
    plan = plan_of(40)
    with v2.start(TASK, plan) as run:
        for _ in range(5):
            run.commit_step(str(run.next_step), "r")
    real = verify_module._read_snapshot
    reads: list[int] = []

    def vanishing(objects: ObjectStore, slots: TaskSlots, object_id: object, seq: int) -> bytes:
        reads.append(seq)
        if seq == 3:
            # The name alone would not do: the slot stands for a lost name (snapshotread.py).
            os.unlink(objects.path(str(object_id)))
            os.unlink(slots.path(seq))
        return real(objects, slots, object_id, seq)

    monkeypatch.setattr(verify_module, "_read_snapshot", vanishing)
    with pytest.raises(ChainError, match="at slot 3"):
        verify_chain(v2.objects, v2._slots(TASK))
    assert [5, 4, 3] == reads  # one walk only


def test_a_stale_writer_linking_into_a_pruned_range_loses(v2: castore.Store) -> None:
    """A run paused since HEAD was 3 wakes after the task was sealed through 7 and pruned:
    its commit of seq 4 links into a freed name, and loses at the mark check."""
    plan = plan_of(40)
    with v2.start(TASK, plan) as run:
        for _ in range(3):
            run.commit_step(str(run.next_step), "r")
    stale = v2.resume(TASK, plan, lock_timeout=None)
    with v2.resume(TASK, plan, lock_timeout=None) as run:
        for _ in range(6):
            run.commit_step(str(run.next_step), "r")
            run._sealer.drain()  # type: ignore[union-attr]  # the seal lands at seq 8, always
    assert v2._slots(TASK).mark() is not None
    with pytest.raises(ConflictError):
        stale.commit_step(str(stale.next_step), "stale")
    assert not v2._slots(TASK).exists(4)
    assert 9 == v2.verify(TASK).head.seq
    stale.close()


def test_a_pack_removed_before_the_commit_naming_it_is_stored_again(v2: castore.Store) -> None:
    """The pack is published, then gone (a gc took it as unreferenced, the writer paused past
    the grace period) before the commit that names it: that commit stores it again from the
    bytes it holds, so no acknowledged anchor names a missing pack."""
    plan = plan_of(40)
    with v2.start(TASK, plan) as run:
        for _ in range(7):
            run.commit_step(str(run.next_step), "r")
        run._sealer.drain()  # type: ignore[union-attr]  # the pack of 0..7 is published
        ready = run._sealer.next_anchor()  # type: ignore[union-attr]
        assert ready is not None
        os.unlink(v2.objects.path(ready.pack))
        run.commit_step(str(run.next_step), "names the pack")
        assert ready == run.head.sealed
    assert os.path.exists(v2.objects.path(ready.pack))
    assert 8 == v2.verify(TASK).head.seq


# A writer that keeps going: on losing a commit it resumes and goes on, until the plan is
# done. It prints each commit it was acknowledged, and "done" at the end.
WRITER = """
import sys
import castore, castore.store

root, task, every, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
castore.store.SEAL_EVERY = every
plan = castore.Plan.build("sealed", *[f"s{i}" for i in range(steps)])
store = castore.Store.open(root)
while True:
    run = store.open_task(task, plan, lock_timeout=None)
    try:
        while run.next_step is not None:
            snapshot_id = run.commit_step(run.next_step, sys.argv[5])
            print("ack", run.head.seq, snapshot_id, flush=True)
        run.close()
        break
    except castore.ConflictError:
        run.close(finish=False)
print("done", flush=True)
"""


def start_writer(
    children: list[subprocess.Popen[str]], root: str, steps: int, name: str
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, root, TASK, str(EVERY), str(steps), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children.append(proc)
    return proc


def acks(lines: str) -> dict[int, str]:
    found = {}
    for line in lines.splitlines():
        parts = line.split()
        if parts and parts[0] == "ack":
            found[int(parts[1])] = parts[2]
    return found


def test_two_writers_racing_through_seals_keep_one_chain(
    v2: castore.Store, children: list[subprocess.Popen[str]]
) -> None:
    """Two processes drive one task, losing and resuming, while each seals every 8 of its
    commits: one chain verifies, every commit either was acknowledged is in it, and the task
    ends sealed with its slots pruned below the mark."""
    steps = 120
    procs = [start_writer(children, v2.root, steps, name) for name in ("a", "b")]
    outputs = [proc.communicate(timeout=DEADLINE) for proc in procs]
    for proc, (_, errors) in zip(procs, outputs, strict=True):
        assert 0 == proc.returncode, errors
    history = {snapshot.seq: oid for oid, snapshot in v2.history(TASK)}
    for out, _ in outputs:
        acknowledged = acks(out)
        assert acknowledged == {seq: history[seq] for seq in acknowledged}
    acknowledged_by_any = set(acks(outputs[0][0])) | set(acks(outputs[1][0]))
    assert set(range(1, steps + 1)) <= acknowledged_by_any
    chain = v2.verify(TASK)
    assert chain.head.sealed is not None
    mark = v2._slots(TASK).mark()
    assert mark is not None
    names = os.listdir(v2.layout.chain_dir(TASK))
    assert all(seq > mark.through for seq in map(parse_slot_name, names) if seq is not None)


def test_readers_verify_while_a_writer_seals_and_prunes(
    v2: castore.Store, children: list[subprocess.Popen[str]]
) -> None:
    """Verifications from this process while a writer commits 200 steps, sealing and pruning
    every 8: each one succeeds (a walk that meets a prune starts over)."""
    proc = start_writer(children, v2.root, 200, "w")
    wait_for(lambda: v2._slots(TASK).started(), DEADLINE, "the writer's first commit")
    verified, sealed_seen = 0, set()
    while proc.poll() is None:
        chain = v2.verify(TASK)
        verified += 1
        if chain.head.sealed is not None:
            sealed_seen.add(chain.head.sealed.through)
    _, errors = proc.communicate(timeout=DEADLINE)
    assert 0 == proc.returncode, errors
    assert verified > 20, f"only {verified} verifications ran during the writer's run"
    assert len(sealed_seen) > 3, f"readers saw only the seals {sorted(sealed_seen)}"
