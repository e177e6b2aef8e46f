"""Sealing (format v2): runs seal as they go, readers verify through packs, and every way a
sealed history can be forged or damaged is refused."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest
from helpers import flip_bit, rewrite
from sealing import EVERY, framed_history, plan_of, rechain, run_steps, seal_often, v2_store

import castore
from castore.chain import packs
from castore.chain.verify import extend_head, verified_head, verify_head
from castore.errors import ChainError
from castore.format.digest import hash_bytes
from castore.format.records import Sealed, Snapshot, TransitionKind
from castore.maintenance.sealing import seal_task

pytestmark = pytest.mark.usefixtures(seal_often.__name__)
TASK = "long"


@pytest.fixture
def v2(tmp_path: Path) -> castore.Store:
    return v2_store(tmp_path / "v2")


def pack_ranges(chain: castore.VerifiedChain) -> list[tuple[int, int]]:
    return [(ref.first_seq, ref.last_seq) for ref in chain.outcomes.pack_refs]


def test_a_run_seals_every_n_commits_and_the_next_commit_names_the_pack(
    v2: castore.Store,
) -> None:
    """After 20 commits (seal every 8), HEAD carries the anchor of seq 0..15 in two packs,
    and verification goes through them."""
    run_steps(v2, TASK, plan_of(40), 20)
    chain = v2.verify(TASK)
    assert 20 == chain.head.seq
    assert [(8, 15), (0, 7)] == pack_ranges(chain)
    assert chain.head.sealed is not None
    assert 15 == chain.head.sealed.through
    assert 21 == chain.length


def test_a_finished_task_is_sealed_whole_by_one_seal_commit(v2: castore.Store) -> None:
    """A run that finishes its plan commits one SEAL at close: everything before it packed."""
    run_steps(v2, TASK, plan_of(13))
    chain = v2.verify(TASK)
    assert TransitionKind.SEAL == chain.head.transition.kind
    assert Sealed(chain.outcomes.pack_refs[0].id, 13) == chain.head.sealed
    assert [(8, 13), (0, 7)] == pack_ranges(chain)
    assert 13 == len(chain.outcomes)


def test_resuming_a_sealed_task_gives_the_outcomes_sealed_in_packs(v2: castore.Store) -> None:
    """Results of steps that live only in packs come back from resume, blobs included."""
    plan = plan_of(30)
    run_steps(v2, TASK, plan, 25)
    with v2.resume(TASK, plan) as run:
        assert "s0" == run.result("s0")
        assert {"step": "s4"} == run.result("s4")
        assert run.done("s12")
        assert not run.done("s25")
        assert 13 == run.outcome("s12").seq


def test_a_run_seals_its_own_commits_from_their_records_and_decodes_only_what_it_read(
    v2: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sealer checks the links of the snapshots this run committed on the records they
    were encoded from; only the tail read at resume, and each pack's parent, are decoded.
    The packs verify as any pack does."""
    decoded: list[int] = []
    decode = packs.decode_snapshot

    def counting(task: str, object_id: str, data: bytes) -> Snapshot:
        snapshot = decode(task, object_id, data)
        decoded.append(snapshot.seq)
        return snapshot

    monkeypatch.setattr(packs, "decode_snapshot", counting)
    plan = plan_of(40)
    run_steps(v2, TASK, plan, 5)  # seq 0..5: the tail the next run reads at resume
    run_steps(v2, TASK, plan, 14)  # seq 6..19: packs of 0..7 and 8..15
    # Pack 0..7: seq 0..5 read back at resume, 6..7 this run's; pack 8..15: its parent, 7.
    assert [0, 1, 2, 3, 4, 5, 7] == sorted(decoded)
    assert [(8, 15), (0, 7)] == pack_ranges(v2.verify(TASK))


def test_seal_task_seals_an_unsealed_history(tmp_path: Path) -> None:
    """A task written where nothing seals (v1 marker), then sealed by seal_task once the
    store is v2: a SEAL commit anchors every snapshot before it; sealing again is a no-op."""
    store = castore.Store.init(tmp_path / "s")
    Path(store.layout.marker).write_bytes(b'{"format":"castore","version":1}\n')
    store = castore.Store.open(store.root)
    run_steps(store, TASK, plan_of(30), 19)
    assert store.verify(TASK).head.sealed is None
    Path(store.layout.marker).write_bytes(b'{"format":"castore","version":2}\n')
    store = castore.Store.open(store.root)
    report = seal_task(store, TASK)
    chain = store.verify(TASK)
    assert (chain.head_id, Sealed(report.packs[-1], 19)) == (report.snapshot_id, chain.head.sealed)
    assert [(16, 19), (8, 15), (0, 7)] == pack_ranges(chain)
    again = seal_task(store, TASK)  # HEAD is that SEAL already: nothing is written
    assert ((), chain.head.sealed, None) == (again.packs, again.anchor, again.snapshot_id)
    assert chain.head_id == store.verify(TASK).head_id


