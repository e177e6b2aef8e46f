"""Format v3: each pack lists the packs below it, so a resume verifies one pack, not a walk
of `prev` (docs/FORMAT.md 7.5, 11.2 step 5b); a damaged or forged list is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from sealing import EVERY, plan_of, run_steps, seal_often, v2_store

import castore
from castore.chain import packs
from castore.chain.objects import ObjectStore
from castore.chain.packhistory import PackEntry
from castore.chain.verify import verify_chain
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.plans import plan_id

__all__ = ["seal_often"]  # a fixture, used by name

STEPS = 70  # with EVERY = 8: eight packs and a tail


def _store(tmp_path: Path) -> castore.Store:
    store = castore.Store.init(tmp_path / "store")
    assert 3 == store.format_version
    return store


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the objects read through ObjectStore.read from now on."""
    read: list[str] = []
    original = ObjectStore.read

    def counting(self: ObjectStore, object_id: str) -> bytes:
        read.append(object_id)
        return original(self, object_id)

    monkeypatch.setattr(ObjectStore, "read", counting)
    return read


def _anchor_pack(store: castore.Store, task: str) -> packs.Pack:
    chain = verify_chain(store.objects, store._slots(task))
    assert chain.head.sealed is not None
    pack_id = chain.head.sealed.pack
    return packs.parse(pack_id, store.objects.read(pack_id))


def test_a_v3_pack_lists_every_pack_below_it(tmp_path: Path, seal_often: int) -> None:
    """The anchor's pack is framed as version 3 and lists the packs its prev reaches, oldest
    first, from sequence 0 to just before its own first, with the plan root."""
    store = _store(tmp_path)
    plan = plan_of(STEPS + 10)
    run_steps(store, "t", plan, STEPS)
    pack = _anchor_pack(store, "t")
    raw = store.objects.read(pack.id)
    history = pack.header.history
    assert raw.startswith(b"castore 3 pack ")
    assert history is not None
    listed = [entry.id for entry in history.packs]
    walked, prev = [], pack.header.prev
    while prev is not None:  # the same packs, by prev
        walked.append(prev)
        prev = packs.parse(prev, store.objects.read(prev)).header.prev
    assert list(reversed(walked)) == listed
    ends = (history.packs[0].first_seq, history.packs[-1].last_seq)
    assert (0, pack.header.first_seq - 1) == ends
    assert plan_id(plan) == history.root_plan


