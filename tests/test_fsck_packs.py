"""fsck's damage catalogue for sealed history (format v2): packs (truncated, hash mismatch,
spliced from another task, contents that do not hold together, slots that disagree), the
sealed mark (stale, damaged) and how pruned slots below the mark read for the task checks;
gc keeps what only a pack names.

Seals are made by hand here (packs.build, a `seal` commit carrying the anchor, the mark, the
slots pruned), exactly as the sealer leaves them, so each damage can be made on purpose."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import attrs
import pytest
from helpers import flip_bit, rewrite
from test_fsck import ERROR, INFO, check, fsck, put_raw, row

import castore
from castore.chain import packs
from castore.chain.refs import TaskSlots
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import MARKS_DIR, fanout_key, slot_name, temp_name
from castore.format.records import Sealed, Transition, TransitionKind, snapshot_version
from castore.maintenance.gc import GcReport, Reachable, collect

PLAN = castore.Plan.build("sealed", *(f"s{i}" for i in range(10)))
BLOB_STEP = "s1"  # its result is a blob: named only by the pack once its slot is pruned


def start(store: castore.Store, task: str = "t", steps: int = 6, salt: str = "") -> None:
    with store.start(task, PLAN) as run:
        for step in PLAN.steps[:steps]:
            value = {"step": step.id, "salt": salt}
            run.commit_step(step.id, store.put_blob(value) if step.id == BLOB_STEP else value)


def slots_of(store: castore.Store, task: str) -> TaskSlots:
    return TaskSlots(store.medium, store.objects, task)


def head(store: castore.Store, task: str) -> tuple[str, castore.Snapshot, int]:
    slots = slots_of(store, task)
    seq = max(slots.present())
    data = slots.read(seq)
    snapshot = codec.from_builtins(codec.decode_value(codec.unframe(data)[1]), castore.Snapshot)
    return hash_bytes(data), snapshot, seq


def commit_seal(store: castore.Store, task: str, pack_id: str, through: int) -> str:
    """Commit a `seal` snapshot at HEAD + 1 carrying the anchor (pack, through)."""
    head_id, snapshot, seq = head(store, task)
    sealed = attrs.evolve(
        snapshot,
        seq=seq + 1,
        parent=head_id,
        transition=Transition(TransitionKind.SEAL),
        sealed=Sealed(pack_id, through),
    )
    body = codec.encode_value(codec.to_builtins(sealed))
    data = codec.frame("snapshot", body, version=snapshot_version(sealed))
    return slots_of(store, task).commit(data, seq + 1, head_id)


def mark_file(store: castore.Store, task: str) -> Path:
    """The file of the task's next mark generation (its directory made)."""
    directory = Path(store.layout.marks_dir(task))
    directory.mkdir(exist_ok=True)
    return directory / slot_name(len(os.listdir(directory)))


MARK_REL = f"tasks/t/{MARKS_DIR}/{slot_name(0)}"


def write_mark(store: castore.Store, task: str, pack: str | None, through: int) -> Path:
    path = mark_file(store, task)
    path.write_bytes(codec.encode_value({"pack": pack, "through": through}) + b"\n")
    return path


def prune(store: castore.Store, task: str, through: int, *, objects: bool = True) -> None:
    """Remove slots 0..through and (as the sealer does) their snapshot objects."""
    slots = slots_of(store, task)
    for seq in range(through + 1):
        path = Path(slots.path(seq))
        if objects:
            Path(store.objects.path(hash_bytes(path.read_bytes()))).unlink()
        path.unlink()


def seal(
    store: castore.Store,
    task: str,
    through: int,
    *,
    first: int = 0,
    prev: packs.Pack | None = None,
    mark: bool = True,
    pruned: bool = True,
) -> packs.Pack:
    """Seal slots first..through of `task` into a pack, commit the anchor, write the mark and
    prune, as a run's sealer does; the pack."""
    slots = slots_of(store, task)
    snapshots = [slots.read(seq) for seq in range(first, through + 1)]
    parent = prev.last_bytes() if prev is not None else None
    data = packs.build(snapshots, prev=prev.id if prev else None, parent=parent)
    pack_id = store.objects.put_framed(data)
    commit_seal(store, task, pack_id, through)
    if mark:
        write_mark(store, task, pack_id, through)
    if pruned:
        prune_range(store, task, first, through)
    return packs.parse(pack_id, data)


