"""Real processes racing on one task: exactly one successor per snapshot, nothing lost."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

import castore
from castore.chain.seal import SEAL_EVERY
from castore.format.records import TransitionKind

CTX = multiprocessing.get_context("fork")
TASK = "race/1"
ROUNDS = int(os.environ.get("CASTORE_RACE_ROUNDS", "400"))
DEADLINE = 60.0


def plan_of(steps: int) -> castore.Plan:
    return castore.Plan.build("race", *[f"s{i}" for i in range(steps)])


@pytest.fixture
def children() -> Iterator[list[BaseProcess]]:
    """Processes a test starts; any still alive at the end are killed (by their own pid)."""
    started: list[BaseProcess] = []
    yield started
    for child in started:
        if child.is_alive() and child.pid is not None:
            os.kill(child.pid, signal.SIGKILL)  # works on a stopped process too
        child.join(DEADLINE)


def spawn(children: list[BaseProcess], target: Any, *args: Any) -> BaseProcess:
    child = CTX.Process(target=target, args=args, daemon=True)
    child.start()
    children.append(child)
    return child


def join_ok(child: BaseProcess, deadline: float = DEADLINE) -> None:
    child.join(deadline)
    assert (False, 0) == (child.is_alive(), child.exitcode)


# -- two writers racing from the same parent, round after round ---------------------------------


def race_worker(root: str, rounds: int, barrier: Any, worker: int, out: str) -> None:
    """Each round: wait for the other worker, then try to commit the same next step."""
    store = castore.Store.open(root)
    plan = plan_of(rounds)
    log: list[list[Any]] = []
    try:
        run = store.resume(TASK, plan, lock_timeout=None)
        for number in range(rounds):
            barrier.wait(DEADLINE)
            start_seq = run.head.seq
            try:
                snapshot_id = run.commit_step(run.next_step or "", {"w": worker, "r": number})
            except castore.ConflictError as exc:
                log.append(["lost", number, start_seq, exc.seq, exc.expected, exc.actual])
                run.close()
                run = store.resume(TASK, plan, lock_timeout=None)
            else:
                log.append(["won", number, start_seq, run.head.seq, snapshot_id])
        run.close()
    finally:
        Path(out).write_text(json.dumps(log))


# 5,000 rounds take about six minutes here: past the suite's 300 s per test.
LONG_RACE = pytest.param(5000, marks=[pytest.mark.slow, pytest.mark.timeout(1200)])


@pytest.mark.parametrize("rounds", [ROUNDS, LONG_RACE])
def test_two_writers_race_and_exactly_one_wins_each_round(
    store: castore.Store, tmp_path: Path, children: list[BaseProcess], rounds: int
) -> None:
    """Two processes commit from the same HEAD each round: one wins, one conflicts, none lost."""
    plan = plan_of(rounds)
    store.start(TASK, plan).close()
    barrier = CTX.Barrier(2)
    outs = [tmp_path / f"worker{n}.json" for n in (0, 1)]
    workers = [
        spawn(children, race_worker, store.root, rounds, barrier, n, str(outs[n])) for n in (0, 1)
    ]
    # Each round's loser resumes, verifying the tail above the sealed mark (up to 4,096
    # slots), so a round costs more as the chain grows: in a full run, 1,000 rounds took
    # 61-91 s of a worker, 400 (the default) 14 s; 5,000 (the slow set) several minutes.
    for worker in workers:
        join_ok(worker, max(DEADLINE, rounds * 0.2))
    logs = [json.loads(out.read_text()) for out in outs]
    assert [rounds, rounds] == [len(log) for log in logs]
    winners: dict[int, tuple[int, str]] = {}
    for number in range(rounds):
        entries = [logs[0][number], logs[1][number]]
        assert [number, number] == [entry[1] for entry in entries]
        assert [number, number] == [entry[2] for entry in entries], "not from the same HEAD"
        assert ["lost", "won"] == sorted(entry[0] for entry in entries), f"round {number}"
        worker = 0 if entries[0][0] == "won" else 1
        won, lost = entries[worker], entries[1 - worker]
        assert (number + 1, number + 1) == (won[3], lost[3])
        assert won[4] == lost[5], "the loser was told who won"
        winners[number + 1] = (worker, won[4])
    chain = store.verify(TASK)
    history = store.history(TASK)
    # Past SEAL_EVERY commits the runs sealed as they went, and the run that finished the task
    # sealed it whole with one SEAL commit after the last step (FORMAT.md 9.5).
    sealed = rounds >= SEAL_EVERY
    assert sealed == (history[0][1].transition.kind is TransitionKind.SEAL)
    history = history[1:] if sealed else history
    assert rounds + 1 + sealed == chain.length
    assert list(range(rounds, -1, -1)) == [snapshot.seq for _, snapshot in history]
    parents = [snapshot.parent for _, snapshot in history]
    assert [object_id for object_id, _ in history[1:]] + [None] == parents, "not linear"
    by_seq = {snapshot.seq: (object_id, snapshot) for object_id, snapshot in history}
    for seq, (worker, snapshot_id) in winners.items():
        object_id, snapshot = by_seq[seq]
        assert (snapshot_id, {"w": worker, "r": seq - 1}) == (object_id, snapshot.transition.result)
    # Every slot from the lowest kept (0, or above the pruned ones) to HEAD, nothing more.
    slots = sorted(int(name) for name in os.listdir(store.layout.chain_dir(TASK)))
    assert list(range(slots[0], chain.length)) == slots
    assert (slots[0] > 0) == sealed


# -- a writer paused past everything, then woken ------------------------------------------------


def paused_writer(root: str, ready: Any, go: str, out: str) -> None:
    """Resume, say so, wait for the go file, then try to commit on the HEAD it resumed."""
    store = castore.Store.open(root)
    run = store.resume(TASK, plan_of(3))  # with the local lock: it does not protect the commit
    ready.set()
    wait_for(Path(go).exists, DEADLINE, "the go file")
    try:
        snapshot_id = run.commit_step(run.next_step or "", "from the paused writer")
    except castore.ConflictError as exc:
        result = ["conflict", exc.expected, exc.actual, exc.seq]
    else:
        result = ["won", snapshot_id]
    try:
        run.commit_step(run.next_step or "", "again")
    except castore.ConflictError:
        result.append("still-stale")
    Path(out).write_text(json.dumps(result))
    run.close()


def process_state(pid: int) -> str:
    """The one-letter scheduler state of `pid` (T: stopped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0]


