"""A task's chain slots: the commit point and HEAD lookup, through the store's medium.

Slot `tasks/<task>/chain/<seq>` holds the snapshot of sequence `seq` (on POSIX, a hard link to
its object). Creating it exclusively is the compare-and-swap: a successor of the snapshot at
`seq - 1` exists exactly when slot `seq` exists, and the create fails for every writer but
one, on every host, whatever the locks do (castore.medium.base: the medium's promise).

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
from collections.abc import Callable, Iterable, Mapping

from castore import crashpoints
from castore.chain import sealmark
from castore.chain.objects import ObjectStore
from castore.chain.sealmark import Mark
from castore.errors import (
    ChainError,
    CommitUncertainError,
    ConflictError,
    DurabilityError,
    IntegrityError,
    ObjectMissingError,
)
from castore.format import layout
from castore.format.digest import hash_bytes
from castore.format.layout import fanout_key, object_key, parse_slot_name
from castore.medium.base import Medium

# How often HEAD lookup searches again after its floor vanished under a moving mark
# (FORMAT.md §9.4); each try needs the mark to move once more while it searches.
_FLOOR_TRIES = 4


class TaskSlots:
    """The chain directory of one task."""

    def __init__(self, medium: Medium, objects: ObjectStore, task_id: str) -> None:
        self.task_id = task_id
        self.medium = medium
        self.task_key = layout.task_key(task_id)
        self.chain_key = f"{self.task_key}/{layout.CHAIN_DIR}"
        self._prefix = self.chain_key + "/"
        self._objects = objects
        self.marks = sealmark.TaskMarks(medium, task_id, self.task_key)

    @property
    def directory(self) -> str:
        """Where the chain directory is, as a person is told."""
        return self.medium.where(self.chain_key)

    def key(self, seq: int) -> str:
        # HEAD lookup builds 2 log n of these: from the directory, not by re-encoding the id.
        return self._prefix + layout.slot_name(seq)

    def path(self, seq: int) -> str:
        """Where slot `seq` is, as a person is told (a path, a URL)."""
        return self.medium.where(self.key(seq))

    def exists(self, seq: int) -> bool:
        return self.medium.exists(self.key(seq))

    def mark(self) -> Mark | None:
        """The task's sealed mark (None without one); ChainError if it cannot be trusted."""
        return self.marks.current()

    def lowest_kept(self) -> int:
        """The lowest sequence number whose slot must exist: 0, or above the sealed mark."""
        mark = self.mark()
        return 0 if mark is None else mark.through + 1

    def started(self) -> bool:
        """True once the task has a first slot (even one pruned since, below a mark)."""
        return self.exists(0) or self.marks.started()

    def head_seq(self) -> int | None:
        """The highest sequence number present, by the O(log n) search above the sealed mark
        (FORMAT.md 9.4): in one listing of a small chain directory, else by lookups (the
        same search either way, so even a chain with a gap gets one answer); None if the
        task has no slot. ChainError if a mark says slots were pruned but the slot above it
        is missing (HEAD is always above the mark, sealmark.py)."""
        low = self.lowest_kept()
        for _ in range(_FLOOR_TRIES):
            found = self._search_above(low)
            if found is not None:
                return found
            # The floor is missing. A sealer may have moved the mark and pruned up to it
            # between the mark read above and the search (it marks before it prunes): a
            # reader must then search again above the new mark, not call the task absent.
            moved = self.lowest_kept()
            if moved == low:
                break
            low = moved
        self._refuse_missing_floor(low)
        return None

    def _search_above(self, low: int) -> int | None:
        """HEAD found from `low` up, or None if slot `low` is missing."""
        names = self.medium.names_if_small(self.chain_key)
        exists: Callable[[int], bool] = self.exists
        if names is not None:
            listed = frozenset(names)
            # slot_name's text without its range check: a number past MAX_SEQ has one digit
            # too many, so it is simply not listed.
            exists = lambda seq: f"{seq:016d}" in listed  # noqa: E731
        if not exists(low):
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
        for name in self.medium.names(self.chain_key):
            seq = parse_slot_name(name)
            if seq is not None:
                found.append(seq)
        return sorted(found)

    def read(self, seq: int) -> bytes:
        return self.medium.read(self.key(seq))

    def read_fresh(self, seq: int) -> bytes:
        return self.medium.read_fresh(self.key(seq))

    def prune(self, through: int, known: Mapping[int, bytes] | None = None) -> int:
        """Retire every slot up to `through`, and remove the snapshot object each is a name of
        (a snapshot belongs to one task: nothing else names it). Only once the sealed mark says
        `through` (the caller moved it first): before that a stale writer's claim of a freed
        name would be acknowledged. `known`: the bytes the caller committed at some of these
        seqs (the sealer holds them), not read back; whether the slot is still their object's
        file is asked all the same. Idempotent; returns how many slots it retired (0 on a
        medium that keeps retired slots: nothing is asked of it at all)."""
        mark = self.mark()
        if mark is None or mark.through < through:
            raise ValueError(f"slots up to {through} of {self.task_id!r} are not marked sealed")
        if self.medium.keeps_retired:
            # S3: a retired slot keeps its key and bytes and has no object name of its own, so
            # there is nothing to list, read or take away (the mark was the whole prune).
            return 0
        objects: list[str] = []
        removed = 0
        known = known or {}
        for name in self.medium.names(self.chain_key):
            seq = parse_slot_name(name)
            if seq is None or seq > through:
                continue
            object_name = self._prune_slot(self._prefix + name, known.get(seq))
            if object_name is not None:
                objects.append(object_name)
            removed += 1
            crashpoints.reach("prune.slot_removed")
        # The slots' removal durable before their objects go: a power loss must never leave a
        # slot whose object is gone (fsck's slot-not-published), only objects no slot names.
        self.medium.flush_dir(self.chain_key)
        for object_name in objects:
            self.medium.remove(object_name)
        return removed

    def _prune_slot(self, slot: str, data: bytes | None) -> str | None:
        """Retire a slot; the key of its snapshot's object name if that is the same stored
        file (the caller removes it once the slot's removal is durable), else None. `data`:
        the bytes committed there, if the caller knows them (else they are read)."""
        if data is None:
            try:
                data = self.medium.read(slot)
            except FileNotFoundError:
                return None
        object_name = object_key(hash_bytes(data))
        same = self.medium.aliases and self.medium.same_file(slot, object_name)
        self.medium.retire(slot)
        return object_name if same else None

    def commit(
        self, data: bytes, seq: int, expected_parent: str, relies_on: Iterable[str] = ()
    ) -> str:
        """Claim slot `seq` for the snapshot bytes `data`: the commit point.

        `relies_on`: the other objects the snapshot names that no earlier slot names (a
        result blob, a plan at seq 0 or after an override); they must exist (else
        ObjectMissingError, before the commit point), and are stored again if gc removes
        them meanwhile. Returns the snapshot id. Raises ConflictError, having written no
        slot, if another writer already committed sequence `seq`; CommitUncertainError for
        any failure after the slot's link.
        """
        held = {object_id: self._objects.hold(object_id) for object_id in relies_on}
        object_id = self._claim(data, seq, expected_parent)
        crashpoints.reach("commit.linked")
        if self.medium.frees_names:
            self._check_not_pruned(seq, expected_parent)
        try:
            self.medium.flush_dir(self.chain_key)
        except DurabilityError as exc:
            raise CommitUncertainError(self.path(seq), exc) from exc
        try:
            self._recheck(object_id, seq, data, held)
        except (OSError, IntegrityError) as exc:
            # After the commit point nothing may read as "not committed" (FORMAT.md 9.3).
            cause = exc if isinstance(exc, OSError) else OSError(errno.EIO, str(exc))
            raise CommitUncertainError(self.path(seq), cause, restore=True) from exc
        crashpoints.reach("commit.done")
        return object_id

    def _claim(self, data: bytes, seq: int, expected_parent: str) -> str:
        object_id = hash_bytes(data)
        try:
            # Inside a batch the snapshot is published with its objects; the slot is then a
            # second name of it (a medium without links writes the slot as a copy).
            if self._objects.publish_with_batch(data) and self.medium.aliases:
                claimed = self._link_published(data, seq, object_id)
            else:
                claimed = self._claim_alone(data, seq, object_id)
        except FileNotFoundError:
            raise ObjectMissingError(object_id, self._objects.path(object_id)) from None
        if not claimed:
            actual = self._actual(seq)
            # A retransmitted create (NFS link(), an S3 PUT whose answer was lost) can report
            # "exists" for its own success: the slot then holds this writer's own bytes.
            if actual != object_id:
                raise ConflictError(self.task_id, expected_parent, actual, seq)
        return object_id

    def _claim_alone(self, data: bytes, seq: int, object_id: str) -> bool:
        return self.medium.claim(
            self.key(seq),
            data,
            alias_of=object_key(object_id),
            alias_durable=self._objects.snapshot_names_durable,
        )

    def _link_published(self, data: bytes, seq: int, object_id: str) -> bool:
        """The slot linked to the snapshot object a batch published with its objects (FORMAT.md
        9.2, "A commit inside a batch"): the commit point, as the medium's claim makes it."""
        crashpoints.reach("commit.before_link")
        try:
            return self.medium.link(object_key(object_id), self.key(seq))
        except DurabilityError as exc:
            if exc.errno != errno.ENOENT:
                raise
        # The object went before the link (a gc, after a long pause): store it anew, alone.
        return self._claim_alone(data, seq, object_id)

    def _check_not_pruned(self, seq: int, expected_parent: str) -> None:
        """After the claim: a slot at or below the sealed mark was claimed in a name pruning
        freed, by a writer that paused since HEAD was there. It is not part of the chain:
        take it back and lose (sealmark.py)."""
        mark = self.mark()
        if mark is not None and seq <= mark.through:
            self.medium.remove(self.key(seq))
            raise ConflictError(self.task_id, expected_parent, "<pruned, sealed>", seq)

    def _recheck(self, object_id: str, seq: int, data: bytes, held: dict[str, bytes]) -> None:
        """After the claim: every object this commit relies on still has its name (gc may have
        set it aside before it could see the slot; see the module docstring)."""
        if self.medium.aliases and not self._objects.still_named(object_id):
            # The slot is the snapshot's inode: give it back its object name (not a copy).
            try:
                self.medium.link(self.key(seq), object_key(object_id))
                self.medium.flush_dir(fanout_key(object_id))
            except DurabilityError:
                self._store_again(data, remember=False)
        for other, other_data in held.items():
            if not self._objects.still_named(other):
                self._store_again(other_data)

    def _store_again(self, data: bytes, *, remember: bool = True) -> None:
        """Publish `data` again, durable before the next look: inside a batch a put waits in
        it, and a tree must have its name back before its parts are looked at (gc.py)."""
        self._objects.put_framed(data, remember=remember)
        self._objects.publish_open_batch()

    def _actual(self, seq: int) -> str:
        try:
            return hash_bytes(self.read(seq))
        except OSError as exc:
            return f"<unreadable: {exc}>"
