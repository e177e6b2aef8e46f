"""Writers SIGKILLed mid-commit: the chain verifies and no acknowledged commit is lost."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
from helpers import acks, misnamed_objects, object_files, read_line, spawn_child

import castore
from castore import crashpoints
from castore.format.layout import is_object_name, parse_slot_name, parse_temp_name

TASK = "crash/1"
STEPS = 3000  # more than the random kills let the writer commit
DEADLINE = 30.0
KILLS = int(os.environ.get("CASTORE_CRASH_KILLS", "30"))
SEED = int(os.environ.get("CASTORE_CRASH_SEED", "20261130"))

# The child: open the task (start or resume) with a plan of argv[4] steps, then commit steps
# until argv[3] are done (0: until killed). A commit is acknowledged only once it is printed,
# and it is printed only after commit_step returned.
WRITER = """
import os, sys
import castore

root, task, limit, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
plan = castore.Plan.build("crash", *[f"s{i}" for i in range(steps)])
run = castore.Store.open(root).open_task(task, plan)
print("ack", run.head.seq, run.head_id, flush=True)
print("ready", flush=True)
done = 0
while run.next_step is not None and (limit == 0 or done < limit):
    snapshot_id = run.commit_step(run.next_step, {"pid": os.getpid(), "n": done})
    print("ack", run.head.seq, snapshot_id, flush=True)
    done += 1
