"""The rules for one link of a chain: a snapshot's bytes as its record, and what must hold
between a snapshot and its successor. The walk (verify), the sealer (packs) and the
extension (watch) apply exactly these, so they cannot drift apart."""

from __future__ import annotations

from castore.errors import ChainError, IllegalHistoryError
from castore.format import codec
from castore.format.fastdecode import decode_canonical
from castore.format.history import illegal_changes
from castore.format.records import Snapshot, TransitionKind


def decode_snapshot(task_id: str, object_id: str, data: bytes) -> Snapshot:
    """A snapshot object as its record; ChainError naming what is wrong with it."""
    try:
        kind, body = codec.unframe(data, object_id)
    except codec.FrameError as exc:
        raise ChainError(
            task_id, f"snapshot {object_id}: {exc.reason}", object_id=object_id
        ) from None
    if kind != "snapshot":
        raise ChainError(task_id, f"{object_id} is a {kind}, not a snapshot", object_id=object_id)
    fast = decode_canonical(body, Snapshot)  # every body castore writes takes this path
    if fast is not None:
        return fast
    try:
        decoded = codec.decode_value(body)
    except ValueError:
        raise ChainError(
            task_id, f"snapshot {object_id} does not decode", object_id=object_id
        ) from None
    if not isinstance(decoded, dict):
        raise ChainError(task_id, f"snapshot {object_id} is not a record", object_id=object_id)
    for name, types in LINK_FIELDS.items():
        if name not in decoded or type(decoded[name]) not in types:
            raise ChainError(
                task_id, f"snapshot {object_id} lacks a valid {name!r} field", object_id=object_id
            )
    try:
        return codec.from_builtins(decoded, Snapshot)
    except Exception as exc:
        raise ChainError(
            task_id,
            f"snapshot {object_id} is not a valid snapshot record: {exc}",
            object_id=object_id,
        ) from exc


def check_history(task_id: str, parent: Snapshot, child: Snapshot, child_id: str) -> None:
    """The same rules fsck applies (`illegal-transition`): an intact but forged link (an
    effect back to PLANNED, say) would otherwise make resume send it again."""
    problems = illegal_changes(parent, child)
    if problems:
        raise IllegalHistoryError(task_id, child.seq, child_id, problems)


# The fields the walk relies on, with their exact JSON types (full schema checks: fsck).
LINK_FIELDS: dict[str, tuple[type, ...]] = {
    "task": (str,),
    "seq": (int,),
    "parent": (str, type(None)),
    "plan": (str,),
    "transition": (dict,),
}


def check_link(
    task_id: str, object_id: str, entry: Snapshot, seq: int, child: Snapshot | None
) -> None:
    is_start = entry.transition.kind is TransitionKind.START
    if is_start != (seq == 0):
        raise ChainError(
            task_id,
            f"snapshot {object_id} at sequence {seq} records "
            f"{'a start' if is_start else 'no start'}; only sequence 0 starts a task",
            object_id=object_id,
        )
    if entry.task != task_id:
        raise ChainError(
            task_id, f"snapshot {object_id} belongs to task {entry.task!r}", object_id=object_id
        )
    if entry.seq != seq:
        raise ChainError(
            task_id,
            f"snapshot {object_id} has sequence {entry.seq}, expected {seq}",
            object_id=object_id,
        )
    if (entry.parent is None) != (seq == 0):
        raise ChainError(
            task_id,
            f"snapshot {object_id} at sequence {seq} has parent {entry.parent}",
            object_id=object_id,
        )
    if child is not None and entry.plan != child.plan:
        transition = child.transition
        if transition.kind is not TransitionKind.OVERRIDE or transition.replaced != entry.plan:
            raise ChainError(
                task_id,
                f"snapshot {object_id} names plan {entry.plan}, its child names {child.plan}",
                object_id=object_id,
            )


def check_anchor(task_id: str, parent: Snapshot, child: Snapshot, child_id: str) -> None:
    """The `sealed` anchor (v2) is carried forward or replaced by a newer one, always below the
    snapshot's own sequence number: a child that drops or moves back its parent's anchor would
    let a reader skip verified history, or trust a pack no writer checked against the chain."""
    old, new = parent.sealed, child.sealed
    if new is not None and new.through >= child.seq:
        raise ChainError(
            task_id,
            f"snapshot {child_id} names a seal through {new.through}, not below its own "
            f"sequence {child.seq}",
            object_id=child_id,
            seq=child.seq,
        )
    if old is None:
        return
    if new is None or new.through < old.through or (new.through == old.through and new != old):
        raise ChainError(
            task_id,
            f"snapshot {child_id} drops or moves back the seal its parent carries "
            f"(pack {old.pack} through {old.through})",
            object_id=child_id,
            seq=child.seq,
        )
