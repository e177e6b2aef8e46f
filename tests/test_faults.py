"""Faults from the disk: fsync → EIO, write → ENOSPC, close → EIO, link failing.

STORAGE.md property 4: never retry a failed fsync; remove the temp file, publish nothing,
raise an error that names the path; the next call after the fault clears succeeds.

Three layers: faults injected in-process into the `os` that castore.medium.fsio calls (exact,
every call site), a real ENOSPC on a tiny tmpfs, and a real fsync EIO injected by strace
into a child process.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import make_every_fanout, misnamed_objects, tree_snapshot

import castore
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import is_object_name, parse_slot_name, parse_temp_name
from castore.maintenance.fsck import Severity, check_store
from castore.medium import fsio, fsread

PLAN = castore.Plan.build("faults", *[f"s{i}" for i in range(8)])
TASK = "fault/1"

# -- an `os` for castore.medium.fsio that fails one chosen call -------------------------------


def kind_of(path: str) -> str:
    """What a path is in a store: temp, object, slot, fanout-dir, chain-dir or dir."""
    name = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))
    if parse_temp_name(name):
        return "temp"
    if is_object_name(name):
        return "object"
    if parse_slot_name(name) is not None and parent == "chain":
        return "slot"
    if name == "chain":
        return "chain-dir"
    if parent == "objects" and re.fullmatch(r"[0-9a-f]{2}", name):
        return "fanout-dir"
    return "dir"


@attrs.frozen
class Fault:
    """Fail the `nth` call of `op` on a path of `kind` with `err`, once."""

    op: str  # write | fsync | close | link
    kind: str
    err: int = errno.EIO
    nth: int = 1


@attrs.frozen
class Call:
    op: str
    path: str
    failed: bool = False

    @property
    def kind(self) -> str:
        return kind_of(self.path)


class FaultyOS:
    """Stands in for the `os` module inside castore.medium.fsio: records every write, fsync, close,
    link and unlink by the path it concerns, and fails the one call its Fault names."""

    def __init__(self, fault: Fault | None = None) -> None:
        self.fault = fault
        self.calls: list[Call] = []
        self.extra: list[Fault] = []  # further faults, for double failures
        self._fds: dict[int, str] = {}
        self._matched: dict[Fault, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def arm(self, fault: Fault | None, *extra: Fault) -> None:
        self.fault, self.extra, self._matched = fault, list(extra), {}
        self.calls.clear()

    @property
    def fired(self) -> Call | None:
        return next((call for call in self.calls if call.failed), None)

    def after_fault(self) -> list[Call]:
        """The calls made after the failed one."""
        fired = self.fired
        assert fired is not None
        return self.calls[self.calls.index(fired) + 1 :]

    def _record(self, op: str, path: str) -> None:
        for fault in [self.fault, *self.extra]:
            if fault is not None and fault.op == op and fault.kind == kind_of(path):
                self._matched[fault] = self._matched.get(fault, 0) + 1
                if self._matched[fault] == fault.nth:
                    self.calls.append(Call(op, path, failed=True))
                    raise OSError(fault.err, os.strerror(fault.err))
        self.calls.append(Call(op, path))

    def open(self, path: str, flags: int, mode: int = 0o777, **kw: Any) -> int:
        fd = os.open(path, flags, mode, **kw)
        self._fds[fd] = os.fspath(path)
        return fd

    def write(self, fd: int, data: Any) -> int:
        self._record("write", self._fds.get(fd, f"<fd {fd}>"))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self._record("fsync", self._fds.get(fd, f"<fd {fd}>"))
        os.fsync(fd)

    def close(self, fd: int) -> None:
        path = self._fds.pop(fd, f"<fd {fd}>")
        os.close(fd)  # Linux frees the descriptor even when close reports an error
        self._record("close", path)

    def link(self, src: str, dst: str, **kw: Any) -> None:
        self._record("link", os.fspath(dst))
        os.link(src, dst, **kw)

    def unlink(self, path: str) -> None:
        self.calls.append(Call("unlink", os.fspath(path)))
        os.unlink(path)

    def fsyncs_per_temp(self) -> dict[str, int]:
        """Each temp file castore created (by its writes, fsyncs or closes) -> its fsync count."""
        counts: dict[str, int] = {}
        for call in self.calls:
            if call.kind == "temp" and call.op != "unlink":
                counts.setdefault(call.path, 0)
                counts[call.path] += call.op == "fsync"
        return counts


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> FaultyOS:
    """The `os` of the POSIX medium's file I/O (castore.medium.fsio, which writes, and
    fsread, which reads), recording calls; arm a Fault with `faulty.arm(...)`."""
    fake = FaultyOS()
    monkeypatch.setattr(fsio, "os", fake)
    monkeypatch.setattr(fsread, "os", fake)
    return fake


# -- checks shared by the tests -------------------------------------------------------------------


def files(root: str) -> dict[str, Any]:
    """Every non-directory entry of a tree (directories change mtime on any create)."""
    return {p: e for p, e in tree_snapshot(root).items() if not stat.S_ISDIR(e[0])}


def temp_files(root: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, n), root)
        for d, _, names in os.walk(root)
        for n in names
        if n.startswith(".tmp-")
    )


def fsck_errors(root: str) -> list[tuple[str, str, str]]:
    return [
        (f.code, f.path, f.message)
        for f in check_store(root, jobs=1)
        if f.severity == Severity.ERROR
    ]


def expected_path(fault: Fault, fired: Call, store: castore.Store, seq: int, task: str) -> str:
    """The path the error must name: the failed file or directory; the slot for a commit."""
    if fault.kind in ("slot", "chain-dir"):
        return store.layout.slot_path(task, seq)
    return fired.path


def check_clean_failure(
    faulty: FaultyOS,
    exc: castore.DurabilityError,
    fault: Fault,
    path: str,
) -> None:
    """The error is an OSError with the fault's errno naming `path`, and after the failed call
    castore neither retried an fsync, nor linked anything, nor fsynced a temp file twice."""
    fired = faulty.fired
    assert fired is not None, "the armed fault was never reached"
    assert isinstance(exc, OSError)
    assert fault.err == exc.errno
    assert path == exc.path
    assert path in str(exc)
    assert [] == [c for c in faulty.after_fault() if c.op in ("fsync", "link", "write")]
    counts = faulty.fsyncs_per_temp()
    if fired.kind == "temp":
        assert (0 if fault.op == "write" else 1) == counts.pop(fired.path)
    assert dict.fromkeys(counts, 1) == counts


def new_files(before: dict[str, Any], after: dict[str, Any]) -> dict[str, str]:
    """relpath -> kind of each file added; an existing file that changed counts as added."""
    return {p: kind_of(p) for p, e in after.items() if before.get(p) != e}


def linked_objects(faulty: FaultyOS, root: str) -> set[str]:
    """Objects whose publishing link() succeeded before the fault (complete, fsynced bytes)."""
    fired = faulty.fired
    done = faulty.calls[: faulty.calls.index(fired)] if fired else faulty.calls
    return {os.path.relpath(c.path, root) for c in done if c.op == "link" and c.kind == "object"}


def check_objects_complete(root: str, relpaths: set[str]) -> None:
    for rel in relpaths:
        data = Path(root, rel).read_bytes()
        assert os.path.basename(rel) == hash_bytes(data)


# -- in-process faults: commit_step ---------------------------------------------------------------

# (fault, stale afterwards). Faults before the object's link leave the tree as it was; a fault
# after it leaves that complete (fsynced, verified) but unreachable object: nothing names it,
# and it cannot be unlinked safely because another writer may have deduplicated onto it.
COMMIT_FAULTS = [
    pytest.param(Fault("write", "temp", errno.ENOSPC), False, id="write-temp-ENOSPC"),
    pytest.param(Fault("fsync", "temp", errno.EIO), False, id="fsync-temp-EIO"),
    pytest.param(Fault("fsync", "temp", errno.ENOSPC), False, id="fsync-temp-ENOSPC"),
    pytest.param(Fault("close", "temp", errno.EIO), False, id="close-temp-EIO"),
    pytest.param(Fault("link", "object", errno.ENOSPC), False, id="link-object-ENOSPC"),
    pytest.param(Fault("link", "slot", errno.EIO), False, id="link-slot-EIO"),
    pytest.param(Fault("fsync", "chain-dir", errno.EIO), True, id="fsync-chain-EIO"),
]


def test_a_v2_commit_syncs_its_temp_file_and_chain_directory_only(
    store: castore.Store, faulty: FaultyOS
) -> None:
    """The fan-out directory of a snapshot is not synced (its slot is its durable name):
    a fault there cannot fail a commit, because the commit never makes that call."""
    make_every_fanout(store.root)
    run = store.start(TASK, PLAN)
    run.commit_step("s0", {"n": 0})
    faulty.calls.clear()
    run.commit_step("s1", {"n": 1})
    synced = [kind_of(call.path) for call in faulty.calls if call.op == "fsync"]
    assert ["temp", "chain-dir"] == synced


@pytest.mark.parametrize("made", [True, False], ids=["raced", "not-made"])
def test_a_fanout_mkdir_that_fails_with_another_error_than_eexist(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch, made: bool
) -> None:
    """sshfs answers EPERM, not EEXIST, to the loser of a mkdir race: the directory the other
    client made is used (and objects/ synced); the same error with no directory there is a
    DurabilityError naming the directory, and nothing is stored."""
    real_mkdir = os.mkdir

    def mkdir(path: str, *args: Any, **kwargs: Any) -> None:
        if made:
            real_mkdir(path, *args, **kwargs)  # the other client won
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)

    monkeypatch.setattr(fsio.os, "mkdir", mkdir)
    value = {"raced": made}
    fanout = os.path.join(store.root, "objects", _blob_id(value)[:2])
    if made:
        assert value == store.get_blob(store.put_blob(value))
        return
    with pytest.raises(castore.DurabilityError, match="creating a directory") as caught:
        store.put_blob(value)
    assert fanout == caught.value.path
    assert not os.path.exists(fanout)


def _blob_id(value: object) -> str:
    return hash_bytes(codec.frame("blob", codec.encode_value(value)))


def test_the_first_object_of_a_fanout_directory_makes_it_durable_first(
    store: castore.Store, faulty: FaultyOS
) -> None:
    """A new store has no fan-out directory: the first put of an id makes its directory and
    syncs objects/ before the object's own flushes; another id of that directory syncs only
    its own. objects/'s fsync failing: DurabilityError, nothing named; the next put stores it."""
    objects = os.path.join(store.root, "objects")
    blob = store.put_blob({"n": 0}).blob
    fanout = os.path.dirname(store.objects.path(blob))
    synced = [call.path for call in faulty.calls if call.op == "fsync"]
    assert [objects, "temp", fanout] == [synced[0], kind_of(synced[1]), synced[2]]
    assert 3 == len(synced)
    sibling = next(v for n in range(1, 5000) if _blob_id(v := {"n": n})[:2] == blob[:2])
    faulty.calls.clear()
    assert _blob_id(sibling) == store.put_blob(sibling).blob
    synced = [call.path for call in faulty.calls if call.op == "fsync"]
    assert ["temp", fanout] == [kind_of(synced[0]), synced[1]]
    # A value whose fan-out directory does not exist yet, and objects/ fails to sync.
    taken = set(os.listdir(objects))
    fresh = next(v for n in range(5000, 10000) if _blob_id(v := {"n": n})[:2] not in taken)
    faulty.arm(Fault("fsync", "dir", errno.EIO))
    with pytest.raises(castore.DurabilityError):
        store.put_blob(fresh)
    assert not os.path.exists(store.objects.path(_blob_id(fresh)))
    assert [] == [call for call in faulty.after_fault() if call.op in ("write", "link")]
    faulty.arm(None)
    assert fresh == store.get_blob(store.put_blob(fresh))