def test_a_v1_store_never_seals(tmp_path: Path) -> None:
    """A store whose marker says version 1 gets nothing v1 cannot read: no pack, no anchor,
    every snapshot framed as version 1."""
    store = castore.Store.init(tmp_path / "s")
    Path(store.layout.marker).write_bytes(b'{"format":"castore","version":1}\n')
    store = castore.Store.open(store.root)
    run_steps(store, TASK, plan_of(20))
    slots = store._slots(TASK)
    assert all(slots.read(seq).startswith(b"castore 1 snapshot") for seq in range(21))
    assert [] == pack_ranges(store.verify(TASK))


def test_only_snapshots_with_an_anchor_are_framed_as_version_2(v2: castore.Store) -> None:
    """Before the first seal snapshots keep v1 bytes; from the commit naming a pack on, v2."""
    run_steps(v2, TASK, plan_of(20), 12)
    headers = [data[:9] for data in framed_history(v2, TASK)]
    assert 13 == len(headers)
    first_anchored = next(s for s in range(13) if headers[s] == b"castore 2")
    assert [b"castore 1"] * first_anchored == headers[:first_anchored]
    assert first_anchored >= EVERY


def test_status_and_watch_extension_work_through_a_seal(v2: castore.Store) -> None:
    """verify_head reads a HEAD with an anchor; extend_head crosses a seal landing."""
    plan = plan_of(40)
    run_steps(v2, TASK, plan, 5)
    slots = v2._slots(TASK)
    known = verified_head(v2.verify(TASK))
    run_steps(v2, TASK, plan, 14)
    extended = extend_head(v2.objects, slots, known)
    assert (v2.verify(TASK).head_id, 19) == (extended.head_id, extended.head.seq)
    assert extended.head.sealed is not None
    assert verify_head(slots).head_id == extended.head_id


# -- a sealed history that is damaged or forged ---------------------------------------------


@pytest.fixture
def sealed(v2: castore.Store) -> castore.Store:
    """A task of 20 commits: packs 0..7 and 8..15, a tail of 16..20."""
    run_steps(v2, TASK, plan_of(40), 20)
    return v2


def newest_pack(store: castore.Store) -> str:
    return store.verify(TASK).outcomes.pack_refs[0].id


def test_a_pack_whose_bytes_changed_is_refused(sealed: castore.Store) -> None:
    """One bit flipped in a pack: its hash no longer matches; resume says which pack."""
    pack_id = newest_pack(sealed)
    rewrite(Path(sealed.objects.path(pack_id)), flip_bit)
    with pytest.raises(ChainError, match=f"pack {pack_id}"):
        sealed.resume(TASK, plan_of(40))


