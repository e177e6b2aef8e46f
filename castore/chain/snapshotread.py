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
import os

from castore.chain.objects import ObjectStore
from castore.chain.refs import TaskSlots
from castore.errors import DurabilityError, ObjectMissingError
from castore.format.digest import hash_bytes
from castore.medium import fsio


def read_snapshot(objects: ObjectStore, slots: TaskSlots, object_id: str, seq: int) -> bytes:
    """The framed bytes of snapshot `object_id`, verified, from its object name or else from
    chain slot `seq`. ObjectMissingError (the name's) when neither holds those bytes: a slot
    that is gone or holds other bytes does not stand for the missing name; ObjectCorruptError
    as `ObjectStore.read` raises it."""
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
    path = slots.path(seq)
    for read in (fsio.read_regular, fsio.read_uncached):
        try:
            data = read(path)
        except FileNotFoundError:
            return None  # pruned meanwhile: its object went after it, the caller says so
        if hash_bytes(data) == object_id:
            return data
    return None


def name_is_lost(objects: ObjectStore, object_id: str) -> bool:
    """True if the snapshot's object name is missing (as a lookup sees it)."""
    return not os.path.lexists(objects.path(object_id))


def restore_name(objects: ObjectStore, slot_path: str, object_id: str) -> bool:
    """Give the snapshot in `slot_path` (whose bytes hash to `object_id`) its object name
    back, as a hard link of the slot, and make the name durable (fan-out directory synced).
    True if this call linked it; False if the name exists already (another gc or the writer
    gave it back) or the slot is gone (pruned meanwhile: its snapshot needs no name)."""
    target = objects.path(object_id)
    fanout = os.path.dirname(target)
    # A planted symlink in place of a fan-out directory must not receive the name.
    fsio.require_real_directory(fanout)
    fsio.make_dir_durable(fanout)  # a person or gc may have removed an emptied fan-out dir
    try:
        linked = fsio.link_new(slot_path, target)
    except DurabilityError as exc:
        if exc.errno == errno.ENOENT and not os.path.lexists(slot_path):
            return False
        raise
    if linked:
        fsio.fsync_dir(fanout)
    return linked