@pytest.mark.parametrize(("fault", "stale"), COMMIT_FAULTS)
def test_commit_step_fault(
    store: castore.Store, faulty: FaultyOS, fault: Fault, stale: bool
) -> None:
    """A failed commit_step raises a clean, path-naming error, publishes nothing, and the run
    commits next (or, after the commit point, is stale and a resume continues)."""
    run = store.start(TASK, PLAN)
    run.commit_step("s0", {"n": 0})
    before = files(store.root)
    faulty.arm(fault)

    expected_error = castore.CommitUncertainError if stale else castore.DurabilityError
    with pytest.raises(expected_error) as caught:
        run.commit_step("s1", {"n": 1})

    fired = faulty.fired
    assert fired is not None
    check_clean_failure(faulty, caught.value, fault, expected_path(fault, fired, store, 2, TASK))
    assert [] == temp_files(store.root)
    added = new_files(before, files(store.root))
    objects = linked_objects(faulty, store.root)
    slot = os.path.relpath(store.layout.slot_path(TASK, 2), store.root)
    assert {**dict.fromkeys(objects, "object"), **({slot: "slot"} if stale else {})} == added
    check_objects_complete(store.root, objects)
    assert stale == run.stale
    assert [] == fsck_errors(store.root)

    if stale:
        with pytest.raises(castore.CommitUncertainError):
            run.commit_step("s1", {"n": 1})
        run.close()
        run = store.resume(TASK, PLAN)
        assert (2, "s2") == (run.head.seq, run.next_step)
        run.commit_step("s2", {"n": 2})
    else:
        assert (1, "s1") == (run.head.seq, run.next_step)
        run.commit_step("s1", {"n": 1})
    run.close()
    retried = {p: n for p, n in faulty.fsyncs_per_temp().items() if p != fired.path}
    assert dict.fromkeys(retried, 1) == retried
    chain = store.verify(TASK)
    head = 3 if stale else 2
    assert head == chain.head.seq
    assert head + 1 == chain.length
    assert [] == misnamed_objects(store.root)
    assert [] == fsck_errors(store.root)


