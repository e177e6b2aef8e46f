"""A task's chain slots: the commit point and HEAD lookup.

Slot `tasks/<task>/chain/<seq>` is a hard link to the snapshot object of sequence `seq`.
Creating it with link() is the compare-and-swap: a successor of the snapshot at `seq - 1`
exists exactly when slot `seq` exists, and link() fails with EEXIST for every writer but
one, on every host, whatever the locks do.
"""

from __future__ import annotations

import os

from castore import crashpoints, fsio, layout
from castore.digest import hash_bytes
from castore.errors import CommitUncertainError, ConflictError, DurabilityError
from castore.layout import Layout, parse_slot_name
from castore.objects import ObjectStore


class TaskSlots:
    """The chain directory of one task."""

    def __init__(self, layout: Layout, objects: ObjectStore, task_id: str) -> None:
        self.task_id = task_id
        self.directory = layout.chain_dir(task_id)
        self._layout = layout
        self._objects = objects

    def path(self, seq: int) -> str:
        # HEAD lookup builds 2 log n of these: from the directory, not by re-encoding the id.
        return f"{self.directory}{os.sep}{layout.slot_name(seq)}"

    def exists(self, seq: int) -> bool:
        try:
            os.lstat(self.path(seq))
        except FileNotFoundError:
            return False
        return True

    def head_seq(self) -> int | None:
        """The highest sequence number present, in O(log n) stat calls; None if no slot."""
        if not self.exists(0):
            return None
        low, high = 0, 1  # invariant: slot `low` exists
        while self.exists(high):
            low, high = high, high * 2
        while high - low > 1:  # invariant: `low` exists, `high` does not
            middle = (low + high) // 2
            if self.exists(middle):
                low = middle
            else:
                high = middle
        return low

    def present(self) -> list[int]:
        """Every slot number in the chain directory (one directory read)."""
        found = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                seq = parse_slot_name(entry.name)
                if seq is not None:
                    found.append(seq)
        return sorted(found)

    def read(self, seq: int) -> bytes:
        return fsio.read_regular(self.path(seq))

    def commit(self, data: bytes, seq: int, expected_parent: str) -> str:
        """Publish snapshot bytes as an object, then claim slot `seq` for it: the commit point.

        Returns the snapshot id. Raises ConflictError, having written no slot, if another
        writer already committed sequence `seq`.
        """
        object_id = self._objects.put_framed(data)
        crashpoints.reach("commit.before_link")
        if not fsio.link_new(self._objects.path(object_id), self.path(seq)):
            actual = self._actual(seq)
            # A retransmitted link() on NFS can report EEXIST for its own success.
            if actual != object_id:
                raise ConflictError(self.task_id, expected_parent, actual, seq)
        crashpoints.reach("commit.linked")
        try:
            fsio.fsync_dir(self.directory)
        except DurabilityError as exc:
            raise CommitUncertainError(self.path(seq), exc) from exc
        crashpoints.reach("commit.done")
        return object_id

    def _actual(self, seq: int) -> str:
        try:
            return hash_bytes(self.read(seq))
        except OSError as exc:
            return f"<unreadable: {exc}>"
