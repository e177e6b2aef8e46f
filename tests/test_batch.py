"""store.batch(): objects put together share two flushes; nothing is named before the end, or
before a commit inside the block, which publishes them with its snapshot."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import castore
from castore.chain.objects import ObjectStore
from castore.chain.trees import raw_bytes
from castore.format.digest import hash_bytes
from castore.format.layout import object_key, slot_key
from castore.maintenance.fsck import Severity, check_store
from castore.medium import fsio, groupflush, posixbatch
from castore.medium.flushpolicy import FlushPolicy
from tests.helpers import make_every_fanout, object_files

SHARED = FlushPolicy(True, "ext4", "test: shared")
PRECISE = FlushPolicy(False, "fuse.sshfs", "test: precise")


class Flushes:
    """Counts the flushes castore makes (file and directory fsyncs, syncfs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[str] = []
        self.fail_syncfs: int | None = None  # the nth syncfs fails with EIO
        real_file, real_dir, real_syncfs = fsio.fsync_file, fsio.fsync_dir, fsio.syncfs

        def syncfs(fd: int) -> None:
            self.made.append("syncfs")
            if self.fail_syncfs is not None and self.made.count("syncfs") == self.fail_syncfs:
                raise OSError(errno.EIO, "Input/output error")
            real_syncfs(fd)

        monkeypatch.setattr(fsio, "syncfs", syncfs)
        monkeypatch.setattr(
            fsio, "fsync_file", lambda fd, path: (self.made.append("fsync"), real_file(fd, path))[1]
        )
        monkeypatch.setattr(
            fsio, "fsync_dir", lambda path: (self.made.append("fsync_dir"), real_dir(path))[1]
        )


def _store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: FlushPolicy) -> castore.Store:
    monkeypatch.setattr(groupflush, "_BY_DEVICE", {})
    monkeypatch.setattr(groupflush, "decide", lambda root: policy)
    return castore.Store.init(tmp_path / "s")


def _temps(root: str) -> list[str]:
    return [n for _, _, names in os.walk(root) for n in names if n.startswith(".tmp-")]


def test_a_batch_of_objects_is_two_syncfs_and_names_appear_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five raw parts and a tree: two syncfs, no fsync; no part is named inside the block.
    The store is new: the fan-out directories the batch makes are made durable by its first
    syncfs, with no flush of their own."""
    store = _store(tmp_path, monkeypatch, SHARED)
    assert [] == os.listdir(Path(store.root, "objects"))
    flushes = Flushes(monkeypatch)
    with store.batch():
        parts = {f"p{i}": store.put_raw(f"part {i}".encode() * 50) for i in range(5)}
        tree = store.put_tree(parts, {"n": 5})
        assert not os.path.exists(store.objects.path(tree.tree))
        assert [] == flushes.made
    assert ["syncfs", "syncfs"] == flushes.made
    assert {f"part {i}".encode() * 50 for i in range(5)} == {
        store.get_raw(part) for part in parts.values()
    }
    assert {"n": 5} == store.get_tree(tree).data
    assert [] == _temps(store.root)
    assert {tree.tree, *(p.raw for p in parts.values())} <= set(object_files(store.root))


def test_an_error_inside_a_batch_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception in the block: no object of the batch is named, no temp file is left."""
    store = _store(tmp_path, monkeypatch, SHARED)
    before = set(object_files(store.root))

    def changes_its_mind() -> None:
        with store.batch():
            store.put_raw(b"never named")
            raise RuntimeError("the caller changed its mind")

    with pytest.raises(RuntimeError):
        changes_its_mind()
    assert before == set(object_files(store.root))
    assert [] == _temps(store.root)


@pytest.mark.parametrize(("nth", "what"), [(1, "bytes"), (2, "names")])
def test_a_failed_syncfs_of_a_batch_is_a_durability_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nth: int, what: str
) -> None:
    """The data flush fails: nothing named. The names' flush fails: named but reported, and
    never trusted as durable by the caller (the put raised). No temp file left either way."""
    store = _store(tmp_path, monkeypatch, SHARED)
    flushes = Flushes(monkeypatch)
    flushes.fail_syncfs = nth
    with pytest.raises(castore.DurabilityError, match=f"syncing a batch's {what}"), store.batch():
        raw = store.put_raw(b"some bytes" * 10)
    assert [] == _temps(store.root)
    assert (nth == 2) == os.path.exists(store.objects.path(raw.raw))
    assert store.put_raw(b"some bytes" * 10) == raw  # a later put publishes it


