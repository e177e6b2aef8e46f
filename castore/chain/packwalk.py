"""Verifying a task's sealed history: from the anchor its tail ends at, pack by pack via `prev`
down to sequence 0 (docs/FORMAT.md 11.2).

Each pack is read by the id a verified snapshot (or a verified pack's `prev`) names, so its
hash proves its bytes are the ones its sealer checked link by link. What is checked here is
how the packs fit: the task, the sequence ranges, each pack's last id against the parent its
successor names, the link rules between the newest pack's last snapshot and the tail, and
every anchor the tail names being one of the packs walked.
"""

from __future__ import annotations

from castore.chain import packs
from castore.chain.objects import ObjectStore
from castore.chain.outcomes import PackRef
from castore.errors import CastoreError, ChainError, FormatVersionError, StoreIOError
from castore.format.digest import hash_bytes
from castore.format.effects import ChainClock
from castore.format.links import check_anchor, check_history, check_link, decode_snapshot
from castore.format.model import attrs
from castore.format.records import Sealed, Snapshot


@attrs.frozen
class SealedHistory:
    """What the walk of the packs found: the plan root, the packs newest first, the clock of
    the whole chain, and the newest pack's last snapshot (the parent of the tail's oldest)."""

    root_plan: str
    packs: tuple[PackRef, ...]
    clock: ChainClock
    last_bytes: bytes


def merge_clocks(newer: ChainClock, older: ChainClock) -> ChainClock:
    """The clock of two adjacent ranges, as one newest-first walk over both would compute it
    (on a tie the newer range's snapshot is the one named)."""
    clock = newer
    if older.latest_ms is not None and (
        clock.latest_ms is None or older.latest_ms > clock.latest_ms
    ):
        clock = attrs.evolve(clock, latest_ms=older.latest_ms, latest_seq=older.latest_seq)
    if older.backwards_ms > clock.backwards_ms:
        clock = attrs.evolve(
            clock, backwards_ms=older.backwards_ms, backwards_seq=older.backwards_seq
        )
    return clock


def read_pack(objects: ObjectStore, task_id: str, pack_id: str) -> packs.Pack:
    """A pack by its id, hash-checked and parsed; ChainError naming it if it does not hold."""
    try:
        return packs.parse(pack_id, objects.read(pack_id), objects.path(pack_id))
    except (FormatVersionError, StoreIOError):
        raise
    except CastoreError as exc:
        raise ChainError(task_id, f"pack {pack_id}: {exc}", object_id=pack_id) from exc


def verify_sealed(
    objects: ObjectStore,
    task_id: str,
    anchor: Sealed,
    oldest: tuple[str, Snapshot],
    *,
    clock: ChainClock,
    named: set[Sealed],
) -> SealedHistory:
    """The packs below the tail whose oldest snapshot is `oldest` (id, record) and whose
    anchor is `anchor`; `clock` is the tail's; `named` are the anchors the tail carries,
    each of which must be a pack of this history."""
    pack = read_pack(objects, task_id, anchor.pack)
    header = pack.header
    oldest_id, child = oldest
    if header.task != task_id or header.last_seq != anchor.through:
        raise ChainError(
            task_id,
            f"pack {pack.id} holds sequence {header.first_seq}..{header.last_seq} of task "
            f"{header.task!r}; the anchor names it as this task's through {anchor.through}",
            object_id=pack.id,
        )
    if header.last_id != child.parent:
        raise ChainError(
            task_id,
            f"pack {pack.id} ends at snapshot {header.last_id}, but sequence {child.seq} "
            f"names parent {child.parent}",
            object_id=pack.id,
            seq=child.seq,
        )
    # The link from the sealed history into the tail, as the walk checks every other link.
    check_link(task_id, header.last_id, pack.last, header.last_seq, child)
    check_history(task_id, pack.last, child, oldest_id)
    check_anchor(task_id, pack.last, child, oldest_id)
    clock = clock.linked(pack.last.time_ms, child.seq, child.time_ms)
    last_bytes = pack.last_bytes()
    found: list[PackRef] = []
    walked: set[Sealed] = set()
    named = set(named)
    while True:
        header = pack.header
        found.append(PackRef(pack.id, header.first_seq, header.last_seq))
        walked.add(Sealed(pack.id, header.last_seq))
        if pack.last.sealed is not None:
            named.add(pack.last.sealed)
        clock = merge_clocks(clock, header.clock)
        if header.prev is None:
            break
        older = read_pack(objects, task_id, header.prev)
        _check_adjacent(task_id, older, pack)
        pack = older
    root_plan = _check_root(task_id, pack)
    stray = sorted(named - walked, key=lambda sealed: sealed.through)
    if stray:
        raise ChainError(
            task_id,
            f"a snapshot names pack {stray[0].pack} through {stray[0].through}, which is not "
            "one of the packs of this task's sealed history",
            object_id=stray[0].pack,
        )
    return SealedHistory(root_plan, tuple(found), clock, last_bytes)


def _check_adjacent(task_id: str, older: packs.Pack, newer: packs.Pack) -> None:
    """`older` (named by `newer`'s prev) holds the range just before `newer`'s, of this task,
    ending at the snapshot `newer`'s first names as its parent."""
    old, new = older.header, newer.header
    if old.task != task_id or old.last_seq + 1 != new.first_seq or old.last_id != new.first_parent:
        raise ChainError(
            task_id,
            f"pack {newer.id} (sequence {new.first_seq}..{new.last_seq}) names prev {older.id}, "
            f"which holds sequence {old.first_seq}..{old.last_seq} of task {old.task!r} ending "
            f"at {old.last_id}, not the parent {new.first_parent} of sequence {new.first_seq}",
            object_id=older.id,
        )


def _check_root(task_id: str, pack: packs.Pack) -> str:
    """The plan root: the plan of sequence 0, the first snapshot of the oldest pack."""
    first_bytes = pack.first_bytes()
    first_id = hash_bytes(first_bytes)
    try:
        first = decode_snapshot(task_id, first_id, first_bytes)
        check_link(task_id, first_id, first, 0, None)
    except ChainError as exc:
        raise ChainError(
            task_id, f"pack {pack.id}: its first snapshot: {exc.reason}", object_id=pack.id
        ) from exc
    if first.plan not in pack.header.plans:
        raise ChainError(
            task_id,
            f"pack {pack.id} starts with plan {first.plan}, not in its plans",
            object_id=pack.id,
        )
    return first.plan
