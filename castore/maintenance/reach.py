"""What gc keeps: every object the chain slots name, directly and through the trees and packs
they name (FORMAT.md §17), read once and then again for the slots linked since; and gc's
report, which the reads add to (the tasks and objects they could not read, the lost snapshot
names they gave back).
"""

from __future__ import annotations

from castore.chain import references
from castore.chain.objects import ObjectStore
from castore.chain.sealmark import TaskMarks
from castore.chain.snapshotread import name_is_lost, restore_name
from castore.errors import CastoreError, StoreIOError, UnsafeFileError
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import (
    CHAIN_DIR,
    TASKS_DIR,
    display_name,
    is_object_name,
    object_relpath,
    parse_slot_name,
    slot_name,
)
from castore.format.model import attrs
from castore.medium.base import Medium


@attrs.define
class GcReport:
    """What gc removed (or, with dry_run, would remove), by key (a path relative to the
    store's root: objects/ab/<id>)."""

    removed: list[str] = attrs.field(factory=list)
    bytes_freed: int = 0
    kept_young: int = 0
    kept_pending: int = 0  # unnamed packs a seal in progress may name (pendingseal.py)
    unreadable_tasks: list[str] = attrs.field(factory=list)
    restored: list[str] = attrs.field(factory=list)  # objects a crashed gc had left aside
    # Snapshot names a power loss took (v2, FORMAT.md §13 "A lost snapshot name"), given back
    # as links of their slots.
    names_restored: list[str] = attrs.field(factory=list)
    # Trees, packs (or objects in their place) whose names could not be read: id -> why.
    unreadable_objects: dict[str, str] = attrs.field(factory=dict)
    forgotten: list[str] = attrs.field(factory=list)  # tasks retention forgot (retention.py)
    reclaimed: list[str] = attrs.field(factory=list)  # forgotten tasks pruned (reclaim.py)

    @property
    def unreadable(self) -> bool:
        """True when gc kept every object: something a chain names could not be read."""
        return bool(self.unreadable_tasks or self.unreadable_objects)


