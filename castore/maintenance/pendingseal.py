"""gc's rule 5 (FORMAT.md §17): a pack a seal in progress may still name is not removed.

A writer publishes a pack, then commits the snapshot whose anchor names it (§9.5 steps 1
and 2). Paused between the two for longer than the grace period, its pack is old and no
slot names it. gc's handshake (gc.py) would still keep the commit whole: the writer looks
for the pack after its link and stores it again. But between that link and that store the
chain names a pack that is not there, and whoever resumes the task then is told the chain is
broken. So gc leaves alone a pack whose range its task can still seal: the task's mark is
below the pack's last snapshot, and the chain holds that snapshot's slot (a seal packs only
committed snapshots; above the mark nothing is pruned). Once the mark reaches the pack's
range (this seal landed, another writer's did, or the task was forgotten and its history
reclaimed), no commit can name the pack any more, and age decides as for any object.

Only old objects no slot names are looked at, one header read each, and the mark of each
task such a pack claims is read once per gc: the cost is the garbage's, not the store's.
"""

from __future__ import annotations

import posixpath

from castore.chain import packs
from castore.chain.objects import ObjectStore
from castore.chain.sealmark import TaskMarks
from castore.errors import CastoreError
from castore.format.layout import slot_key, task_key
from castore.medium.base import Medium


class PendingSeals:
    """Which unnamed packs a seal in progress may still name, for one gc run."""

    def __init__(self, medium: Medium) -> None:
        self._medium = medium
        self._objects = ObjectStore(medium)
        self._through: dict[str, int | None] = {}  # task -> its mark's through (None: unknown)
        self.kept = 0

    def holds(self, key: str) -> bool:
        """True if the object at `key` is a pack its task's writer may still name."""
        header = self._pack_header(key)
        if header is None:
            return False
        through = self._mark_through(header.task)
        if through is None or through >= header.last_seq:
            return False  # a hostile task id, or a range the mark has passed
        try:
            present = self._medium.exists(slot_key(header.task, header.last_seq))
        except (CastoreError, OSError):
            present = True  # unknown: kept, as gc keeps what it cannot read
        self.kept += present
        return present

    def _pack_header(self, key: str) -> packs.PackHeader | None:
        """The header of the pack at `key`; None if it is no readable pack (gone, another
        kind, damaged: what no honest seal can name, left to age as before)."""
        object_id = posixpath.basename(key)
        try:
            if self._objects.kind_of(object_id) != packs.KIND:  # one small read
                return None
            data = self._objects.read(object_id)
            return packs.parse(object_id, data, self._objects.path(object_id)).header
        except (CastoreError, OSError, ValueError):
            return None

    def _mark_through(self, task: str) -> int | None:
        """The task's mark's `through` (-1 without a mark); None if the task id cannot be a
        task. A mark that cannot be read counts as no mark (-1): the pack is kept."""
        if task not in self._through:
            try:
                key = task_key(task)
            except CastoreError:
                self._through[task] = None
                return None
            try:
                mark = TaskMarks(self._medium, task, key).current()
            except (CastoreError, OSError):
                mark = None
            self._through[task] = -1 if mark is None else mark.through
        return self._through[task]