def test_a_writer_stopped_while_another_advances_is_rejected(
    store: castore.Store, tmp_path: Path, children: list[BaseProcess]
) -> None:
    """SIGSTOP a writer after it resumed; another advances; SIGCONT: its commit conflicts."""
    plan = plan_of(3)
    with store.start(TASK, plan) as run:
        parent_id = run.head_id
    # A file, not an Event: Event.set() waits for every sleeper to wake, and this one is stopped.
    ready, go = CTX.Event(), tmp_path / "go"
    out = tmp_path / "paused.json"
    writer = spawn(children, paused_writer, store.root, ready, str(go), str(out))
    assert ready.wait(DEADLINE)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGSTOP)
    wait_for(lambda: process_state(writer.pid or 0) == "T", what="the writer to stop")
    go.touch()  # it cannot act on this until it is continued
    with store.resume(TASK, plan, lock_timeout=None) as other:  # its lock is not seen
        winner = other.commit_step("s0", "from the other writer")
        other.commit_step("s1", "and another")
    os.kill(writer.pid, signal.SIGCONT)
    join_ok(writer)
    assert ["conflict", parent_id, winner, 1, "still-stale"] == json.loads(out.read_text())
    history = store.history(TASK)
    assert [2, 1, 0] == [snapshot.seq for _, snapshot in history]
    assert ["and another", "from the other writer", None] == [
        snapshot.transition.result for _, snapshot in history
    ]
    assert 3 == store.verify(TASK).length


# -- a reader polling while a writer commits ------------------------------------------------------


def steady_writer(root: str, commits: int, go: Any) -> None:
    store = castore.Store.open(root)
    with store.resume(TASK, plan_of(commits)) as run:
        go.wait(DEADLINE)
        for number in range(commits):
            run.commit_step(f"s{number}", {"n": number})


def test_a_reader_polling_during_commits_always_sees_a_verifying_chain(
    store: castore.Store, children: list[BaseProcess]
) -> None:
    """verify and resume in a loop during 300 commits by another process never fail."""
    commits = 300
    plan = plan_of(commits)
    store.start(TASK, plan).close()
    go = CTX.Event()
    writer = spawn(children, steady_writer, store.root, commits, go)
    seen: list[int] = []
    deadline = time.monotonic() + DEADLINE
    go.set()
    while writer.is_alive() and time.monotonic() < deadline:
        chain = store.verify(TASK)
        seen.append(chain.length)
        assert chain.head.seq + 1 == chain.length
        assert chain.length == len(chain.outcomes) + 1
        if len(seen) % 4 == 0:
            with store.resume(TASK, plan, lock_timeout=None) as run:
                seen.append(run.head.seq + 1)
                done = [run.result(f"s{n}") for n in range(run.head.seq)]
                assert [{"n": n} for n in range(run.head.seq)] == done
    join_ok(writer)
    assert commits + 1 == store.verify(TASK).length
    assert sorted(seen) == seen, "HEAD went backwards"
    assert len(set(seen)) >= 3, f"the reader did not overlap the writer: {sorted(set(seen))}"