# -- in-process faults: put_blob -----------------------------------------------------------------

BLOB_FAULTS = [
    pytest.param(Fault("write", "temp", errno.ENOSPC), id="write-temp-ENOSPC"),
    pytest.param(Fault("fsync", "temp", errno.EIO), id="fsync-temp-EIO"),
    pytest.param(Fault("close", "temp", errno.EIO), id="close-temp-EIO"),
    pytest.param(Fault("link", "object", errno.ENOSPC), id="link-object-ENOSPC"),
    pytest.param(Fault("fsync", "fanout-dir", errno.EIO), id="fsync-fanout-EIO"),
]


@pytest.mark.parametrize("fault", BLOB_FAULTS)
def test_put_blob_fault(store: castore.Store, faulty: FaultyOS, fault: Fault) -> None:
    """A failed put_blob raises a clean, path-naming error, leaves no temp or partial object,
    and the same put succeeds once the fault clears."""
    value = {"rows": list(range(2000))}
    before = files(store.root)
    faulty.arm(fault)

    with pytest.raises(castore.DurabilityError) as caught:
        store.put_blob(value)

    fired = faulty.fired
    assert fired is not None
    check_clean_failure(faulty, caught.value, fault, fired.path)
    assert not isinstance(caught.value, castore.CommitUncertainError)
    assert [] == temp_files(store.root)
    objects = linked_objects(faulty, store.root)
    assert dict.fromkeys(objects, "object") == new_files(before, files(store.root))
    check_objects_complete(store.root, objects)

    ref = store.put_blob(value)
    assert value == store.get_blob(ref)
    retried = {p: n for p, n in faulty.fsyncs_per_temp().items() if p != fired.path}
    assert dict.fromkeys(retried, 1) == retried
    assert [] == temp_files(store.root)
    assert [] == misnamed_objects(store.root)
    assert [] == fsck_errors(store.root)


