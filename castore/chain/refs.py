"""A task's chain slots: the commit point and HEAD lookup.

Slot `tasks/<task>/chain/<seq>` is a hard link to the snapshot object of sequence `seq`.
Creating it with link() is the compare-and-swap: a successor of the snapshot at `seq - 1`
exists exactly when slot `seq` exists, and link() fails with EEXIST for every writer but
one, on every host, whatever the locks do.

A commit is acknowledged only once every object it names and no earlier slot names (its
own snapshot object, a blob, a new plan) is known to exist *after* the link. That is the
writer's half of the handshake with gc (gc.py): gc sets unnamed objects aside first and
reads the slots again after, so an object gc removes was set aside before a slot it did not
see was linked, and the writer of that slot, looking after its link, finds the name gone and
stores the object again from the bytes it holds. Whichever way the two interleave, and
however long either pauses, an acknowledged commit's objects exist.

A task whose history is sealed may have its oldest slots pruned (sealmark.py): HEAD lookup
starts above the mark, and a commit reads the mark after its link, so a stale writer that
linked into a pruned range takes its slot back and loses instead of being acknowledged.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterable

from castore import crashpoints
from castore.chain import sealmark
from castore.chain.objects import ObjectStore
from castore.chain.sealmark import Mark
from castore.errors import (
    ChainError,
    CommitUncertainError,
    ConflictError,
    DurabilityError,
    ObjectMissingError,
)
from castore.format import layout
from castore.format.digest import hash_bytes
from castore.format.layout import Layout, parse_slot_name
from castore.medium import fsio

# gc may remove a snapshot object between its publish and the link only if the writer
# paused longer than the grace period; each try publishes it anew.
_LINK_TRIES = 3

# A chain directory at most this large (st_size: ~340 slot names on ext4, ~400 on tmpfs) is
# listed to find HEAD; a larger one is searched with lstat (FORMAT.md 9.4).
_LIST_BELOW = 8192


class TaskSlots:
    """The chain directory of one task."""

    def __init__(self, layout: Layout, objects: ObjectStore, task_id: str) -> None:
        self.task_id = task_id
        self.directory = layout.chain_dir(task_id)
        self.task_dir = os.path.dirname(self.directory)
        self._layout = layout
        self._objects = objects
        self.marks = sealmark.TaskMarks(task_id, self.task_dir)

    def path(self, seq: int) -> str:
        # HEAD lookup builds 2 log n of these: from the directory, not by re-encoding the id.
        return f"{self.directory}{os.sep}{layout.slot_name(seq)}"

    def exists(self, seq: int) -> bool:
        return fsio.exists(self.path(seq))

    def mark(self) -> Mark | None:
        """The task's sealed mark (None without one); ChainError if it cannot be trusted."""
        return self.marks.current()

    def lowest_kept(self) -> int:
        """The lowest sequence number whose slot must exist: 0, or above the sealed mark."""
        mark = self.mark()
        return 0 if mark is None else mark.through + 1

    def started(self) -> bool:
        """True once the task has a first slot (even one pruned since, below a mark)."""
        return self.exists(0) or sealmark.started_by_mark(self.task_dir)

    def head_seq(self) -> int | None:
        """The highest sequence number present, by the O(log n) search above the sealed mark
        (FORMAT.md 9.4): in one listing of a small chain directory, else by lstat calls (the
        same search either way, so even a chain with a gap gets one answer); None if the
        task has no slot. ChainError if a mark says slots were pruned but the slot above it
        is missing (HEAD is always above the mark, sealmark.py)."""
        low = self.lowest_kept()
        names = self._names_if_small()
        exists: Callable[[int], bool] = self.exists
        if names is not None:
            listed = frozenset(names)
            exists = lambda seq: layout.slot_name(seq) in listed  # noqa: E731
        if not exists(low):
            self._refuse_missing_floor(low)
            return None
        base, high = low, low + 1  # invariant: slot `low` exists
        while exists(high):
            low, high = high, base + 2 * (high - base)
        while high - low > 1:  # invariant: `low` exists, `high` does not
            middle = (low + high) // 2
            if exists(middle):
                low = middle
            else:
                high = middle
        return low

    def _names_if_small(self) -> list[str] | None:
        """The names in a chain directory small enough that one listing costs less than the
        O(log n) lstat calls (most tasks: fewer than a few hundred unsealed slots), else None.
        Its size only chooses where the search looks, never what it finds."""
        try:
            info = os.lstat(self.directory)
        except FileNotFoundError:
            return []
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                return None  # the lookup says what a file in a directory's place means
            raise fsio.io_error(self.directory, "looking up", exc) from exc
        if not stat.S_ISDIR(info.st_mode) or info.st_size > _LIST_BELOW:
            return None
        try:
            return fsio.list_names(self.directory)
        except FileNotFoundError:
            return []

    def _refuse_missing_floor(self, low: int) -> None:
        """Slot `low` is missing: no HEAD if `low` is 0, else ChainError (HEAD is always
        above the sealed mark)."""
        if low == 0:
            return
        raise ChainError(
            self.task_id,
            f"its sealed mark says slots up to {low - 1} were pruned, but slot {low} "
            "(the oldest that must be kept) is missing",
            self.path(low),
            seq=low,
        )

    def present(self) -> list[int]:
        """Every slot number in the chain directory (one directory read)."""
        found = []
        for name in fsio.list_names(self.directory):
            seq = parse_slot_name(name)
            if seq is not None:
                found.append(seq)
        return sorted(found)

    def read(self, seq: int) -> bytes:
        return fsio.read_regular(self.path(seq))

    def prune(self, through: int) -> int:
        """Remove every slot up to `through`, and the snapshot object each is a name of (a
        snapshot belongs to one task: nothing else names it). Only once the sealed mark says
        `through` (the caller wrote it first): before that a stale writer's link into the
        freed names would be acknowledged. Idempotent; returns how many slots it removed."""
        mark = self.mark()
        if mark is None or mark.through < through:
            raise ValueError(f"slots up to {through} of {self.task_id!r} are not marked sealed")
        objects: list[str] = []
        removed = 0
        for name in fsio.list_names(self.directory):
            seq = parse_slot_name(name)
            if seq is None or seq > through:
                continue
            object_path = self._prune_slot(os.path.join(self.directory, name))
            if object_path is not None:
                objects.append(object_path)
            removed += 1
            crashpoints.reach("prune.slot_removed")
        # The slots' removal durable before their objects go: a power loss must never leave a
        # slot whose object is gone (fsck's slot-not-published), only objects no slot names.
        fsio.fsync_dir(self.directory)
        for object_path in objects:
            fsio.remove_if_present(object_path)
        return removed

    def _prune_slot(self, slot: str) -> str | None:
        """Remove a slot; the path of its snapshot's object name if that is the same file
        (the caller removes it once the slot's removal is durable), else None."""
        try:
            data = fsio.read_regular(slot)
        except FileNotFoundError:
            return None
        object_path = self._objects.path(hash_bytes(data))
        try:
            same = os.path.samestat(os.lstat(slot), os.lstat(object_path))
        except FileNotFoundError:
            same = False
        except OSError as exc:
            raise fsio.io_error(object_path, "looking up", exc) from exc
        fsio.remove_if_present(slot)
        return object_path if same else None

    def commit(
        self, data: bytes, seq: int, expected_parent: str, relies_on: Iterable[str] = ()
    ) -> str:
        """Publish snapshot bytes as an object, then claim slot `seq` for it: the commit point.

        `relies_on`: the other objects the snapshot names that no earlier slot names (a
        result blob, a plan at seq 0 or after an override); they must exist (else
        ObjectMissingError, before the commit point), and are stored again if gc removes
        them meanwhile. Returns the snapshot id. Raises ConflictError, having written no
        slot, if another writer already committed sequence `seq`.
        """
        held = {object_id: self._objects.hold(object_id) for object_id in relies_on}
        object_id = self._link(data, seq, expected_parent)
        crashpoints.reach("commit.linked")
        self._check_not_pruned(seq, expected_parent)
        try:
            self._objects.flush.directory(self.directory)
        except DurabilityError as exc:
            raise CommitUncertainError(self.path(seq), exc) from exc
        self._recheck(object_id, seq, data, held)
        crashpoints.reach("commit.done")
        return object_id

    def _link(self, data: bytes, seq: int, expected_parent: str) -> str:
        for _ in range(_LINK_TRIES):
            object_id = self._objects.put_framed(data, remember=False, snapshot=True)
            crashpoints.reach("commit.before_link")
            source = self._objects.path(object_id)
            try:
                linked = fsio.link_new(source, self.path(seq))
            except DurabilityError as exc:
                if exc.errno != errno.ENOENT or os.path.lexists(source):
                    raise
                if not os.path.isdir(self.directory):
                    raise
                continue  # gc removed the object before the link (a long pause): store it anew
            if not linked:
                actual = self._actual(seq)
                # A retransmitted link() on NFS can report EEXIST for its own success.
                if actual != object_id:
                    raise ConflictError(self.task_id, expected_parent, actual, seq)
            return object_id
        raise ObjectMissingError(hash_bytes(data), self._objects.path(hash_bytes(data)))

    def _check_not_pruned(self, seq: int, expected_parent: str) -> None:
        """After the link: a slot at or below the sealed mark was linked into a name pruning
        freed, by a writer that paused since HEAD was there. It is not part of the chain:
        take it back and lose (sealmark.py)."""
        mark = self.mark()
        if mark is not None and seq <= mark.through:
            fsio.remove_if_present(self.path(seq))
            raise ConflictError(self.task_id, expected_parent, "<pruned, sealed>", seq)

    def _recheck(self, object_id: str, seq: int, data: bytes, held: dict[str, bytes]) -> None:
        """After the link: every object this commit relies on still has its name (gc may have
        set it aside before it could see the slot; see the module docstring)."""
        if not self._objects.still_named(object_id):
            # The slot is the snapshot's inode: give it back its object name (not a copy).
            fanout = os.path.dirname(self._objects.path(object_id))
            try:
                fsio.link_new(self.path(seq), self._objects.path(object_id))
                fsio.fsync_dir(fanout)
            except DurabilityError:
                self._objects.put_framed(data, remember=False)
        for other, other_data in held.items():
            if not self._objects.still_named(other):
                self._objects.put_framed(other_data)

    def _actual(self, seq: int) -> str:
        try:
            return hash_bytes(self.read(seq))
        except OSError as exc:
            return f"<unreadable: {exc}>"