def prune_range(store: castore.Store, task: str, first: int, through: int) -> None:
    slots = slots_of(store, task)
    for seq in range(first, through + 1):
        path = Path(slots.path(seq))
        Path(store.objects.path(hash_bytes(path.read_bytes()))).unlink()
        path.unlink()


def obj_rel(object_id: str) -> str:
    return f"objects/{object_id[:2]}/{object_id}"


def slot_rel(store: castore.Store, task: str, seq: int) -> str:
    return Path(slots_of(store, task).path(seq)).relative_to(store.root).as_posix()


# ----------------------------------------------------------------------------- clean stores


@pytest.mark.parametrize("shape", ["pruned", "not-pruned", "two-packs", "no-mark-yet"])
def test_a_sealed_store_as_the_sealer_leaves_it_has_no_finding(
    store: castore.Store, shape: str
) -> None:
    """Slots pruned below the mark are not a gap (and slot 0 gone is no `no-chain`); slots
    not pruned yet agree with the pack; a chain of two packs joins; a seal committed whose
    mark is not written yet is fine."""
    start(store)
    if shape == "two-packs":
        first = seal(store, "t", 2)
        seal(store, "t", 5, first=3, prev=first)
    else:
        seal(store, "t", 4, mark=shape != "no-mark-yet", pruned=shape == "pruned")
    assert [] == [row(f) for f in fsck(store.root)]


def test_gc_keeps_the_packs_and_what_only_they_name(store: castore.Store) -> None:
    """Once the slots are pruned, the result blob of a sealed step is named only by the
    packs' refs: gc (no grace) keeps it and both packs, and removes a pack nobody names."""
    start(store)
    first = seal(store, "t", 2)
    second = seal(store, "t", 5, first=3, prev=first)
    lost = store.objects.put_framed(packs.build(first.inflate()[:2], prev=None, parent=None))
    (blob,) = first.header.refs
    report = collect(store.root, grace_s=0)
    assert [obj_rel(lost)] == report.removed
    for object_id in (first.id, second.id, blob):
        assert Path(store.objects.path(object_id)).exists()
    assert [] == [row(f) for f in fsck(store.root)]


