"""A task's chain read slot by slot, so that one damaged slot does not hide the others.

`Store.history` verifies the whole chain and refuses all of it if any link fails, which is
right for resuming. `log` and `show TASK@SEQ` are how a person looks at the damage, so when
the chain does not verify they read each slot on its own: every slot whose bytes are an
intact snapshot of this task at its place is shown, and every other one says what is wrong.
"""

from __future__ import annotations

from castore.chain.refs import TaskSlots
from castore.chain.verify import decode_snapshot
from castore.errors import (
    CastoreError,
    ChainError,
    IntegrityError,
    UnsafeFileError,
    UsageError,
)
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import MAX_SEQ, display_name
from castore.format.model import attrs
from castore.format.records import Snapshot
from castore.run.forget import tombstone_head
from castore.store import Store


@attrs.frozen
class Slot:
    """One chain slot as read on its own: its snapshot, or what is wrong with it."""

    seq: int
    path: str
    object_id: str | None = None
    snapshot: Snapshot | None = None
    problem: str | None = None


def read_slots(store: Store, task_id: str) -> list[Slot]:
    """Every slot from the highest present down to the lowest kept (0, or above the sealed
    mark: what is below was sealed into packs and pruned), newest first, each checked alone
    (a gap is a slot whose problem is "missing")."""
    slots = TaskSlots(store.medium, store.objects, task_id)
    try:
        low = slots.lowest_kept()
    except ChainError:
        low = 0  # a damaged mark: every slot there is shown, as for a chain without one
    checked: list[Slot] = []
    for seq in slots.present():
        if seq < low:
            continue  # a stray link below the mark (sealmark.py): not part of the chain
        after = checked[-1].seq + 1 if checked else low
        if seq > after:
            # One entry per gap, however long: a stray slot name far beyond HEAD must not
            # make this walk count to it.
            more = f" (and so are slots {after + 1} to {seq - 1})" if seq - after > 1 else ""
            checked.append(Slot(after, slots.path(after), problem=f"missing{more}"))
        # Oldest first: a slot is checked against its parent slot as already judged, so
        # one wrong slot is named once, not again in the slot after it.
        parent = checked[-1] if checked and checked[-1].seq == seq - 1 else None
        checked.append(_check_parent(_read_slot(store, slots, seq), parent))
    return checked[::-1]


def _read_slot(store: Store, slots: TaskSlots, seq: int) -> Slot:
    path = slots.path(seq)
    try:
        data = slots.read(seq)
    except UnsafeFileError as exc:
        return Slot(seq, path, problem=f"a {exc.found}, not a snapshot file")
    except OSError as exc:
        return Slot(seq, path, problem=f"unreadable: {exc.strerror or exc}")
    object_id = hash_bytes(data)
    try:
        snapshot = decode_snapshot(data)
    except codec.FrameError as exc:
        return Slot(seq, path, object_id, problem=exc.reason)
    except (ValueError, CastoreError) as exc:
        return Slot(seq, path, object_id, problem=f"not a valid snapshot: {exc}")
    problem = _misplaced(store, slots, seq, object_id, snapshot)
    return Slot(seq, path, object_id, None if problem else snapshot, problem)


def _misplaced(
    store: Store, slots: TaskSlots, seq: int, object_id: str, snapshot: Snapshot
) -> str | None:
    # The slot is a hard link to its object: bytes that hash to no stored object were
    # changed after they were written, unless a power loss took the name (v2).
    if not store.objects.exists(object_id) and not _lost_name(store, slots, seq, object_id):
        return "damaged: its bytes match no stored object"
    if (snapshot.task, snapshot.seq) != (slots.task_id, seq):
        return f"holds snapshot {snapshot.seq} of task {snapshot.task!r}"
    return None


def _lost_name(store: Store, slots: TaskSlots, seq: int, object_id: str) -> bool:
    """In a v2 store a power loss may take a snapshot's object name (FORMAT.md §13, "A lost
    snapshot name"): the slot's bytes stand if the next slot names them as its parent, or if
    there is no next slot (HEAD, judged by its decoding, as resume judges it)."""
    if store.format_version < 2:
        return False  # a v1 writer made every name durable before its slot
    if not slots.exists(seq + 1):
        return True
    try:
        return decode_snapshot(slots.read(seq + 1)).parent == object_id
    except (OSError, ValueError, CastoreError):
        return False  # a next slot that cannot be read vouches for nothing