# -- in-process faults: Store.start ---------------------------------------------------------------

# The first temp file of a start is the plan object's, the second the snapshot's; the first
# plain-directory fsync is tasks/ (making the new task directory's name durable).
START_FAULTS = [
    pytest.param(Fault("fsync", "temp", errno.EIO, nth=1), False, id="fsync-plan-temp-EIO"),
    pytest.param(Fault("fsync", "temp", errno.EIO, nth=2), False, id="fsync-snapshot-temp-EIO"),
    pytest.param(Fault("write", "temp", errno.ENOSPC, nth=2), False, id="write-snapshot-ENOSPC"),
    pytest.param(Fault("close", "temp", errno.EIO, nth=2), False, id="close-snapshot-EIO"),
    pytest.param(Fault("fsync", "dir", errno.EIO), False, id="fsync-tasks-dir-EIO"),
    pytest.param(Fault("link", "slot", errno.EIO), False, id="link-slot0-EIO"),
    pytest.param(Fault("fsync", "chain-dir", errno.EIO), True, id="fsync-chain-EIO"),
]


@pytest.mark.parametrize(("fault", "uncertain"), START_FAULTS)
def test_start_fault(store: castore.Store, faulty: FaultyOS, fault: Fault, uncertain: bool) -> None:
    """A failed Store.start raises a clean, path-naming error and writes no slot 0 (unless the
    commit point was taken: then open_task resumes it); the next start succeeds."""
    before = files(store.root)
    faulty.arm(fault)
    expected_error = castore.CommitUncertainError if uncertain else castore.DurabilityError

    with pytest.raises(expected_error) as caught:
        store.start(TASK, PLAN)

    fired = faulty.fired
    assert fired is not None
    check_clean_failure(faulty, caught.value, fault, expected_path(fault, fired, store, 0, TASK))
    assert [] == temp_files(store.root)
    added = new_files(before, files(store.root))
    lock = os.path.relpath(store.layout.lock_path(TASK), store.root)
    added.pop(lock, None)  # the task's lock file: taken before the commit, never deleted
    objects = linked_objects(faulty, store.root)
    slot = os.path.relpath(store.layout.slot_path(TASK, 0), store.root)
    assert {**dict.fromkeys(objects, "object"), **({slot: "slot"} if uncertain else {})} == added
    check_objects_complete(store.root, objects)
    assert uncertain == os.path.lexists(store.layout.slot_path(TASK, 0))

    run = store.open_task(TASK, PLAN) if uncertain else store.start(TASK, PLAN)
    assert (0, "s0") == (run.head.seq, run.next_step)
    run.commit_step("s0", {"n": 0})
    run.close()
    assert 1 == store.verify(TASK).head.seq
    assert [] == misnamed_objects(store.root)
    assert [] == fsck_errors(store.root)


