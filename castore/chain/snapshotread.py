"""A snapshot read by id where its chain slot is known, and a lost snapshot name given back.

In a format-2 store a commit does not make its snapshot's object name (objects/xx/<id>)
durable: the chain slot, made durable by the commit, is a hard link to the same inode, so
after a power loss the slot may be the snapshot's only name (FORMAT.md §13, "A lost snapshot
name"). Every reader of a snapshot whose slot it knows reads it here: by its object name, else
from the slot, whose bytes must hash to the id asked for (the id came from the child's
`parent`, or it is HEAD's own hash), so what is returned is verified either way.
"""

from __future__ import annotations

import errno

from castore.chain.objects import ObjectStore
from castore.chain.refs import TaskSlots
from castore.errors import DurabilityError, ObjectMissingError
from castore.format.digest import hash_bytes
from castore.format.layout import fanout_key, object_key


def read_snapshot(objects: ObjectStore, slots: TaskSlots, object_id: str, seq: int) -> bytes:
    """The framed bytes of snapshot `object_id`, verified, from its object name or else from
    chain slot `seq`. ObjectMissingError (the name's) when neither holds those bytes: a slot
    that is gone or holds other bytes does not stand for the missing name; ObjectCorruptError
    as `ObjectStore.read` raises it. Where a slot is the only copy of its snapshot (a medium
    without hard links, S3), the slot is read first: one request, not two."""
    if not objects.medium.aliases:
        data = _slot_bytes(slots, seq, object_id)
        if data is not None:
            return data
    try:
        return objects.read(object_id)
    except ObjectMissingError:
        data = _slot_bytes(slots, seq, object_id)
        if data is None:
            raise
        return data


def _slot_bytes(slots: TaskSlots, seq: int, object_id: str) -> bytes | None:
    """Slot `seq`'s bytes if they hash to `object_id` (read once more past the client's
    caches before they count as other bytes, as `ObjectStore.read` does); else None."""
    for read in (slots.read, slots.read_fresh):
        try:
            data = read(seq)
        except FileNotFoundError:
            return None  # pruned meanwhile: its object went after it, the caller says so
        if hash_bytes(data) == object_id:
            return data
    return None


def name_is_lost(objects: ObjectStore, object_id: str) -> bool:
    """True if the snapshot's object name is missing (as a lookup sees it), on a medium where
    a slot is a second name of its snapshot's object (elsewhere a snapshot has no other name
    to lose: its slot is its one copy)."""
    return objects.medium.aliases and not objects.exists(object_id)


def restore_name(objects: ObjectStore, slot: str, object_id: str) -> bool:
    """Give the snapshot in slot key `slot` (whose bytes hash to `object_id`) its object name
    back, as a second name of the slot, and make the name durable (fan-out directory synced).
    True if this call linked it; False if the name exists already (another gc or the writer
    gave it back) or the slot is gone (pruned meanwhile: its snapshot needs no name)."""
    medium, fanout = objects.medium, fanout_key(object_id)
    # A planted symlink in place of a fan-out directory must not receive the name.
    medium.require_dir(fanout)
    medium.make_dir(fanout)  # a person or gc may have removed an emptied fan-out dir
    try:
        linked = medium.link(slot, object_key(object_id))
    except DurabilityError as exc:
        if exc.errno == errno.ENOENT and not medium.exists(slot):
            return False
        raise
    if linked:
        medium.flush_dir(fanout)
    return linked