def test_a_resume_reads_the_anchor_pack_alone(
    tmp_path: Path, seal_often: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifying a v3 chain reads one pack (the anchor's), however many there are; a sealed
    step's outcome is then read from its own pack, hash-checked."""
    store = _store(tmp_path)
    plan = plan_of(STEPS + 10)
    run_steps(store, "t", plan, STEPS)
    pack = _anchor_pack(store, "t")
    assert pack.header.history is not None
    listed = {entry.id for entry in pack.header.history.packs}
    assert len(listed) >= 5
    read = _reads(monkeypatch)
    chain = verify_chain(store.objects, store._slots("t"), keep_tail=True)
    assert [pack.id] == [oid for oid in read if oid in listed | {pack.id}]
    with store.resume("t", plan):  # and the oldest, for its first snapshot's fork (fork.py)
        assert {pack.id, pack.header.history.packs[0].id} == set(read) & (listed | {pack.id})
    assert STEPS == chain.head.frontier.index
    with store.resume("t", plan) as run:
        assert "s0" == run.result("s0")
        assert {"step": "s4"} == run.result("s4")


def test_a_v3_task_resumes_and_seals_on_where_it_stood(tmp_path: Path, seal_often: int) -> None:
    """Runs across resumes keep listing: the newest pack lists every older one, and the
    task finishes with every outcome readable."""
    store = _store(tmp_path)
    plan = plan_of(STEPS)
    for count in (13, 21, 17):
        run_steps(store, "t", plan, count)
    run_steps(store, "t", plan)  # finishes, sealed whole
    pack = _anchor_pack(store, "t")
    assert pack.header.history is not None
    assert 0 == pack.header.history.packs[0].first_seq
    with store.resume("t", plan) as run:
        assert [f"s{i}" for i in range(0, STEPS, 5)] == [
            f"s{i}" for i in range(0, STEPS, 5) if run.done(f"s{i}")
        ]
        assert "s7" == run.result("s7")


def test_a_damaged_anchor_pack_is_refused(tmp_path: Path, seal_often: int) -> None:
    """One byte of the anchor's pack changed: the resume refuses the chain (ChainError)."""
    store = _store(tmp_path)
    plan = plan_of(STEPS + 10)
    run_steps(store, "t", plan, STEPS)
    pack = _anchor_pack(store, "t")
    path = Path(store.objects.path(pack.id))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(castore.ChainError, match=pack.id):
        store.resume("t", plan)


def test_a_damaged_listed_pack_is_refused_when_read(tmp_path: Path, seal_often: int) -> None:
    """A listed pack is not read by the resume; a step it holds is, and its damage is then
    refused as a broken chain, never returned. (The oldest pack is read by every resume of
    a sealed task, for its first snapshot's fork: the second oldest is damaged here.)"""
    store = _store(tmp_path)
    plan = plan_of(STEPS + 10)
    run_steps(store, "t", plan, STEPS)
    pack = _anchor_pack(store, "t")
    assert pack.header.history is not None
    oldest = pack.header.history.packs[1]
    path = Path(store.objects.path(oldest.id))
    data = bytearray(path.read_bytes())
    data[-3] ^= 1
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with store.resume("t", plan) as run, pytest.raises(castore.ChainError, match=oldest.id):
        run.result(f"s{oldest.first_seq + 1}")
    codes = {f.code for f in castore.maintenance.fsck.check_store(store.root, jobs=1)}
    # fsck finds it (its pack-specific code names v2 packs only so far: either code is it).
    assert {"pack-hash-mismatch", "hash-mismatch"} & codes


def _rebuilt(pack: packs.Pack, raw: bytes, **history: object) -> bytes:
    """`raw` (a v3 pack) with its header's history fields replaced (the hash changes)."""
    kind, body = codec.unframe(raw)
    line, rest = body.split(b"\n", 1)
    value = codec.decode_value(line)
    value["history"] = {**value["history"], **history}
    return codec.frame(kind, codec.encode_value(value) + b"\n" + rest, 3)


@pytest.mark.parametrize(
    "change",
    ["gap", "wrong-prev", "wrong-parent", "not-from-zero", "bad-id", "dropped", "v2-header"],
)
def test_a_forged_list_is_refused(tmp_path: Path, seal_often: int, change: str) -> None:
    """A list that does not run from 0 to the pack's first sequence, or does not end at its
    prev and first parent, or a v3 header without it (or a v2 one with it), is no pack."""
    store = _store(tmp_path)
    run_steps(store, "t", plan_of(STEPS + 10), STEPS)
    pack = _anchor_pack(store, "t")
    raw = store.objects.read(pack.id)
    assert pack.header.history is not None
    entries = [codec.to_builtins(e) for e in pack.header.history.packs]
    if change == "gap":
        entries[1]["first_seq"] += 1
        forged = _rebuilt(pack, raw, packs=entries)
    elif change == "wrong-prev":
        entries[-1]["id"] = "0" * 64
        forged = _rebuilt(pack, raw, packs=entries)
    elif change == "wrong-parent":
        entries[-1]["last_id"] = "1" * 64
        forged = _rebuilt(pack, raw, packs=entries)
    elif change == "not-from-zero":
        forged = _rebuilt(pack, raw, packs=entries[1:])
    elif change == "bad-id":
        forged = _rebuilt(pack, raw, root_plan="not an id")
    elif change == "dropped":
        kind, body = codec.unframe(raw)
        line, rest = body.split(b"\n", 1)
        value = codec.decode_value(line)
        del value["history"]
        forged = codec.frame(kind, codec.encode_value(value) + b"\n" + rest, 3)
    else:
        forged = raw.replace(b"castore 3 pack", b"castore 2 pack", 1)
    with pytest.raises(castore.ObjectCorruptError):
        packs.parse(hash_bytes(forged), forged)


def test_a_v2_store_seals_v2_packs_and_an_upgrade_lists_them(
    tmp_path: Path, seal_often: int
) -> None:
    """A v2 store's runs write v2 packs (nothing a v2 reader cannot read); after `castore
    upgrade` the task's next pack lists those v2 packs, and the chain verifies."""
    store = v2_store(tmp_path / "store")
    plan = plan_of(STEPS + 40)
    run_steps(store, "t", plan, STEPS)
    old = _anchor_pack(store, "t")
    assert old.header.history is None
    report = castore.maintenance.upgrade.upgrade(store.root)
    assert (2, 3) == (report.from_version, report.to_version)
    store = castore.Store.open(store.root)
    run_steps(store, "t", plan, 3 * EVERY)
    new = _anchor_pack(store, "t")
    assert new.header.history is not None
    assert old.id in {entry.id for entry in new.header.history.packs}
    assert isinstance(new.header.history.packs[0], PackEntry)
    with store.resume("t", plan) as run:
        assert "s3" == run.result("s3")
