"""castore on real shared filesystems: two clients of one directory, on each engine in turn.

The engines (conftest's `two_mounts`): sshfs, whose flocks do not see each other, so the
commit point (link()) alone must keep every guarantee; GlusterFS replica 3 with its client
caches off and with Gluster's defaults (a client may read the other's new file as empty and
a renamed-over name stale for about a second); CephFS with two ceph-fuse clients. Round
counts are scaled to each engine's commit latency (TwoMounts.rounds) so that all four fit
the default run's budget.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
from helpers import wait_for
from test_concurrency import (  # the same workers, pointed at two different mounts
    CTX,
    DEADLINE,
    TASK,
    children,
    join_ok,
    paused_writer,
    plan_of,
    process_state,
    race_worker,
    spawn,
)
from test_gc import race_gc_against_writer
from twomounts import TwoMounts

import castore
import castore.maintenance.gc
from castore.cli import main
from castore.doctor import settings as doctor_settings
from castore.lab.campaign import Settings, campaign
from castore.lab.service import read_ledger

ROUNDS = int(os.environ.get("CASTORE_SSHFS_ROUNDS", "60"))  # on sshfs; scaled for the others
__all__ = ["children"]  # a fixture, imported for the tests below


def test_flock_through_one_client_blocks_the_other_only_where_locks_are_coherent(
    two_mounts: TwoMounts,
) -> None:
    """The premise of each engine: an exclusive flock held through mount A blocks one through
    mount B on GlusterFS and CephFS, and does not on sshfs."""
    _, mount_a, mount_b = two_mounts.new_dir("flock")
    (mount_a / "lock").write_bytes(b"")
    wait_for((mount_b / "lock").exists, DEADLINE, "the lock file on mount B")
    holder = os.open(mount_a / "lock", os.O_RDWR)
    other = os.open(mount_b / "lock", os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            blocked = True
        else:
            blocked = False
    finally:
        os.close(other)
        os.close(holder)
    assert two_mounts.locks_coherent == blocked


def test_commit_latency_through_each_client_is_near_what_round_counts_are_scaled_by(
    two_mounts: TwoMounts,
) -> None:
    """Thirty commits of a small result through each mount (the median is printed for the
    benchmarks page; not asserted: a shared test machine's load moves it tenfold), each task's
    chain whole when read through the other mount."""
    origin, mount_a, mount_b = two_mounts.new_dir("latency")
    castore.Store.init(origin / "store")
    medians = []
    for number, mount in enumerate((mount_a, mount_b)):
        store, timings = castore.Store.open(mount / "store"), []
        with store.start(f"latency/{number}", plan_of(30)) as run:
            for n in range(30):
                started = time.perf_counter()
                run.commit_step(f"s{n}", {"n": n})
                timings.append(time.perf_counter() - started)
        medians.append(statistics.median(timings) * 1000)
    print(f"\n{two_mounts.engine}: commit p50 {medians[0]:.1f} ms (A), {medians[1]:.1f} ms (B)")
    other = castore.Store.open(mount_b / "store"), castore.Store.open(mount_a / "store")
    assert [31, 31] == [other[n].verify(f"latency/{n}").length for n in (0, 1)]


def test_two_clients_race_and_exactly_one_wins_each_round(
    two_mounts: TwoMounts, tmp_path: Path, children: list[BaseProcess]
) -> None:
    """Each round a writer on each mount commits from the same HEAD: one wins, none lost;
    fsck through the second client finds the store clean."""
    rounds = two_mounts.rounds(ROUNDS)
    origin, mount_a, mount_b = two_mounts.new_dir("race")
    store = castore.Store.init(origin / "store")
    store.start(TASK, plan_of(rounds)).close()
    barrier = CTX.Barrier(2)
    outs = [tmp_path / f"worker{n}.json" for n in (0, 1)]
    roots = [str(mount_a / "store"), str(mount_b / "store")]
    workers = [
        spawn(children, race_worker, roots[n], rounds, barrier, n, str(outs[n])) for n in (0, 1)
    ]
    for worker in workers:
        join_ok(worker)
    logs = [json.loads(out.read_text()) for out in outs]
    outcomes = [sorted(entry[0] for entry in pair) for pair in zip(*logs, strict=True)]
    assert [["lost", "won"]] * rounds == outcomes
    history = store.history(TASK)  # read through the origin: what the servers hold
    assert list(range(rounds, -1, -1)) == [snapshot.seq for _, snapshot in history]
    parents = [snapshot.parent for _, snapshot in history]
    assert [object_id for object_id, _ in history[1:]] + [None] == parents
    won = {(entry[1], entry[4]) for log in logs for entry in log if entry[0] == "won"}
    assert {(snapshot.seq - 1, i) for i, snapshot in history[:-1]} == won
    assert 0 == main(["fsck", str(mount_b / "store")])


def test_a_stopped_writer_on_one_client_is_rejected_after_the_other_advanced(
    two_mounts: TwoMounts, tmp_path: Path, children: list[BaseProcess]
) -> None:
    """SIGSTOP a writer on mount A; a writer on mount B advances (past A's flock where locks
    are coherent, since A holds it); SIGCONT: A conflicts."""
    origin, mount_a, mount_b = two_mounts.new_dir("paused")
    store = castore.Store.init(origin / "store")
    with store.start(TASK, plan_of(3)) as run:
        parent_id = run.head_id
    ready, go, out = CTX.Event(), tmp_path / "go", tmp_path / "paused.json"
    writer = spawn(children, paused_writer, str(mount_a / "store"), ready, str(go), str(out))
    assert ready.wait(DEADLINE)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGSTOP)
    wait_for(lambda: process_state(writer.pid or 0) == "T", what="the writer to stop")
    go.touch()
    other_store = castore.Store.open(mount_b / "store")
    if two_mounts.locks_coherent:  # the paused writer's flock through mount A is seen
        with pytest.raises(castore.TaskBusyError):
            other_store.resume(TASK, plan_of(3), lock_timeout=0.5)
    lock_timeout = None if two_mounts.locks_coherent else 1.0
    with other_store.resume(TASK, plan_of(3), lock_timeout=lock_timeout) as other:
        winner = other.commit_step("s0", "from client B")
    os.kill(writer.pid, signal.SIGCONT)
    join_ok(writer)
    assert ["conflict", parent_id, winner, 1, "still-stale"] == json.loads(out.read_text())
    assert 2 == store.verify(TASK).length


def test_crash_campaign_alternating_between_clients_keeps_every_invariant(
    two_mounts: TwoMounts, tmp_path: Path
) -> None:
    """Workers killed at random and at named points, each restart on the other mount; fsck
    through the second client finds the store clean."""
    origin, mount_a, mount_b = two_mounts.new_dir("campaign")
    castore.Store.init(origin / "store")
    tally = campaign(
        tmp_path,
        runs=2 if two_mounts.commit_ms > 10 else 3,
        settings=Settings("lookup", seed=7),
        store_paths=[mount_a / "store", mount_b / "store"],
    )
    assert (0, 0, 0, 0) == (tally.duplicates, tally.lost, tally.corrupt, tally.mismatched), (
        tally.problems
    )
    assert tally.kills > 0
    counts: dict[str, int] = {}
    for entry in read_ledger(tmp_path / "ledger-lookup.jsonl"):
        counts[entry["key"]] = counts.get(entry["key"], 0) + 1
    assert {1} == set(counts.values())
    assert 0 == main(["fsck", str(origin / "store")])
    assert 0 == main(["fsck", str(mount_b / "store")])


def test_gc_on_one_client_racing_a_writer_on_the_other_never_removes_what_it_commits(
    two_mounts: TwoMounts,
) -> None:
    """A writer on mount B puts blobs (half of them already stored, unreachable and 30 days
    old: the dedup path) and commits a step naming each, while gc loops on mount A with a
    short grace period: the chain verifies and every blob it names is readable."""
    steps = two_mounts.rounds(40, floor=12)  # gc and writer contend for the same caps on CephFS
    origin, mount_a, mount_b = two_mounts.new_dir("gc")
    store = castore.Store.init(origin / "store")
    removed = race_gc_against_writer(
        store,
        writer_root=str(mount_b / "store"),
        gc_root=str(mount_a / "store"),
        steps=steps,
        garbage=20,
        grace_s=3.0,  # longer than a put-to-commit pause plus a stale client's second
        timeout=DEADLINE * 2,
    )
    assert len(removed) >= 20  # gc did run against the writer


def test_doctor_across_the_two_clients_says_safe(
    two_mounts: TwoMounts, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`castore doctor PATH --peer PATH2 --json` on the two mounts: safe, flock reported as
    coherent exactly where it is, and commits flushed file by file (FUSE). Ten rounds of each
    race, not the CLI's fifty (half a minute on CephFS): the verdicts are what is checked
    here, and the two clients race commits in test_two_clients_race_and_exactly_one_wins_each_round
    (60 rounds on sshfs, scaled to each engine's commit latency)."""
    if two_mounts.engine == "gluster-default":
        pytest.skip("doctor on default-cache Gluster: ten runs in a row, in a test of its own")
    monkeypatch.setattr(doctor_settings, "RACE_ROUNDS", 10)
    _, mount_a, mount_b = two_mounts.new_dir("doctor")
    assert 0 == main(["doctor", str(mount_a), "--peer", str(mount_b), "--json"])
    report = json.loads(capsys.readouterr().out)
    verdicts = {check["name"]: check["verdict"] for check in report["checks"]}
    flock = "ok" if two_mounts.locks_coherent else "warn"
    assert (True, flock) == (report["safe"], verdicts["flock-coherent"])
    assert "ok" == verdicts["link-exclusive"]
    assert verdicts["link-race"] in {"ok", "warn"}  # warn: losers see EPERM, not EEXIST
    flush_path = next(check for check in report["checks"] if check["name"] == "flush-path")
    assert "ok" == flush_path["verdict"]  # every engine here is FUSE: no shared syncfs
    assert "castore flushes file by file here" in flush_path["detail"]


def test_watch_polling_on_one_client_sees_an_effect_left_unresolved_on_the_other(
    two_mounts: TwoMounts,
) -> None:
    """`castore watch --poll --json` through mount B alerts when a writer on mount A leaves
    an effect UNRESOLVED (inotify would never see the other client's change)."""
    from test_watch import make_unresolved  # noqa: PLC0415 - the same worker processes

    origin, mount_a, mount_b = two_mounts.new_dir("watch")
    castore.Store.init(origin / "store")
    command = [
        sys.executable,
        "-m",
        "castore",
        "watch",
        str(mount_b / "store"),
        "--json",
        "--poll",
        "0.3",
        "--rescan",
        "3600",
        "--stuck-after",
        "1h",
    ]
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in watcher.stdout or ()], daemon=True
    ).start()
    try:
        make_unresolved(castore.Store.open(mount_a / "store"), "order-9")
        alert = json.loads(lines.get(timeout=DEADLINE))
        assert ("unresolved", "raised", "order-9", "charge") == (
            alert["kind"],
            alert["status"],
            alert["task"],
            alert["step"],
        )
    finally:
        watcher.send_signal(signal.SIGTERM)
        assert 0 == watcher.wait(timeout=DEADLINE)