def test_a_commit_inside_the_batch_publishes_it_first_and_shares_its_data_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit naming objects of the open batch: the snapshot joins the batch, one syncfs
    makes all their bytes durable, one all their names, and only then is the slot linked
    (its directory flushed): three flushes where a batch and a commit after it made four.
    The block goes on after it; the objects put later are published at its end."""
    store = _store(tmp_path, monkeypatch, SHARED)
    run = store.start("t", castore.Plan.build("p", "a", "b"))
    run.commit_step("a", 1)  # the run's first commit flushes HEAD's directory once more
    make_every_fanout(store.root)  # no first-use flush of objects/ in the count
    slot = Path(store.root, slot_key("t", 2))
    linked_after_names: list[bool] = []
    real_link = fsio.link_new

    def link_new(source: str, target: str) -> bool:
        if target == str(slot):  # the commit point: every object it names is durable
            linked_after_names.append(flushes.made == ["syncfs", "syncfs"])
        return real_link(source, target)

    monkeypatch.setattr(fsio, "link_new", link_new)
    flushes = Flushes(monkeypatch)
    with store.batch():
        raw = store.put_raw(b"x" * 100)
        tree = store.put_tree({"raw": raw})
        assert not os.path.exists(store.objects.path(tree.tree))
        run.commit_step("b", tree)
        assert os.path.exists(store.objects.path(tree.tree))
        assert ["syncfs", "syncfs", "fsync_dir"] == flushes.made
        later = store.put_raw(b"y" * 100)
        assert not os.path.exists(store.objects.path(later.raw))
    assert ["syncfs", "syncfs", "fsync_dir", "syncfs", "syncfs"] == flushes.made
    assert [True] == linked_after_names
    assert 2 == run.head.seq
    assert b"y" * 100 == store.get_raw(later)
    assert [] == _temps(store.root)
    assert [] == [f.code for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]


def test_a_commit_inside_a_batch_whose_data_flush_fails_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared data flush fails: DurabilityError before the commit point, no slot, no
    temp file; the run stays usable and the same commit succeeds after the block."""
    store = _store(tmp_path, monkeypatch, SHARED)
    run = store.start("t", castore.Plan.build("p", "a"))
    flushes = Flushes(monkeypatch)
    flushes.fail_syncfs = 1

    def commit_in_a_batch() -> None:
        with store.batch():
            run.commit_step("a", store.put_raw(b"x" * 100))

    with pytest.raises(castore.DurabilityError, match="syncing a batch's bytes"):
        commit_in_a_batch()
    assert 0 == run.head.seq
    assert not Path(store.root, slot_key("t", 1)).exists()
    assert [] == _temps(store.root)
    flushes.fail_syncfs = None
    run.commit_step("a", store.put_raw(b"x" * 100))
    assert 1 == run.head.seq
    assert [] == [f.code for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]


def test_a_commit_inside_a_batch_that_holds_nothing_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain result committed in an open block: its snapshot is the batch's one object
    (it failed with ObjectMissingError before, its snapshot waiting in the batch unnamed)."""
    store = _store(tmp_path, monkeypatch, SHARED)
    run = store.start("t", castore.Plan.build("p", "a", "b"))
    with store.batch():
        run.commit_step("a", {"rows": 3})
        raw = store.put_raw(b"z" * 100)
    run.commit_step("b", raw)
    assert run.finished
    assert [] == [f.code for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]


def test_a_commit_inside_a_batch_never_names_a_damaged_copy_found_under_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object of the batch whose name held other bytes already (a damaged copy): the
    batch's publish finds the name, the check that follows reads it, and the commit fails
    before its commit point (ObjectCorruptError), as a put outside a batch would."""
    store = _store(tmp_path, monkeypatch, SHARED)
    run = store.start("t", castore.Plan.build("p", "a"))
    body = b"x" * 100
    damaged = Path(store.root, object_key(hash_bytes(raw_bytes(body))))
    damaged.parent.mkdir(exist_ok=True)
    damaged.write_bytes(raw_bytes(body)[:-1] + b"y")

    def commit_in_a_batch() -> None:
        with store.batch():
            run.commit_step("a", store.put_raw(body))

    with pytest.raises(castore.ObjectCorruptError):
        commit_in_a_batch()
    assert 0 == run.head.seq
    assert not Path(store.root, slot_key("t", 1)).exists()
    assert [] == _temps(store.root)


def test_an_object_gone_after_the_link_is_stored_again_and_published_before_the_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gc sets the raw object aside between the batch's publish and the commit's look after
    its link: the commit stores it again, and, inside the block still, publishes it (bytes
    and name durable) before it returns, not at the block's end."""
    store = _store(tmp_path, monkeypatch, SHARED)
    run = store.start("t", castore.Plan.build("p", "a"))
    body = b"w" * 100
    raw_path = Path(store.root, object_key(hash_bytes(raw_bytes(body))))
    real = ObjectStore.still_named
    set_aside: list[str] = []

    def still_named(objects: ObjectStore, object_id: str) -> bool:
        if object_id == raw_path.name and not set_aside and raw_path.exists():
            raw_path.unlink()  # what gc's set-aside does to the name
            set_aside.append(object_id)
        return real(objects, object_id)

    monkeypatch.setattr(ObjectStore, "still_named", still_named)
    with store.batch():
        raw = store.put_raw(body)
        flushes = Flushes(monkeypatch)
        run.commit_step("a", raw)
        assert [raw.raw] == set_aside
        assert raw_path.exists()
        assert store.objects.pending(raw.raw) is None
        assert flushes.made[-2:] == ["syncfs", "syncfs"]  # its publish, after the slot's flush
    assert [] == [f.code for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]


