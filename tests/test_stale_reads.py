"""Stale reads on a shared filesystem (FORMAT.md 11.5), injected into the `os` that
castore.medium.fsread calls.

A client of a network filesystem may serve a file's bytes from a cache that predates another
client's write (FUSE's page cache; GlusterFS with its default caches serves a file just
written as empty), and may answer ESTALE for a name another client renamed over. Neither
means the object is damaged: a reader reads an object that does not hash to its id once
more, past the caches, before calling it corrupt, and opens a file again after an ESTALE.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import castore
from castore.cli import main
from castore.format.digest import hash_bytes
from castore.maintenance.fsck import Severity, check_store
from castore.medium import fsread

PLAN = castore.Plan.build("stale", "a", "b", "c")
TASK = "stale/1"


class StaleOS:
    """The `os` of castore.medium.fsread, serving the first `stale_opens` opens of a target (a
    path, or a name opened in a directory descriptor) stale: reads of such a descriptor return
    `stale` (then end of file) instead of the file's bytes, or the open fails with `err`. Counts the
    opens of the targets."""

    def __init__(
        self, *targets: str, stale: bytes = b"", err: int = 0, stale_opens: int = 1
    ) -> None:
        self.targets, self.stale, self.err, self.stale_opens = targets, stale, err, stale_opens
        self.opens = 0
        self._stale_fds: dict[int, int] = {}  # a stale descriptor -> how far it was read

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: str, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if os.fspath(path) not in self.targets:
            return os.open(path, flags, mode, **kw)
        self.opens += 1
        if self.opens <= self.stale_opens and self.err:
            raise OSError(self.err, os.strerror(self.err), path)
        fd = os.open(path, flags, mode, **kw)
        if self.opens <= self.stale_opens:
            self._stale_fds[fd] = 0
        return fd

    def read(self, fd: int, size: int) -> bytes:
        if fd not in self._stale_fds:
            return os.read(fd, size)
        offset = self._stale_fds[fd]
        self._stale_fds[fd] = offset + size
        return self.stale[offset : offset + size]

    def close(self, fd: int) -> None:
        self._stale_fds.pop(fd, None)
        os.close(fd)


def _store_with_a_chain(root: Path) -> tuple[castore.Store, str]:
    """A store whose task has three snapshots; the id of the middle one (a resume reads it by
    id, through ObjectStore.read, while it walks the chain)."""
    store = castore.Store.init(root)
    with store.start(TASK, PLAN) as run:
        run.commit_step("a", {"n": 1})
        run.commit_step("b", {"n": 2})
    return store, hash_bytes(Path(store.layout.slot_path(TASK, 1)).read_bytes())


def _flip_a_byte(path: str) -> None:
    """Damage an object in place: bit rot, which no second read can undo."""
    data = bytearray(Path(path).read_bytes())
    data[-2] ^= 1
    os.chmod(path, 0o644)
    Path(path).write_bytes(bytes(data))
    os.chmod(path, 0o444)


def _stale(monkeypatch: pytest.MonkeyPatch, *targets: str, **how: Any) -> StaleOS:
    fake = StaleOS(*targets, **how)
    monkeypatch.setattr(fsread, "os", fake)
    return fake


def _fsck_errors(root: Path) -> list[str]:
    return [f.code for f in check_store(str(root), jobs=1) if f.severity == Severity.ERROR]


@pytest.mark.parametrize(
    "stale",
    [b"", b"castore 1 snapshot 12\n{}", b"\0" * 300],
    ids=["empty", "short", "other-bytes"],
)
def test_an_object_read_stale_at_first_is_read_again_and_the_task_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stale: bytes
) -> None:
    """A snapshot object whose first read returns stale bytes (empty, short or other bytes)
    and whose second read is whole: the resume verifies the chain and continues, nothing is
    corrupt, nothing is quarantined."""
    store, middle = _store_with_a_chain(tmp_path / "store")
    fake = _stale(monkeypatch, store.objects.path(middle), stale=stale)
    with store.resume(TASK, PLAN) as run:
        run.commit_step("c", {"n": 3})
    assert 2 == fake.opens  # the stale read, and the one past the caches
    monkeypatch.undo()
    assert 4 == store.verify(TASK).length
    assert 0 == main(["fsck", "--quarantine", str(tmp_path / "store")])
    assert not (tmp_path / "store" / "quarantine").exists()


def test_an_intact_object_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-read happens only on a mismatch: a resume opens an intact object once."""
    store, middle = _store_with_a_chain(tmp_path / "store")
    fake = _stale(monkeypatch, store.objects.path(middle), stale_opens=0)
    store.resume(TASK, PLAN).close()
    assert 1 == fake.opens