def test_failed_start_leaves_fsck_clean(store: castore.Store, faulty: FaultyOS) -> None:
    """After a start that failed cleanly (snapshot fsync EIO), fsck reports no error."""
    faulty.arm(Fault("fsync", "temp", errno.EIO, nth=2))
    with pytest.raises(castore.DurabilityError):
        store.start(TASK, PLAN)
    assert [] == fsck_errors(store.root)


def test_failed_start_leaves_status_listable(store: castore.Store, faulty: FaultyOS) -> None:
    """After a start that failed cleanly, status() answers for every task that tasks() lists."""
    faulty.arm(Fault("fsync", "temp", errno.EIO, nth=2))
    with pytest.raises(castore.DurabilityError):
        store.start(TASK, PLAN)
    listed = store.tasks()
    assert listed == [store.status(task).task for task in listed]


def test_failed_fsync_is_not_retried_by_the_next_call(
    store: castore.Store, faulty: FaultyOS
) -> None:
    """After a temp fsync fails, the retry writes a new temp file; the failed one is never
    fsynced again, and every temp file of the whole sequence is fsynced exactly once."""
    run = store.start(TASK, PLAN)
    faulty.arm(Fault("fsync", "temp", errno.EIO))
    with pytest.raises(castore.DurabilityError) as caught:
        run.commit_step("s0", "x")
    failed = caught.value.path
    run.commit_step("s0", "x")
    run.close()
    counts = faulty.fsyncs_per_temp()
    assert 1 == counts.pop(failed)
    assert 1 == len(counts)
    assert [1] == list(counts.values())
    assert failed not in counts


