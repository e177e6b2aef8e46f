"""Group commit (castore/medium/groupflush.py): a lone caller flushes precisely, concurrent callers
share one syncfs per round, a failed round fails every member and nobody else."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path

import pytest

import castore
from castore.aio import AsyncStore
from castore.errors import DurabilityError
from castore.maintenance.fsck import Severity, check_store
from castore.medium import fsio, groupflush
from castore.medium.flushpolicy import FlushPolicy
from tests.helpers import wait_for

SHARED = FlushPolicy(True, "ext4", "test: shared")
PRECISE = FlushPolicy(False, "fuse.sshfs", "test: precise")


class FakeSyncfs:
    """Stands in for fsio.syncfs: records each call, and can be made to fail or to block."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: OSError | None = None

    def __call__(self, fd: int) -> None:
        self.calls.append("syncfs")
        if self.fail is not None:
            raise self.fail


@pytest.fixture
def syncfs(monkeypatch: pytest.MonkeyPatch) -> FakeSyncfs:
    fake = FakeSyncfs()
    monkeypatch.setattr(fsio, "syncfs", fake)
    return fake


@pytest.fixture
def shared_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every store of this test gets a shared-rounds policy, whatever filesystem it is on."""
    monkeypatch.setattr(groupflush, "_BY_DEVICE", {})
    monkeypatch.setattr(groupflush, "decide", lambda root: SHARED)


def test_a_lone_caller_flushes_its_own_file_and_no_syncfs(
    tmp_path: Path, syncfs: FakeSyncfs
) -> None:
    """Nothing running, nobody waiting: the precise fsync, with no wait and no syncfs."""
    flush = groupflush.GroupFlush(str(tmp_path), SHARED)
    flush.directory(str(tmp_path))
    assert (1, 0, []) == (flush.precise, flush.rounds, syncfs.calls)


def test_callers_arriving_during_a_flush_share_the_next_round(
    tmp_path: Path, syncfs: FakeSyncfs
) -> None:
    """Three callers arrive while a lone flush runs: one syncfs, after the running flush,
    covers all three; none returns before it."""
    flush = groupflush.GroupFlush(str(tmp_path), SHARED)
    release = threading.Event()
    order: list[str] = []

    def slow_precise() -> None:
        order.append("precise started")
        release.wait(10)
        order.append("precise done")

    first = threading.Thread(target=flush._flush, args=(slow_precise,))
    first.start()
    wait_for(lambda: order, what="the lone flush to start")
    returned: list[int] = []

    def member(n: int) -> None:
        flush._flush(lambda: order.append("a member flushed alone"))
        order.append(f"member {n} returned")
        returned.append(n)

    members = [threading.Thread(target=member, args=(n,)) for n in range(3)]
    for thread in members:
        thread.start()
    wait_for(lambda: flush._next is not None, what="the next round to gather")
    assert [] == returned
    release.set()
    for thread in [first, *members]:
        thread.join(10)
    assert ["syncfs"] == syncfs.calls
    assert (1, 1) == (flush.precise, flush.rounds)
    assert ["precise started", "precise done"] == order[:2]
    assert sorted(f"member {n} returned" for n in range(3)) == sorted(order[2:])


def test_a_failed_round_fails_every_member_and_the_next_round_is_fresh(
    tmp_path: Path, syncfs: FakeSyncfs
) -> None:
    """syncfs -> EIO: each member of that round gets a DurabilityError naming its directory;
    a later call succeeds (a new round, never the failed flush retried on the same file)."""
    flush = groupflush.GroupFlush(str(tmp_path), SHARED)
    syncfs.fail = OSError(errno.EIO, "Input/output error")
    release = threading.Event()
    blocker = threading.Thread(target=flush._flush, args=(lambda: release.wait(10),))
    blocker.start()
    wait_for(lambda: flush._running is not None, what="the lone flush to start")
    errors: list[BaseException] = []

    def member() -> None:
        try:
            flush.directory(str(tmp_path))
        except DurabilityError as exc:
            errors.append(exc)

    members = [threading.Thread(target=member) for _ in range(2)]
    for thread in members:
        thread.start()
    wait_for(lambda: flush._next is not None, what="the next round to gather")
    release.set()
    for thread in [blocker, *members]:
        thread.join(10)
    assert [errno.EIO, errno.EIO] == [e.errno for e in errors]
    assert all(str(tmp_path) in str(e) for e in errors)
    syncfs.fail = None
    flush.directory(str(tmp_path))  # alone again: precise, and it succeeds


def test_without_a_shared_policy_every_call_is_its_own_fsync(
    tmp_path: Path, syncfs: FakeSyncfs
) -> None:
    """On FUSE or a network filesystem (policy not shared) no syncfs is ever made."""
    flush = groupflush.GroupFlush(str(tmp_path), PRECISE)
    threads = [threading.Thread(target=flush.directory, args=(str(tmp_path),)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert (8, 0, []) == (flush.precise, flush.rounds, syncfs.calls)


def test_one_group_flush_per_filesystem_per_process(tmp_path: Path) -> None:
    """Two stores on one device share rounds; a different process gets its own."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = groupflush.for_store(str(tmp_path / "a"))
    assert first is groupflush.for_store(str(tmp_path / "b"))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new GroupFlush, not the parent's (whose rounds it cannot see)
        os.write(write, b"1" if groupflush.for_store(str(tmp_path / "a")) is not first else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert b"1" == os.read(read, 1)


def _committer(run: castore.Run, steps: int) -> None:
    for _ in range(steps):
        step = run.next_step
        assert step is not None
        run.commit_step(step, {"n": run.head.seq})


@pytest.mark.usefixtures("shared_everywhere")
def test_eight_threads_share_flushes_and_every_commit_is_in_its_chain(tmp_path: Path) -> None:
    """8 agents in threads, 30 commits each, real syncfs: fewer flushes than two per commit,
    every commit durable in its chain, fsck clean."""
    store = castore.Store.init(tmp_path / "s")
    steps = 30
    runs = [
        store.start(f"agent-{n}", castore.Plan.build("p", *(f"s{i}" for i in range(steps))))
        for n in range(8)
    ]
    flush = store.medium.flush
    before = flush.precise + flush.rounds
    threads = [threading.Thread(target=_committer, args=(run, steps)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    made = flush.precise + flush.rounds - before
    assert made < 2 * 8 * steps, (flush.precise, flush.rounds)
    assert flush.rounds > 0
    for n in range(8):
        assert list(range(steps + 1)) == sorted(s.seq for _, s in store.history(f"agent-{n}"))
    assert [] == [f.code for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]


@pytest.mark.usefixtures("shared_everywhere")
def test_asyncio_agents_share_rounds(tmp_path: Path) -> None:
    """8 coroutines of one AsyncStore commit at once: their flushes share rounds too."""
    castore.Store.init(tmp_path / "s")
    steps = 20

    async def main() -> tuple[int, int]:
        async with AsyncStore(tmp_path / "s") as astore:
            plan = castore.Plan.build("p", *(f"s{i}" for i in range(steps)))
            runs = [await astore.start(f"agent-{n}", plan) for n in range(8)]

            async def agent(run: castore.aio.AsyncRun) -> None:
                for i in range(steps):
                    await run.commit_step(f"s{i}", {"i": i})

            await asyncio.gather(*(agent(run) for run in runs))
            flush = (await astore.store()).medium.flush
            return flush.rounds, flush.precise

    rounds, precise = asyncio.run(main())
    assert rounds > 0
    assert rounds + precise < 2 * 8 * steps