def test_a_truly_corrupt_object_is_still_corrupt_after_the_second_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object whose bytes on disk do not hash to its id is read twice and reported
    corrupt: get_blob raises ObjectCorruptError, the resume refuses the chain, fsck finds a
    hash mismatch."""
    store, middle = _store_with_a_chain(tmp_path / "store")
    ref = store.put_blob({"rots": True})
    for object_id in (ref.blob, middle):
        _flip_a_byte(store.objects.path(object_id))
    fake = _stale(monkeypatch, store.objects.path(ref.blob), stale_opens=0)
    with pytest.raises(castore.ObjectCorruptError) as caught:
        store.get_blob(ref)
    assert (2, store.objects.path(ref.blob)) == (fake.opens, caught.value.path)
    monkeypatch.undo()
    with pytest.raises(castore.ChainError, match=middle):
        store.resume(TASK, PLAN)
    assert 2 == _fsck_errors(tmp_path / "store").count("hash-mismatch")


@pytest.mark.parametrize("stale_opens", [1, 2])
def test_a_read_that_fails_estale_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stale_opens: int
) -> None:
    """An object whose first one or two opens fail with ESTALE (a handle the server no longer
    has) is opened again: the resume continues; fsck, which reads that snapshot through its
    chain slot, finds nothing either."""
    store, middle = _store_with_a_chain(tmp_path / "store")
    slot = os.path.basename(store.layout.slot_path(TASK, 1))
    fake = _stale(
        monkeypatch, store.objects.path(middle), err=errno.ESTALE, stale_opens=stale_opens
    )
    with store.resume(TASK, PLAN) as run:
        run.commit_step("c", {"n": 3})
    assert stale_opens + 1 == fake.opens
    fake.targets, fake.opens = (slot,), 0
    assert [] == _fsck_errors(tmp_path / "store")
    assert stale_opens + 1 == fake.opens


def test_a_handle_that_stays_stale_is_a_store_io_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ESTALE on every open: after two retries the read fails with StoreIOError (errno
    ESTALE, naming the object), never a corrupt or missing object."""
    store, middle = _store_with_a_chain(tmp_path / "store")
    path = store.objects.path(middle)
    fake = _stale(monkeypatch, path, err=errno.ESTALE, stale_opens=1000)
    with pytest.raises(castore.StoreIOError) as caught:
        store.objects.read(middle)
    assert (3, errno.ESTALE) == (fake.opens, caught.value.errno)
    assert path in str(caught.value)


@pytest.mark.parametrize("stale", [b"", b"\0" * 300], ids=["empty", "other-bytes"])
def test_fsck_reads_a_stale_looking_object_again_before_calling_it_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stale: bytes
) -> None:
    """fsck's own object check: a result blob whose first read is stale is read again past
    the caches, and nothing is reported; a truly rotten one still is (the test above)."""
    store, _ = _store_with_a_chain(tmp_path / "store")
    ref = store.put_blob({"kept": True})
    with store.resume(TASK, PLAN) as run:
        run.commit_step("c", ref)
    fake = _stale(monkeypatch, store.objects.path(ref.blob), stale=stale)
    assert [] == _fsck_errors(tmp_path / "store")
    assert 2 == fake.opens