def test_write_enospc_then_close_eio_removes_temp(store: castore.Store, faulty: FaultyOS) -> None:
    """A write that fails and a close that then fails too (NFS reports deferred errors at close)
    still raise a DurabilityError for the write's errno and leave no temp file."""
    faulty.arm(Fault("write", "temp", errno.ENOSPC), Fault("close", "temp", errno.EIO))
    with pytest.raises(castore.DurabilityError) as caught:
        store.put_blob({"rows": list(range(100))})
    assert (errno.ENOSPC, "temp") == (caught.value.errno, kind_of(caught.value.path))
    assert [] == temp_files(store.root)


# -- real ENOSPC on a tiny tmpfs ------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs mounted for this test (root only), unmounted afterwards."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def free_bytes(path: Path) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def commit_until_full(run: castore.Run, acked: list[int]) -> None:
    """Commit 6 KB results until a commit fails, appending each acknowledged sequence."""
    for _ in range(64):
        run.commit_step(run.next_step, "x" * 6000)
        acked.append(run.head.seq)


def test_enospc_commit_on_full_tmpfs(tiny_fs: Path) -> None:
    """Commits on a full tmpfs fail with ENOSPC naming the temp file; nothing partial or
    temporary is left, the chain and fsck are clean, and after freeing space it commits."""
    store = castore.Store.init(tiny_fs / "store")
    filler = tiny_fs / "filler"
    filler.write_bytes(b"\0" * (free_bytes(tiny_fs) - 40 * 1024))
    run = store.start(TASK, castore.Plan.build("full", *[f"s{i}" for i in range(64)]))
    acked = [run.head.seq]
    with pytest.raises(castore.DurabilityError) as caught:
        commit_until_full(run, acked)
    exc = caught.value
    assert errno.ENOSPC == exc.errno
    assert exc.path in str(exc)
    assert "temp" == kind_of(exc.path)
    assert str(tiny_fs / "store" / "objects") == os.path.dirname(os.path.dirname(exc.path))
    assert len(acked) > 1
    assert not run.stale
    assert [] == temp_files(store.root)
    assert [] == misnamed_objects(store.root)
    assert acked[-1] == store.verify(TASK).head.seq
    assert [] == fsck_errors(store.root)

    filler.unlink()
    run.commit_step(run.next_step, "x" * 6000)
    run.close()
    assert acked[-1] + 1 == store.verify(TASK).head.seq
    assert [] == temp_files(store.root)
    assert [] == fsck_errors(store.root)


def test_enospc_blob_larger_than_tmpfs(tiny_fs: Path) -> None:
    """A blob larger than the disk fails with ENOSPC; its temp file is removed, so the space
    is free again and the next put succeeds."""
    store = castore.Store.init(tiny_fs / "store")
    free = free_bytes(tiny_fs)
    with pytest.raises(castore.DurabilityError) as caught:
        store.put_blob("y" * (300 * 1024))
    assert errno.ENOSPC == caught.value.errno
    assert caught.value.path in str(caught.value)
    assert "temp" == kind_of(caught.value.path)
    assert free == free_bytes(tiny_fs)
    assert [] == temp_files(store.root)
    assert [] == misnamed_objects(store.root)
    ref = store.put_blob("y" * (100 * 1024))
    assert "y" * (100 * 1024) == store.get_blob(ref)
    assert [] == fsck_errors(store.root)


# -- real fsync EIO, injected by strace -----------------------------------------------------------

