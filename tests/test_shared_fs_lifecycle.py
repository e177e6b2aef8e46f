"""Store creation, the gc handshake and quarantine on a real network filesystem: two sshfs
clients of one export (no coherent locks, link() the only exclusive create)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from sshfs import SshfsPair
from test_gc_handshake import (
    GC,
    WRITER,
    assert_acknowledged_commit_whole,
    finish,
    spawn,
    wait_stopped,
)
from test_quarantine_safety import VALUE, damaged_blob, store_again_intact
from test_store_creation import CTX, DEADLINE, ROUNDS, _create_in_rounds, errors_of

import castore
from castore.maintenance.fsck.quarantine import quarantine

pytestmark = pytest.mark.sshfs


def test_processes_on_two_clients_creating_one_store_all_succeed(sshfs_pair: SshfsPair) -> None:
    """Two processes on each client call Store.open(create=True) on one new path at once,
    round after round: every call succeeds, every store is whole."""
    export, mount_a, mount_b = sshfs_pair.new_dir("create")
    barrier = CTX.Barrier(4)
    results = CTX.Queue()
    procs = [
        CTX.Process(target=_create_in_rounds, args=(str(base), barrier, results))
        for base in (mount_a, mount_a, mount_b, mount_b)
    ]
    for proc in procs:
        proc.start()
    try:
        failures = [results.get(timeout=DEADLINE * 4) for _ in procs]
    finally:
        for proc in procs:
            proc.join(DEADLINE)
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
    assert [[]] * 4 == failures
    for number in range(ROUNDS):
        assert [] == errors_of(export / f"s{number}" / "store")


@pytest.mark.parametrize("gc_pause", ["gc.slots_read", "gc.reread"])
def test_gc_on_one_client_and_a_writer_on_the_other_keep_the_acknowledged_commit(
    sshfs_pair: SshfsPair, children: list[subprocess.Popen[str]], gc_pause: str
) -> None:
    """The writer (mount A) stops before its link, gc without grace (mount B) stops after its
    first or its second read of the slots; both go on: the acknowledged commit is whole."""
    export, mount_a, mount_b = sshfs_pair.new_dir("handshake")
    castore.Store.init(export / "store")
    writer = spawn(
        children, WRITER, str(mount_a / "store"), "t/1", "disk", pause="commit.before_link:2"
    )
    wait_stopped(writer)
    gc = spawn(children, GC, str(mount_b / "store"), pause=gc_pause)
    wait_stopped(gc)
    out = finish(writer)
    finish(gc)
    assert_acknowledged_commit_whole(castore.Store.open(export / "store"), "t/1", out)


def test_quarantine_through_a_client_spares_an_object_stored_again(
    sshfs_pair: SshfsPair,
) -> None:
    """Through an sshfs mount: a damaged blob stored again intact after fsck looked stays."""
    export, mount_a, _ = sshfs_pair.new_dir("quarantine")
    store = castore.Store.init(mount_a / "store")
    blob, path, findings = damaged_blob(store)
    store_again_intact(store, path)
    _, moved, _ = quarantine(store.root, findings)
    assert [] == moved
    assert VALUE == castore.Store.open(export / "store").get_blob(blob)
    assert Path(export / "store" / "objects" / blob[:2] / blob).exists()