def test_a_gap_above_the_mark_is_still_a_gap(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """Contiguity is checked above the mark's `through`, with the real sequence numbers."""
    start(store)
    seal(store, "t", 2)
    prune_range(store, "t", 4, 4)
    findings = check(
        capsys,
        store.root,
        [("slot-gap", ERROR, "tasks/t/chain", None, "t")],
        cascade=("unreachable-object",),
    )
    assert ["missing slots [4] (1 in all)"] == [f.message for f in findings if f.code == "slot-gap"]


def test_snapshot_objects_a_prune_left_are_unreachable_and_gc_removes_them(
    store: castore.Store,
) -> None:
    """A sealer that removed the slots but not yet their objects (a crash) leaves objects no
    chain names: fsck calls them unreachable, gc removes exactly those. (The last one stays:
    the first slot above the seal names it as its parent.)"""
    start(store)
    slots = slots_of(store, "t")
    left = [hash_bytes(slots.read(seq)) for seq in range(2)]
    seal(store, "t", 2, pruned=False)
    prune(store, "t", 2, objects=False)
    unreachable = sorted(f.object_id or "" for f in fsck(store.root))
    assert sorted(left) == unreachable
    assert sorted(map(obj_rel, left)) == sorted(collect(store.root, grace_s=0).removed)


# ------------------------------------------------------------------------------ pack damage


def test_a_bit_flip_in_a_pack_is_a_pack_hash_mismatch(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pack's own finding, and the HEAD slot naming it reports the sealed history as
    missing."""
    start(store)
    pack = seal(store, "t", 3)
    path = Path(store.objects.path(pack.id))
    rewrite(path, lambda data: flip_bit(data, len(data) - 5))
    head_id, _, seq = head(store, "t")
    check(
        capsys,
        store.root,
        [
            ("pack-hash-mismatch", ERROR, obj_rel(pack.id), pack.id, None),
            ("missing-object", ERROR, slot_rel(store, "t", seq), head_id, "t"),
        ],
    )


def test_a_pack_cut_short_is_pack_truncated(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A partial copy of a pack (shorter than its header says) is `pack-truncated`."""
    start(store)
    pack = seal(store, "t", 3)
    rewrite(Path(store.objects.path(pack.id)), lambda data: data[: len(data) // 2])
    check(
        capsys,
        store.root,
        [("pack-truncated", ERROR, obj_rel(pack.id), pack.id, None)],
        cascade=("missing-object",),
    )


def test_a_seal_naming_another_tasks_pack_is_pack_wrong_task(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task whose anchor names a pack of another task (spliced) is `pack-wrong-task`."""
    start(store, "t")
    start(store, "u")
    other = seal(store, "u", 3)
    commit_seal(store, "t", other.id, 3)
    check(capsys, store.root, [("pack-wrong-task", ERROR, obj_rel(other.id), other.id, "t")])


def assemble(header: packs.PackHeader, snapshots: list[bytes], index: bytes) -> bytes:
    """The framed bytes of a pack made by hand: whatever `header` says, no checks."""
    data = zlib.compress(b"".join(snapshots[:-1]))
    header = attrs.evolve(
        header,
        last_size=len(snapshots[-1]),
        index_size=len(index),
        data_size=len(data),
        raw_size=len(b"".join(snapshots[:-1])),
    )
    line = codec.encode_value(codec.to_builtins(header)) + b"\n"
    return codec.frame("pack", line + snapshots[-1] + index + data, version=2)


@pytest.mark.parametrize("forgery", ["index", "refs", "order", "last-id"])
def test_a_hash_valid_pack_whose_contents_do_not_hold_is_pack_chain_broken(
    store: castore.Store, capsys: pytest.CaptureFixture[str], forgery: str
) -> None:
    """A pack whose digest matches but whose index, refs, snapshot order or last id is not
    that of its snapshots is `pack-chain-broken` on the pack (castore never writes one)."""
    start(store)
    slots = slots_of(store, "t")
    snapshots = [slots.read(seq) for seq in range(4)]
    honest = packs.parse("0" * 64, packs.build(snapshots, prev=None, parent=None))
    header, index = honest.header, codec.encode_value({"steps": honest.index()})
    if forgery == "index":
        index = codec.encode_value({"steps": {**honest.index(), "s0": 3}})
    elif forgery == "refs":
        header = attrs.evolve(header, refs=())
    elif forgery == "order":
        snapshots = [snapshots[1], snapshots[0], *snapshots[2:]]
    else:
        snapshots = [*snapshots[:3], slots.read(5)]
    data = assemble(header, snapshots, index)
    pack_id = put_raw(store, data)
    through = 3 if forgery != "last-id" else 5
    commit_seal(store, "t", pack_id, through)
    check(
        capsys,
        store.root,
        [("pack-chain-broken", ERROR, obj_rel(pack_id), pack_id, None)],
        cascade=("missing-object",),
    )


def test_slots_that_hold_another_history_than_the_pack_are_pack_slot_disagree(
    store: castore.Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pack of the same task's range from another history (made in another store), named
    by a seal while the slots are still there: each slot of the range disagrees, and the
    slot after the range does not name the pack's last snapshot."""
    start(store, salt="here")
    elsewhere = castore.Store.init(tmp_path / "other")
    start(elsewhere, salt="there")
    foreign = packs.build(
        [slots_of(elsewhere, "t").read(seq) for seq in range(3)], prev=None, parent=None
    )
    for seq in range(3):  # its results, so that only the history differs
        blob = store.put_blob({"step": f"s{seq}", "salt": "there"}) if seq == 1 else None
        assert blob is None or blob.blob in packs.parse("0" * 64, foreign).header.refs
    pack_id = store.objects.put_framed(foreign)
    commit_seal(store, "t", pack_id, 2)
    ids = [hash_bytes(slots_of(store, "t").read(seq)) for seq in range(4)]
    expected = [
        ("pack-slot-disagree", ERROR, slot_rel(store, "t", seq), ids[seq], "t") for seq in range(3)
    ]
    expected.append(("broken-link", ERROR, slot_rel(store, "t", 3), ids[3], "t"))
    check(capsys, store.root, expected)


# ------------------------------------------------------------------------------ the mark


@pytest.mark.parametrize(
    "content",
    [b"", b"{}\n", b'{"pack":null,"through":-1}\n', b'{"pack": null, "through": 1}\n', b"\xff"],
)
def test_a_mark_that_cannot_be_read_is_sealed_mark_damaged(
    store: castore.Store, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    """An unreadable mark is an error (every reader fails closed on it), and the slots below
    HEAD are then not called a gap."""
    start(store)
    seal(store, "t", 2, mark=False)
    mark_file(store, "t").write_bytes(content)
    check(capsys, store.root, [("sealed-mark-damaged", ERROR, MARK_REL, None, "t")])


@pytest.mark.parametrize("how", ["ahead", "other-pack", "behind-other-pack", "no-anchor"])
def test_a_mark_no_durable_seal_backs_is_sealed_mark_damaged(
    store: castore.Store, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """A mark ahead of HEAD's anchor, naming another pack at the same `through` (or, behind
    it, another pack than the chain's at its `through`), or present while HEAD carries no
    seal says what no durable commit says."""
    start(store)
    if how == "no-anchor":
        pack_id, through = store.objects.put_framed(b"castore 2 raw 1\nx"), 1
    elif how == "behind-other-pack":
        first = seal(store, "t", 1, mark=False, pruned=False)
        seal(store, "t", 4, first=2, prev=first, mark=False, pruned=False)
        pack_id, through = store.put_raw(b"not the first pack").raw, 1
    else:
        pack = seal(store, "t", 2, mark=False, pruned=False)
        pack_id, through = pack.id, 2
        if how == "ahead":
            through = 3
        else:
            pack_id = store.put_raw(b"not that pack").raw
    write_mark(store, "t", pack_id, through)
    check(
        capsys,
        store.root,
        [("sealed-mark-damaged", ERROR, MARK_REL, pack_id, "t")],
        cascade=("unreachable-object",),
    )


def test_a_mark_behind_the_newest_seal_is_sealed_mark_stale(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newer seal is committed, its mark not written yet: harmless, an info."""
    start(store)
    first = seal(store, "t", 2)
    seal(store, "t", 5, first=3, prev=first, mark=False, pruned=False)
    check(capsys, store.root, [("sealed-mark-stale", INFO, MARK_REL, first.id, "t")])


def test_a_temp_file_an_interrupted_mark_write_left_is_a_temp_file(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mark is written by temp file and rename: a crash leaves the temp file in the task
    directory, which is the info `temp-file` naming the task (gc removes it), not a stranger."""
    start(store)
    seal(store, "t", 2)
    leftover = Path(store.layout.task_dir("t"), temp_name())
    leftover.write_bytes(b'{"pack":null,"through":9}\n')
    check(capsys, store.root, [("temp-file", INFO, f"tasks/t/{leftover.name}", None, "t")])


def test_gc_follows_a_pack_set_aside_under_its_temp_name(store: castore.Store) -> None:
    """A pack gc has just set aside is read under its temp name at the second read: what
    only it names (a pruned step's result blob) is put back with it."""
    start(store)
    pack = seal(store, "t", 3)
    (blob,) = pack.header.refs
    reach = Reachable(store.medium, GcReport())
    for object_id in (pack.id, blob):
        own = store.objects.path(object_id)
        reach.aside[object_id] = f"{fanout_key(object_id)}/{temp_name()}"  # a key
        Path(own).rename(store.medium.where(reach.aside[object_id]))
    reach.read_new()
    assert {pack.id, blob} <= reach.referenced
    assert False is reach.unreadable
