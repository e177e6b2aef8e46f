"""Writers SIGKILLed at each step of sealing: the chain verifies, nothing acknowledged is
lost, and the next run finishes what the seal left (mark and prune)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from helpers import acks, spawn_child
from sealing import plan_of, v2_store

import castore
from castore import crashpoints
from castore.format.layout import parse_slot_name

TASK = "sealing"
STEPS = 40
EVERY = 8
DEADLINE = 60.0

# The child: seal every argv[4] commits; open the task and commit until argv[3] steps are
# done (0: to the end of the plan); print each commit once commit_step returned it.
WRITER = """
import sys
import castore, castore.store

root, task, limit, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
castore.store.SEAL_EVERY = every
plan = castore.Plan.build("sealed", *[f"s{i}" for i in range(int(sys.argv[5]))])
run = castore.Store.open(root).open_task(task, plan)
print("ack", run.head.seq, run.head_id, flush=True)
done = 0
while run.next_step is not None and (limit == 0 or done < limit):
    snapshot_id = run.commit_step(run.next_step, run.next_step)
    print("ack", run.head.seq, snapshot_id, flush=True)
    done += 1
run.close()
print("exit", flush=True)
"""


def start_writer(
    children: list[subprocess.Popen[str]], root: str, limit: int, crash_at: str | None = None
) -> subprocess.Popen[str]:
    return spawn_child(
        children, WRITER, root, TASK, str(limit), str(EVERY), str(STEPS), crash=crash_at
    )


def history_ids(store: castore.Store) -> dict[int, str]:
    return {snapshot.seq: object_id for object_id, snapshot in store.history(TASK)}


def slots_present(store: castore.Store) -> list[int]:
    names = os.listdir(store.layout.chain_dir(TASK))
    return sorted(seq for seq in map(parse_slot_name, names) if seq is not None)


# What a kill at the first arrival of each point leaves, the first seal being the pack of
# seq 0..7: (does HEAD carry an anchor, the mark's through, are slots 0..7 still all there).
SEAL_POINTS = {
    "seal.pack_written": (False, None, True),  # a published pack no commit names
    "seal.committed": (True, None, True),  # the commit naming it is durable, no mark
    "mark.written": (True, 7, True),  # the mark is written, nothing pruned
    "seal.mark_written": (True, 7, True),
    "prune.slot_removed": (True, 7, False),  # one slot (and its object) removed
    "seal.pruned": (True, 7, False),  # slots 0..7 and their objects gone
}


def test_every_seal_point_is_a_known_crash_point() -> None:
    """The points these tests arm are all offered by castore.crashpoints."""
    assert set(SEAL_POINTS) <= set(crashpoints.POINTS)


@pytest.mark.parametrize("point", list(SEAL_POINTS))
def test_a_kill_at_each_seal_point_leaves_a_chain_the_next_run_finishes(
    tmp_path: object, children: list[subprocess.Popen[str]], point: str
) -> None:
    """A writer killed at a step of its first seal: the chain verifies with every commit it
    acknowledged; the state is what the step implies; a new run finishes the mark and prune
    and the task, which ends sealed whole."""
    store = v2_store(os.path.join(str(tmp_path), "store"))
    proc = start_writer(children, store.root, 30, crash_at=point)
    out, errors = proc.communicate(timeout=DEADLINE)
    assert -signal.SIGKILL == proc.returncode, f"did not die at {point}: {errors}"
    acknowledged = acks(out)
    chain = store.verify(TASK)
    assert acknowledged == {seq: history_ids(store)[seq] for seq in acknowledged}
    anchored, through, all_slots = SEAL_POINTS[point]
    assert anchored == (chain.head.sealed is not None)
    mark = store._slots(TASK).mark()
    assert through == (mark.through if mark is not None else None)
    assert all_slots == (set(range(8)) <= set(slots_present(store)))
    # The next run finishes the seal (mark, prune) and the task; close seals it whole.
    rest = start_writer(children, store.root, 0)
    out, errors = rest.communicate(timeout=DEADLINE)
    assert 0 == rest.returncode, errors
    final = store.verify(TASK)
    assert acknowledged == {seq: history_ids(store)[seq] for seq in acknowledged}
    assert castore.format.records.TransitionKind.SEAL == final.head.transition.kind
    assert final.head.sealed is not None
    assert [final.head.seq] == slots_present(store)
    mark = store._slots(TASK).mark()
    assert mark is not None
    assert final.head.sealed.through == mark.through
    assert STEPS == len(final.outcomes)
    with store.resume(TASK, plan_of(STEPS)) as run:
        assert run.finished
        assert "s3" == run.result("s3")
