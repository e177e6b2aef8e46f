"""Bounded reads and nesting: what castore writes at most, it reads at most.

A huge sparse file planted as a chain slot or an object is refused from its fstat, before a
byte is read (status, resume, log, fsck, gc: a finding or a clear error, never MemoryError).
A value nested deeper than MAX_DEPTH is refused with EncodingError on encode and as
undecodable on decode (never RecursionError), by the strict and the fast (msgspec) paths.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import cli

import castore
from castore.errors import OversizedFileError
from castore.format import codec, fastdecode, limits
from castore.format.digest import hash_bytes
from castore.maintenance.fsck import Severity, check_store
from castore.maintenance.gc import collect
from castore.medium import fsread

PLAN = castore.Plan.build("limits", "a", "b")
HUGE = 8 << 30  # 8 GiB, sparse: no disk space, and never read


def nested(depth: int) -> object:
    """A list nesting `depth` lists (the outermost counted); the innermost holds 1."""
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def plant_huge_head(store: castore.Store, task: str) -> Path:
    """Task `task` with slot 0, and an 8 GiB sparse file as its slot 1 (the HEAD)."""
    store.start(task, PLAN).close()
    slot = Path(store.layout.slot_path(task, 1))
    with open(slot, "wb") as handle:
        handle.truncate(HUGE)
    return slot


def test_a_huge_head_slot_is_refused_unread(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """An 8 GiB sparse HEAD slot: status reports the task broken ('too large'), resume
    raises ChainError, `log` exits 3 with one line; nothing tries to read 8 GiB."""
    slot = plant_huge_head(store, "t")
    status = store.status("t")
    assert status.error is not None
    assert "too large: 8589934592 bytes" in status.error
    with pytest.raises(castore.ChainError, match="too large"):
        store.resume("t", PLAN)
    code, out, err = cli(capsys, "--store", store.root, "log", "t")
    assert 3 == code
    assert "too large" in out.splitlines()[0]  # the HEAD slot, named in its place
    assert 1 == len(err.splitlines()), err
    assert HUGE == slot.stat().st_size


def test_a_huge_object_is_an_fsck_finding_and_gc_keeps_going(store: castore.Store) -> None:
    """An 8 GiB sparse file under an object name, and one as a HEAD slot: fsck reports
    both as unsafe-file errors; gc neither crashes nor removes anything."""
    plant_huge_head(store, "t")
    name = "ab" + "c" * 62
    huge = Path(store.layout.object_path(name))
    # Fan-out directories are made on first use; the task's own objects may have made this one.
    huge.parent.mkdir(exist_ok=True)
    with open(huge, "wb") as handle:
        handle.truncate(HUGE)
    errors = {
        (f.code, f.path) for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR
    }
    assert {
        ("unsafe-file", f"objects/ab/{name}"),
        ("unsafe-file", "tasks/t/chain/0000000000000001"),
    } == errors
    report = collect(store.root, grace_s=0)
    assert [] == report.removed
    assert ["t"] == report.unreadable_tasks
    assert HUGE == huge.stat().st_size


def test_a_huge_object_named_by_a_chain_is_integrity_not_memory(store: castore.Store) -> None:
    """objects.read of an id whose file is 8 GiB raises OversizedFileError (an
    UnsafeFileError), reading nothing."""
    name = "cd" + "e" * 62
    os.makedirs(os.path.dirname(store.layout.object_path(name)), exist_ok=True)  # first use
    with open(store.layout.object_path(name), "wb") as handle:
        handle.truncate(HUGE)
    with pytest.raises(castore.UnsafeFileError, match="too large"):
        store.objects.read(name)


@pytest.mark.parametrize("depth", [limits.MAX_DEPTH - 2 + 1, 500, 5000])
def test_a_result_nested_too_deep_is_refused_before_commit(
    store: castore.Store, depth: int
) -> None:
    """A step result nesting more than MAX_DEPTH - 2 (the snapshot's own two levels) is
    EncodingError, not RecursionError; nothing is committed and the run goes on."""
    with store.start("t", PLAN) as run:
        with pytest.raises(castore.EncodingError, match="more than 100 deep"):
            run.commit_step("a", nested(depth))
        assert 0 == store.verify("t").head.seq
        run.commit_step("a", nested(limits.MAX_DEPTH - 2))
    assert 1 == store.verify("t").head.seq


@pytest.mark.parametrize("depth", [limits.MAX_DEPTH + 1, 5000])
def test_a_blob_nested_too_deep_is_refused(store: castore.Store, depth: int) -> None:
    """put_blob of a value nesting more than MAX_DEPTH raises EncodingError; one nesting
    exactly MAX_DEPTH is stored and read back."""
    with pytest.raises(castore.EncodingError, match="more than 100 deep"):
        store.put_blob(nested(depth))
    ref = store.put_blob(nested(limits.MAX_DEPTH))
    assert nested(limits.MAX_DEPTH) == store.get_blob(ref)


@pytest.mark.parametrize("depth", [limits.MAX_DEPTH + 1, 5000, 100_000])
def test_a_forged_deep_body_does_not_decode(depth: int) -> None:
    """A body nesting more than MAX_DEPTH: codec.decode_value raises ValueError (never
    RecursionError) and the fast path does not vouch for it."""
    body = b"[" * depth + b"]" * depth
    assert None is fastdecode.decode_canonical_value(body)
    with pytest.raises(ValueError, match="deep"):
        codec.decode_value(body)
    deepest: list[object] = []
    for _ in range(limits.MAX_DEPTH - 1):
        deepest = [deepest]
    assert deepest == codec.decode_value(b"[" * limits.MAX_DEPTH + b"]" * limits.MAX_DEPTH)


def test_a_forged_deep_blob_on_disk_is_corrupt_for_get_blob_and_fsck(store: castore.Store) -> None:
    """A hash-valid blob object nesting 150 deep (written by hand, not by castore):
    get_blob raises ObjectCorruptError and fsck reports it undecodable."""
    data = codec.frame("blob", b"[" * 150 + b"]" * 150)
    object_id = hash_bytes(data)
    path = store.layout.object_path(object_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)  # fan-out directories: made on first use
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o444)
    with pytest.raises(castore.ObjectCorruptError, match="deep"):
        store.get_blob(object_id)
    codes = {(f.code, f.object_id) for f in check_store(store.root, jobs=1)}
    assert ("undecodable", object_id) in codes


def test_an_object_over_the_size_limit_is_refused_before_writing(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob whose body is over MAX_BODY_SIZE (lowered here to 1 KiB) raises
    ObjectTooLargeError and writes no file."""
    monkeypatch.setattr(limits, "MAX_BODY_SIZE", 1024)
    before = sorted(p.name for p in Path(store.layout.objects).rglob("*") if p.is_file())
    with pytest.raises(castore.PayloadError, match="over castore's limit of 1024 bytes"):
        store.put_blob("x" * 2000)
    after = sorted(p.name for p in Path(store.layout.objects).rglob("*") if p.is_file())
    assert before == after


def test_the_rest_of_a_file_read_past_its_stat_is_bounded(tmp_path: Path) -> None:
    """A file that turns out longer than its fstat said is read to its end in chunks, and
    refused once it passes the limit (a file that keeps growing is never read until memory
    runs out); the chunked hash of a file is its blake3 digest."""
    path = tmp_path / "grown"
    data = os.urandom(3 << 20)  # three chunks and more
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert b"xy" + data == fsread._read_rest(str(path), fd, b"xy", len(data) + 2)
        os.lseek(fd, 0, os.SEEK_SET)
        with pytest.raises(OversizedFileError):
            fsread._read_rest(str(path), fd, b"xy", len(data) + 1)
    finally:
        os.close(fd)
    assert hash_bytes(data) == fsread.hash_regular(str(path))
    with pytest.raises(OversizedFileError):
        fsread.hash_regular(str(path), limit=len(data) - 1)