run.close()
print("exit", flush=True)
"""


def plan_of(steps: int) -> castore.Plan:
    return castore.Plan.build("crash", *[f"s{i}" for i in range(steps)])


PLAN = plan_of(10)  # for the crash point tests


def start_writer(
    children: list[subprocess.Popen[str]],
    root: str,
    limit: int,
    crash_at: str | None = None,
    steps: int = len(PLAN.steps),
) -> subprocess.Popen[str]:
    return spawn_child(children, WRITER, root, TASK, str(limit), str(steps), crash=crash_at)


def history_ids(store: castore.Store) -> dict[int, str]:
    return {snapshot.seq: object_id for object_id, snapshot in store.history(TASK)}


# -- random kills --------------------------------------------------------------------------------


def test_random_kills_never_lose_an_acknowledged_commit(
    store: castore.Store, children: list[subprocess.Popen[str]]
) -> None:
    """A writer SIGKILLed at random moments, restarted each time: every ack survives."""
    rng = random.Random(SEED)
    acknowledged: dict[int, str] = {}
    for _ in range(KILLS):
        proc = start_writer(children, store.root, 0, steps=STEPS)
        output = []
        while (line := read_line(proc, DEADLINE)) != "ready\n":
            assert line, f"writer exited early: {proc.communicate()[1]}"
            output.append(line)
        ready = acks("".join(output))
        # The HEAD a restarted writer resumes at includes everything acknowledged before.
        assert max(acknowledged, default=0) <= max(ready)
        delay = rng.uniform(0.0, 0.030)
        # A random moment to kill at, not a wait for anything: the point of the test.
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        rest, errors = proc.communicate(timeout=DEADLINE)
        assert -signal.SIGKILL == proc.returncode, errors
        for seq, object_id in {**ready, **acks(rest)}.items():
            assert acknowledged.setdefault(seq, object_id) == object_id, f"seq {seq} changed"
    chain = store.verify(TASK)
    found = history_ids(store)
    assert acknowledged == {seq: found[seq] for seq in acknowledged}
    assert chain.length - 1 >= max(acknowledged)
    assert [] == misnamed_objects(store.root)
    assert len(acknowledged) > KILLS, "too few commits were acknowledged to mean anything"


# -- named crash points --------------------------------------------------------------------------

# Where each point leaves the second commit of the child (sequence 4; HEAD was 2 before it):
# (HEAD seq after the crash, temp files left, unreferenced final-named objects left)
COMMIT_POINTS = {
    "object.temp_created": (3, 1, 0),
    "object.mid_write": (3, 1, 0),
    "object.temp_synced": (3, 1, 0),
    "object.linked": (3, 1, 1),
    "object.published": (3, 0, 1),
    "commit.before_link": (3, 0, 1),
    "commit.linked": (4, 0, 0),
    "commit.done": (4, 0, 0),
}


def test_every_commit_point_is_a_known_crash_point() -> None:
    """The points these tests arm are all offered by castore.crashpoints."""
    assert set(COMMIT_POINTS) <= set(crashpoints.POINTS)


def leftovers(store: castore.Store, pid: int) -> tuple[list[str], list[str]]:
    """(temp files, final-named objects no chain or plan refers to) under objects/."""
    referenced = set(history_ids(store).values()) | {castore.plan_id(PLAN)}
    temps, unreferenced = [], []
    for name in object_files(store.root):
        if is_object_name(name):
            if name not in referenced:
                unreferenced.append(name)
            continue
        parsed = parse_temp_name(name)
        assert parsed is not None, f"a file that is neither object nor temp: {name}"
        assert pid == parsed[1], f"temp file {name} is not the crashed writer's"
        temps.append(name)
    return temps, unreferenced


def crash_child(
    children: list[subprocess.Popen[str]], store: castore.Store, point: str, limit: int
) -> tuple[subprocess.Popen[str], dict[int, str]]:
    proc = start_writer(children, store.root, limit, crash_at=point)
    out, errors = proc.communicate(timeout=DEADLINE)
    assert -signal.SIGKILL == proc.returncode, f"did not die at {point}: {errors}"
    return proc, acks(out)


def assert_chain_dir_is_slots_only(store: castore.Store, head: int) -> None:
    names = sorted(os.listdir(store.layout.chain_dir(TASK)))
    assert list(range(head + 1)) == [parse_slot_name(name) for name in names]


@pytest.mark.parametrize("point", list(COMMIT_POINTS))
def test_a_kill_at_each_commit_point_leaves_a_verifying_chain(
    store: castore.Store, children: list[subprocess.Popen[str]], point: str
) -> None:
    """A kill at a named commit point: HEAD is as the point implies; leftovers are harmless."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("s0")
        run.commit_step("s1")
    head, temps_left, objects_left = COMMIT_POINTS[point]
    proc, acknowledged = crash_child(children, store, f"{point}:2", 5)
    assert [2, 3] == sorted(acknowledged)  # resumed at 2, committed 3, died during 4
    chain = store.verify(TASK)
    assert head == chain.head.seq
    found = history_ids(store)
    assert acknowledged == {seq: found[seq] for seq in acknowledged}
    assert [] == misnamed_objects(store.root), "a final-named file is partial"
    temps, unreferenced = leftovers(store, proc.pid)
    assert (temps_left, objects_left) == (len(temps), len(unreferenced))
    assert_chain_dir_is_slots_only(store, head)
    with store.open_task(TASK, PLAN) as run:
        assert head == run.head.seq
        run.commit_step(run.next_step or "", "after the crash")
    assert head + 2 == store.verify(TASK).length


@pytest.mark.parametrize(
    ("point", "nth", "started"),
    [
        # The first object a new task writes is its plan, the second its start snapshot.
        ("object.temp_created", 1, False),
        ("object.mid_write", 1, False),
        ("object.published", 1, False),
        ("object.temp_created", 2, False),
        ("object.mid_write", 2, False),
        ("object.linked", 2, False),
        ("commit.before_link", 1, False),
        ("commit.linked", 1, True),
        ("commit.done", 1, True),
    ],
)
def test_a_kill_while_starting_a_task_leaves_it_absent_or_whole(
    store: castore.Store,
    children: list[subprocess.Popen[str]],
    point: str,
    nth: int,
    started: bool,
) -> None:
    """A kill while a task is created leaves it absent or whole; open_task then works."""
    _, acknowledged = crash_child(children, store, f"{point}:{nth}", 3)
    assert {} == acknowledged
    if started:
        assert 0 == store.verify(TASK).head.seq
    else:
        with pytest.raises(castore.TaskNotFoundError):
            store.verify(TASK)
    assert [] == misnamed_objects(store.root), "a final-named file is partial"
    with store.open_task(TASK, PLAN) as run:
        assert 0 == run.head.seq
        run.commit_step("s0", "after the crash")
    assert 2 == store.verify(TASK).length
