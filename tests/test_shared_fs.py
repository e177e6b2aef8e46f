"""castore on a real network filesystem: two sshfs clients of one export, whose flocks do not
see each other. The commit point (link()) alone must keep every guarantee."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
from helpers import wait_for
from sshfs import SshfsPair
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

import castore
from castore.cli import main
from castore.doctor import run_doctor
from castore.lab.campaign import Settings, campaign
from castore.lab.service import read_ledger

pytestmark = pytest.mark.sshfs
ROUNDS = int(os.environ.get("CASTORE_SSHFS_ROUNDS", "60"))
__all__ = ["children"]  # a fixture, imported for the tests below


def test_flock_is_not_coherent_across_the_two_clients(sshfs_pair: SshfsPair) -> None:
    """The premise: a lock taken through one client is not seen through the other."""
    _, mount_a, mount_b = sshfs_pair.new_dir("flock")
    report = run_doctor(mount_a, mount_b)
    assert ("warn", True) == (report.check("flock-coherent").verdict, report.safe)


def test_two_clients_race_and_exactly_one_wins_each_round(
    sshfs_pair: SshfsPair, tmp_path: Path, children: list[BaseProcess]
) -> None:
    """Each round a writer on each mount commits from the same HEAD: one wins, none lost."""
    export, mount_a, mount_b = sshfs_pair.new_dir("race")
    store = castore.Store.init(export / "store")
    store.start(TASK, plan_of(ROUNDS)).close()
    barrier = CTX.Barrier(2)
    outs = [tmp_path / f"worker{n}.json" for n in (0, 1)]
    roots = [str(mount_a / "store"), str(mount_b / "store")]
    workers = [
        spawn(children, race_worker, roots[n], ROUNDS, barrier, n, str(outs[n])) for n in (0, 1)
    ]
    for worker in workers:
        join_ok(worker)
    logs = [json.loads(out.read_text()) for out in outs]
    outcomes = [sorted(entry[0] for entry in pair) for pair in zip(*logs, strict=True)]
    assert [["lost", "won"]] * ROUNDS == outcomes
    history = store.history(TASK)  # read through the export: what the server holds
    assert list(range(ROUNDS, -1, -1)) == [snapshot.seq for _, snapshot in history]
    parents = [snapshot.parent for _, snapshot in history]
    assert [object_id for object_id, _ in history[1:]] + [None] == parents
    won = {(entry[1], entry[4]) for log in logs for entry in log if entry[0] == "won"}
    assert {(snapshot.seq - 1, i) for i, snapshot in history[:-1]} == won


def test_a_stopped_writer_on_one_client_is_rejected_after_the_other_advanced(
    sshfs_pair: SshfsPair, tmp_path: Path, children: list[BaseProcess]
) -> None:
    """SIGSTOP a writer on mount A; a writer on mount B advances; SIGCONT: A conflicts."""
    export, mount_a, mount_b = sshfs_pair.new_dir("paused")
    store = castore.Store.init(export / "store")
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
    # The paused writer holds the task's flock through mount A; mount B does not see it.
    with other_store.resume(TASK, plan_of(3), lock_timeout=1.0) as other:
        winner = other.commit_step("s0", "from client B")
    os.kill(writer.pid, signal.SIGCONT)
    join_ok(writer)
    assert ["conflict", parent_id, winner, 1, "still-stale"] == json.loads(out.read_text())
    assert 2 == store.verify(TASK).length


def test_crash_campaign_alternating_between_clients_keeps_every_invariant(
    sshfs_pair: SshfsPair, tmp_path: Path
) -> None:
    """Workers killed at random and at named points, each restart on the other mount."""
    export, mount_a, mount_b = sshfs_pair.new_dir("campaign")
    castore.Store.init(export / "store")
    tally = campaign(
        tmp_path,
        runs=3,
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
    assert 0 == main(["fsck", str(export / "store")])


def test_doctor_across_the_two_clients_says_safe(
    sshfs_pair: SshfsPair, capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore doctor PATH --peer PATH2 --json` on the two mounts: safe, flock reported."""
    _, mount_a, mount_b = sshfs_pair.new_dir("doctor")
    assert 0 == main(["doctor", str(mount_a), "--peer", str(mount_b), "--json"])
    report = json.loads(capsys.readouterr().out)
    verdicts = {check["name"]: check["verdict"] for check in report["checks"]}
    assert (True, "warn") == (report["safe"], verdicts["flock-coherent"])
    assert "ok" == verdicts["link-exclusive"]
    assert verdicts["link-race"] in {"ok", "warn"}  # warn: losers see EPERM, not EEXIST


def test_watch_polling_on_one_client_sees_an_effect_left_unresolved_on_the_other(
    sshfs_pair: SshfsPair,
) -> None:
    """`castore watch --poll --json` through mount B alerts when a writer on mount A leaves
    an effect UNRESOLVED (inotify would never see the other client's change)."""
    from test_watch import make_unresolved  # noqa: PLC0415 - the same worker processes

    export, mount_a, mount_b = sshfs_pair.new_dir("watch")
    castore.Store.init(export / "store")
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