@pytest.mark.parametrize("damage", ["missing", "truncated", "older-missing"])
def test_a_missing_or_truncated_pack_is_refused(sealed: castore.Store, damage: str) -> None:
    """The newest pack gone or cut short, or the older one gone: a ChainError naming it."""
    refs = sealed.verify(TASK).outcomes.pack_refs
    pack_id = refs[1].id if damage == "older-missing" else refs[0].id
    path = sealed.objects.path(pack_id)
    if damage == "truncated":
        rewrite(Path(path), lambda data: data[: len(data) // 2])
    else:
        os.unlink(path)
    with pytest.raises(ChainError, match=pack_id):
        sealed.verify(TASK)


def test_a_pack_spliced_from_another_task_is_refused(sealed: castore.Store) -> None:
    """The tail rewritten to name task B's pack (same range, same plan): refused by task."""
    run_steps(sealed, "other", plan_of(40), 20)
    other = sealed.verify("other")
    foreign = other.outcomes.pack_refs[0].id
    last_id = packs.parse(foreign, sealed.objects.read(foreign)).header.last_id
    rechain(
        sealed,
        TASK,
        16,
        lambda s: attrs.evolve(
            s, sealed=Sealed(foreign, 15), parent=last_id if s.seq == 16 else s.parent
        ),
    )
    with pytest.raises(ChainError, match="of task 'other'"):
        sealed.verify(TASK)


def test_a_tail_whose_parent_is_not_the_packs_last_is_refused(sealed: castore.Store) -> None:
    """The oldest tail snapshot names another parent than the pack's last id."""
    rechain(sealed, TASK, 16, lambda s: attrs.evolve(s, parent="e" * 64) if s.seq == 16 else s)
    with pytest.raises(ChainError, match="ends at snapshot"):
        sealed.verify(TASK)


def test_an_anchor_naming_the_wrong_through_is_refused(sealed: castore.Store) -> None:
    """HEAD's anchor claims the pack ends at 14: the walk then needs snapshot 15 link by
    link, which only the pack holds (its object was pruned), and refuses the chain."""
    anchor = sealed.verify(TASK).head.sealed
    assert anchor is not None
    rechain(sealed, TASK, 16, lambda s: attrs.evolve(s, sealed=Sealed(anchor.pack, 14)))
    with pytest.raises(ChainError, match="at slot 15"):
        sealed.verify(TASK)


def test_an_anchor_dropped_or_moved_back_in_the_tail_is_refused(sealed: castore.Store) -> None:
    """A tail snapshot that drops the anchor its parent carries: a forged history."""
    head = sealed.verify(TASK).head.seq
    rechain(sealed, TASK, head, lambda s: attrs.evolve(s, sealed=None))
    with pytest.raises(ChainError, match="drops or moves back"):
        sealed.verify(TASK)


def test_a_pack_whose_prev_holds_another_range_is_refused(sealed: castore.Store) -> None:
    """A forged newest pack (valid bytes, a new id) whose prev names a pack that does not
    end where it starts: the walk refuses the link between the packs."""
    chain = sealed.verify(TASK)
    newest, older = chain.outcomes.pack_refs
    pack = packs.parse(newest.id, sealed.objects.read(newest.id))
    slots_data = pack.inflate()
    # Sealed again from seq 9 only: first_parent (seq 8) is not the prev pack's last (seq 7).
    forged = packs.build(slots_data[1:], prev=older.id, parent=slots_data[0])
    forged_id = sealed.objects.put_framed(forged)
    rechain(sealed, TASK, 16, lambda s: attrs.evolve(s, sealed=Sealed(forged_id, 15)))
    with pytest.raises(ChainError, match=f"names prev {older.id}"):
        sealed.verify(TASK)


def test_the_sealed_history_hashes_the_same_whatever_reads_it(sealed: castore.Store) -> None:
    """history() lists every snapshot, sealed or not, with ids that hash its bytes."""
    history = sealed.history(TASK)
    assert list(range(20, -1, -1)) == [snapshot.seq for _, snapshot in history]
    assert all(snapshot.parent == history[i + 1][0] for i, (_, snapshot) in enumerate(history[:-1]))
    assert hash_bytes(sealed._slots(TASK).read(20)) == history[0][0]


def test_outcomes_of_sealed_steps_are_read_from_pack_indexes_on_demand(
    sealed: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verified chain holds the tail's outcomes only; a sealed step is found through its
    pack's index (read once, then cached), and a step done nowhere costs one pass."""
    chain = sealed.verify(TASK)
    reads: list[str] = []
    real_read = sealed.objects.read

    def counting(object_id: str) -> bytes:
        reads.append(object_id)
        return real_read(object_id)

    monkeypatch.setattr(sealed.objects, "read", counting)
    newest, older = chain.outcomes.pack_refs
    assert 3 == chain.outcomes["s2"].seq  # in the older pack
    assert "s2" == chain.outcomes["s2"].result
    assert 19 == chain.outcomes["s18"].seq  # in the tail: no read
    assert "s30" not in chain.outcomes
    assert "s30" not in chain.outcomes  # the miss is remembered: no second pass
    assert {newest.id, older.id} == set(reads)
    assert len(reads) == len(set(reads)) + 1  # the older pack twice: index, then data
    assert {f"s{i}" for i in range(20)} == set(chain.outcomes)


def test_a_pack_damaged_after_the_walk_is_refused_when_read(sealed: castore.Store) -> None:
    """Outcomes read later re-hash the pack: a pack changed since the walk is a ChainError."""
    chain = sealed.verify(TASK)
    pack_id = chain.outcomes.pack_refs[1].id
    rewrite(Path(sealed.objects.path(pack_id)), flip_bit)
    with pytest.raises(ChainError, match=pack_id):
        chain.outcomes.get("s2")