class Reachable:
    """What the chain slots name, directly and through the trees and packs they name, read
    once per slot (slots are immutable) and read again for new slots only.

    A named tree or pack that is missing is looked for again at every later read: a writer
    that finds it gone after its link stores it again (refs.py), and its parts after it, so
    a read that follows a set-aside must see it once it is back."""

    def __init__(
        self, medium: Medium, report: GcReport, *, restore: bool = False, dry_run: bool = False
    ) -> None:
        self._medium = medium
        self._report = report
        # restore: give each slot's snapshot its lost object name back (dry_run: only say so).
        self._objects = ObjectStore(medium) if restore else None
        self._dry_run = dry_run
        self._seen: set[str] = set()  # slot keys read
        self._walk = references.Walk()
        self._loaded: set[str] = set()  # followed ids already loaded
        self.referenced = self._walk.reached
        # Objects set aside by the batch in progress: id -> set-aside key, read from there.
        self.aside: dict[str, str] = {}

    @property
    def unreadable(self) -> bool:
        return self._report.unreadable

    def read_new(self) -> None:
        """Read every slot not read before, and follow what the new ones name."""
        tasks = self._task_names()
        if tasks is None:
            self._unreadable("<tasks/ is missing or not a directory>")
            return
        roots = [references.Names(followed=tuple(sorted(self._walk.missing)))]
        for task in sorted(tasks):
            chain = f"{TASKS_DIR}/{task}/{CHAIN_DIR}"
            found = self._dir_found(f"{TASKS_DIR}/{task}") and self._dir_found(chain)
            if found is None:
                self._unreadable(task)  # never followed: what it names is unknown
                continue
            if found:
                roots += self._read_slots(task, chain)
        references.walk(roots, self._load, self._loaded, self._walk)
        self._report.unreadable_objects.update(self._walk.unreadable)
        # A named tree or pack that is missing might have named anything: keep everything
        # for the rest of this run, as for an unreadable chain (a writer that finds it gone
        # after its link stores it again, refs.py; a damaged store keeps it all until fsck).
        for object_id in self._walk.missing:
            self._report.unreadable_objects.setdefault(
                object_id, "named by a chain, but missing: what it names is unknown"
            )

    def _task_names(self) -> list[str] | None:
        """The names in tasks/; None if it is missing or not a directory itself."""
        try:
            self._medium.require_dir(TASKS_DIR)
            return listed(self._medium, TASKS_DIR)
        except UnsafeFileError:
            return None

    def _dir_found(self, key: str) -> bool | None:
        """True if `key` is a directory itself, or nothing (its listing then finds nothing;
        a medium without directories never says otherwise); False for a file in its place;
        None for a symlink (never followed: fsck's unsafe-file)."""
        try:
            self._medium.require_dir(key)
        except UnsafeFileError as exc:
            return None if exc.found == "symlink" else False
        return True

    def _read_slots(self, task: str, chain: str) -> list[references.Names]:
        """What each slot of `chain` not read before names (nothing more once one of them
        cannot be read: the task is unreadable)."""
        roots: list[references.Names] = []
        floor = self._lowest_read(task)
        if floor is None:
            self._unreadable(task)
            return roots
        # Listed from the floor: on S3, which keeps every slot, a listing of the whole chain
        # would cost a page per 1,000 slots the task ever committed, at every gc.
        names = listed(self._medium, chain, after=slot_name(floor - 1) if floor else None)
        for name in names or []:
            key = f"{chain}/{name}"
            seq = parse_slot_name(name)
            if seq is None or seq < floor or key in self._seen:
                continue
            try:
                data = self._medium.read(key)
                # Read as a snapshot whatever its header says: a slot that does not
                # decode might name anything.
                roots.append(references.names("snapshot", codec.unframe(data)[1]))
            except (CastoreError, OSError, ValueError):
                self._unreadable(task)
                break
            self._seen.add(key)
            snapshot_id = hash_bytes(data)
            self.referenced.add(snapshot_id)
            objects = self._objects
            if objects is not None and name_is_lost(objects, snapshot_id):
                self._restore_name(objects, key, snapshot_id)
        return roots

    def _lowest_read(self, task: str) -> int | None:
        """The lowest slot worth reading. On a medium that keeps retired slots (S3, where
        `frees_names` is False) those at or below the sealed mark are skipped: the mark moves
        only once the anchor that names their pack is committed, and the pack, which gc
        follows, holds their snapshots (FORMAT.md §17). Elsewhere pruning removes them: 0.
        None if the mark cannot be read (the task is then unreadable: everything kept)."""
        if self._medium.frees_names:
            return 0
        try:
            mark = TaskMarks(self._medium, display_name(task), f"{TASKS_DIR}/{task}").current()
        except (CastoreError, OSError):
            return None
        return 0 if mark is None else mark.through + 1

    def _restore_name(self, objects: ObjectStore, slot: str, snapshot_id: str) -> None:
        """A slot whose snapshot has no object name: the name back, a link of the slot (its
        bytes hash to the name by construction), durable before gc goes on."""
        if self._dry_run or restore_name(objects, slot, snapshot_id):
            self._report.names_restored.append(object_relpath(snapshot_id))

    def _load(self, object_id: str) -> references.Loaded:
        """What a followed id names (a set-aside object is read under its set-aside key)."""
        if not is_object_name(object_id):
            return ""  # no object can have this name: it names nothing
        key = self.aside.get(object_id) or object_relpath(object_id)
        return references.load_key(self._medium, key)

    def _unreadable(self, task: str) -> None:
        if task not in self._report.unreadable_tasks:
            self._report.unreadable_tasks.append(task)


def listed(medium: Medium, key: str, *, after: str | None = None) -> list[str] | None:
    """The names under `key` (only those after `after`, if given); None if there is no such
    directory (removed while gc ran: an empty chain directory of a task being made)."""
    try:
        return medium.names(key) if after is None else medium.names_after(key, after)
    except FileNotFoundError:
        return None
    except StoreIOError as exc:
        raise StoreIOError(medium.where(key), "listing", exc) from exc