def test_names_whose_batch_flush_failed_are_flushed_before_a_commit_relies_on_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's names flush fails: the names exist, not known durable. A later commit
    naming one flushes its directory first, also one made through another Store object of
    the same process (the first one's bytes remembered, the second's read back)."""
    store = _store(tmp_path, monkeypatch, SHARED)
    monkeypatch.setattr(posixbatch, "_UNSURE", set())  # this test's names only
    store.start("t", castore.Plan.build("p", "a", "b")).close()
    other = castore.Store.open(store.root).resume("t", castore.Plan.build("p", "a", "b"))
    flushes = Flushes(monkeypatch)
    flushes.fail_syncfs = 2

    def put_in_a_batch() -> castore.RawRef:
        with store.batch():
            return store.put_raw(b"v" * 100)

    with pytest.raises(castore.DurabilityError, match="syncing a batch's names"):
        put_in_a_batch()
    raw_path = Path(store.root, object_key(hash_bytes(raw_bytes(b"v" * 100))))
    assert raw_path.exists()
    flushes.fail_syncfs = None
    synced: list[str] = []
    real_dir = fsio.fsync_dir
    monkeypatch.setattr(fsio, "fsync_dir", lambda path: (synced.append(path), real_dir(path))[1])
    other.commit_step("a", castore.RawRef(raw_path.name))
    assert str(raw_path.parent) in synced
    assert 1 == other.head.seq
    synced.clear()
    other.commit_step("b", castore.RawRef(raw_path.name))  # kept: flushed at every reliance
    assert str(raw_path.parent) in synced


def test_a_failure_after_the_link_is_an_uncertain_commit_not_a_failed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc takes the raw object after the slot's link, and storing it again fails (its
    publish's first syncfs): the slot is there and durable, so the commit is reported as
    CommitUncertainError and the run stops, never as a commit that was not made."""
    store = _store(tmp_path, monkeypatch, SHARED)
    run = store.start("t", castore.Plan.build("p", "a", "b"))
    body = b"s" * 100
    raw_path = Path(store.root, object_key(hash_bytes(raw_bytes(body))))
    real = ObjectStore.still_named

    def still_named(objects: ObjectStore, object_id: str) -> bool:
        if object_id == raw_path.name and raw_path.exists():
            raw_path.unlink()  # what gc's set-aside does to the name
        return real(objects, object_id)

    monkeypatch.setattr(ObjectStore, "still_named", still_named)
    flushes = Flushes(monkeypatch)
    flushes.fail_syncfs = 3  # the batch's two, then the first of the object stored again

    def commit_in_a_batch() -> None:
        with store.batch():
            run.commit_step("a", store.put_raw(body))

    with pytest.raises(castore.CommitUncertainError, match="was made"):
        commit_in_a_batch()
    assert Path(store.root, slot_key("t", 1)).exists()
    with pytest.raises(castore.CommitUncertainError):
        run.commit_step("a", 1)  # the run is stale: it must be resumed


def test_a_link_that_fails_in_a_batch_fails_it_and_is_not_taken_for_an_existing_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO from the link of a batch's object: DurabilityError, nothing left behind, no retry
    loop (only a missing directory or temp file means "store it again")."""
    store = _store(tmp_path, monkeypatch, SHARED)
    real = fsio.link_new

    def link_new(source: str, target: str) -> bool:
        if "/objects/" in target:
            raise castore.DurabilityError(target, "linking a new name", OSError(errno.EIO, "EIO"))
        return real(source, target)

    monkeypatch.setattr(fsio, "link_new", link_new)
    flushes = Flushes(monkeypatch)

    def put_in_a_batch() -> None:
        with store.batch():
            store.put_raw(b"u" * 100)

    with pytest.raises(castore.DurabilityError, match="linking a new name"):
        put_in_a_batch()
    assert ["syncfs"] == flushes.made  # stopped at the link: no names flush, no put again
    assert [] == _temps(store.root)


def test_where_flushes_are_not_shared_each_put_publishes_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On FUSE or NFS a batch changes nothing: each put is durable and named at once."""
    store = _store(tmp_path, monkeypatch, PRECISE)
    make_every_fanout(store.root)  # no first-use flush of objects/ in the count
    flushes = Flushes(monkeypatch)
    with store.batch():
        raw = store.put_raw(b"y" * 100)
        assert os.path.exists(store.objects.path(raw.raw))
    assert ["fsync", "fsync_dir"] == flushes.made