def _check_parent(slot: Slot, older: Slot | None) -> Slot:
    """A readable slot whose parent is not the readable slot before it is broken too."""
    if slot.snapshot is None or older is None or older.object_id is None or older.problem:
        return slot
    if slot.snapshot.parent != older.object_id:
        return attrs.evolve(
            slot,
            snapshot=None,
            problem=f"its parent is {slot.snapshot.parent}, slot {older.seq} holds "
            f"{older.object_id}",
        )
    return slot


def slot_line(slot: Slot) -> str:
    """What is wrong with a slot, as `log` prints it in the slot's place."""
    # A problem may quote a damaged file's bytes (an exception's text): one line, whatever.
    return f"slot {slot.seq}: {display_name(str(slot.problem))} (run `castore fsck`)"


def snapshot_at(store: Store, task_id: str, seq: int) -> tuple[str, str | None]:
    """The id of task `task_id`'s snapshot `seq`, and what is broken elsewhere in its chain
    (None if the chain verifies): an intact slot is found even in a broken chain."""
    try:
        history = store.history(task_id)
    except ChainError as exc:
        tombstone = reclaimed_tombstone(store, task_id)
        if tombstone is None:
            return _intact_slot(store, task_id, seq), chain_note(task_id, exc)
        if seq == tombstone.seq and tombstone.object_id is not None:
            return tombstone.object_id, None
        raise _no_snapshot(task_id, seq, tombstone.seq, reclaimed=seq < tombstone.seq) from None
    for snapshot_id, snapshot in history:
        if snapshot.seq == seq:
            return snapshot_id, None
    raise _no_snapshot(task_id, seq, history[0][1].seq if history else None)


def reclaimed_tombstone(store: Store, task_id: str) -> Slot | None:
    """The tombstone of a forgotten task whose history gc reclaimed (its slot, as log shows
    it); None if HEAD is no tombstone, or the older slots are still there to show."""
    slots = TaskSlots(store.medium, store.objects, task_id)
    try:
        found = tombstone_head(slots)
    except ChainError:
        return None
    if found is None or slots.exists(0):
        return None
    seq = found.head.seq
    return Slot(seq, slots.path(seq), found.head_id, found.head)


def _intact_slot(store: Store, task_id: str, seq: int) -> str:
    """Slot `seq` read on its own, and checked against slot `seq - 1` as its parent."""
    slots = TaskSlots(store.medium, store.objects, task_id)
    if seq > MAX_SEQ or not slots.exists(seq):
        raise _no_snapshot(task_id, seq, None)
    slot = _read_slot(store, slots, seq)
    if seq > 0 and slots.exists(seq - 1):
        slot = _check_parent(slot, _read_slot(store, slots, seq - 1))
    if slot.object_id is None or slot.problem is not None:
        raise IntegrityError(
            f"task {task_id!r}: slot {seq} ({slot.path}): {slot.problem}; "
            f"run `castore fsck --task {task_id}`",
            slot.path,
            slot.object_id or "",
        )
    return slot.object_id


def _no_snapshot(
    task_id: str, seq: int, head: int | None, *, reclaimed: bool = False
) -> UsageError:
    if reclaimed:
        return UsageError(
            f"task {task_id!r} was forgotten, and `castore gc` reclaimed its history below "
            f"the tombstone (seq {head}): snapshot {seq} is gone for good; only the tombstone "
            f"is left (`castore show {task_id}@{head}`)"
        )
    last = f" (its HEAD is snapshot {head})" if head is not None else ""
    return UsageError(f"task {task_id!r} has no snapshot {seq}{last}; see `castore log {task_id}`")


def chain_note(task_id: str, error: ChainError) -> str:
    """One line on what breaks a task's chain, for a view that showed what it could."""
    return (
        f"task {task_id!r}: chain does not verify: {error.reason}; "
        f"run `castore fsck --task {task_id}` for the details"
    )