# Resumes the task and commits argv[3] steps, printing each acknowledged commit; a
# DurabilityError is printed with its errno and path, exit status 3.
CHILD = """
import sys
import castore

root, task, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = castore.Plan.build("faults", *[f"s{i}" for i in range(8)])
store = castore.Store.open(root)
run = store.resume(task, plan)
try:
    for _ in range(count):
        run.commit_step(run.next_step, {"n": run.head.seq})
        print("ack", run.head.seq, flush=True)
except castore.DurabilityError as exc:
    print("durability", exc.errno, exc.path, type(exc).__name__, flush=True)
    sys.exit(3)
run.close()
print("done", flush=True)
"""

# A v2 commit makes two fsyncs: its temp file and the chain directory (FORMAT.md 9.3).
# Resume makes none; a run's first commit syncs the chain directory once first (the HEAD it
# builds on may not be durable yet), so fsync number 6 is the temp file fsync of the child's
# third commit.
INJECT_WHEN = 6


def strace_or_skip() -> str:
    found = shutil.which("strace")
    if found is None:
        pytest.skip("strace is not installed (apt-get install -y strace)")
    probe = subprocess.run(
        [found, "-qq", "-o", os.devnull, "true"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.strip()}")
    return found


def unlinked(trace: list[str]) -> list[str]:
    """The paths that unlink/unlinkat calls in strace output name."""
    found = (re.search(r'unlink(?:at)?\(.*?"([^"]+)"', line) for line in trace)
    return [match[1] for match in found if match]


def test_strace_fsync_eio(store: castore.Store, tmp_path: Path) -> None:
    """fsync → EIO for real (strace): the child reports a DurabilityError naming its temp file,
    closes and removes it without another fsync or link; the store verifies; a rerun succeeds."""
    strace = strace_or_skip()
    make_every_fanout(store.root)  # no first-use flush of objects/ to shift the count
    store.start(TASK, PLAN).close()
    log = tmp_path / "strace.log"
    # `-e trace=none` would disable the injection (strace 6.1): trace the calls to a log.
    traced = subprocess.run(
        [
            strace,
            "-f",
            "-qq",
            "-o",
            str(log),
            "-e",
            "trace=fsync,close,link,linkat,unlink,unlinkat",
            "-e",
            f"inject=fsync:error=EIO:when={INJECT_WHEN}",
            sys.executable,
            "-c",
            CHILD,
            store.root,
            TASK,
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = traced.stdout.splitlines()
    assert 3 == traced.returncode, traced.stderr
    assert ["ack 1", "ack 2"] == lines[:2]
    word, err, path, kind = lines[2].split(" ")
    assert ("durability", str(errno.EIO), "temp", "DurabilityError") == (
        word,
        err,
        kind_of(path),
        kind,
    )
    assert 3 == len(lines)

    trace = log.read_text().splitlines()
    injected = [i for i, line in enumerate(trace) if "(INJECTED)" in line]
    assert 1 == len(injected)
    fd = re.search(r"fsync\((\d+)\)", trace[injected[0]])
    assert fd is not None
    after = trace[injected[0] + 1 :]
    closed = next(i for i, line in enumerate(after) if re.search(rf"close\({fd[1]}\)", line))
    assert [] == [line for line in after[:closed] if "fsync(" in line]
    assert [] == [line for line in after if re.search(r"\blink(at)?\(", line)]
    assert [path] == [p for p in unlinked(after) if kind_of(p) == "temp"]

    assert [] == temp_files(store.root)
    assert [] == misnamed_objects(store.root)
    assert 2 == store.verify(TASK).head.seq
    assert [] == fsck_errors(store.root)

    rerun = subprocess.run(
        [sys.executable, "-c", CHILD, store.root, TASK, "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (0, ["ack 3", "ack 4", "ack 5", "done"]) == (
        rerun.returncode,
        rerun.stdout.splitlines(),
    ), rerun.stderr
    assert 5 == store.verify(TASK).head.seq
    assert [] == temp_files(store.root)
    assert [] == fsck_errors(store.root)
