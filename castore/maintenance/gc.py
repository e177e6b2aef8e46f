"""`castore gc`: remove unreachable objects and leftover temp files older than a grace period.

Nothing younger than the grace period is removed, and no object of an acknowledged commit is
ever removed, however long a writer pauses. The second holds by a handshake with the writer
(refs.py), because age alone cannot protect an object whose writer paused longer than the
grace period between publishing it and linking the slot that names it:

1. gc reads every slot, then sets every old object no slot names aside (a second name, a temp
   name, then its own name unlinked: gone from then on);
2. only then does it read the slots again (those linked since step 1), and puts back every
   set-aside object one of them names, or that became young (a writer refreshed it);
3. only then does it unlink the rest.

A writer acknowledges a commit only after it has looked, *after* linking its slot, for every
object the commit relies on, and stored again from the bytes it holds any that is gone. If
the writer's link came before gc's second read, gc sees the slot and puts the object back;
if it came after, the object was already set aside when the writer looked (step 1 precedes
step 2), so the writer saw the name gone and stored it again. Either way the object exists.

"Names" is transitive through trees and packs (references.py). A commit whose result is a
tree relies on everything the tree reaches, and looks for each after its link, a tree before
its parts (trees.parts_reached). So when gc sets a part aside after the writer found it, the
writer had already made sure of the tree naming it, and gc's second read finds the slot, reads
the tree (under its set-aside name if it is in the same batch) and puts the part back; a
followed object gc finds missing is looked for again at every later read, since the writer
may be storing it again right then.

A crash of gc between a set-aside and its put back leaves the object's bytes under the temp
name only: the next gc links an old temp file that is a whole object back to its missing
name instead of removing it. Lock files, chain slots and anything gc cannot classify are
never touched.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import attrs

from castore import crashpoints
from castore.chain import references
from castore.chain.objects import ObjectStore
from castore.chain.snapshotread import name_is_lost, restore_name
from castore.errors import CastoreError, StoreIOError, UsageError
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import (
    CHAIN_DIR,
    OBJECTS_DIR,
    TASKS_DIR,
    is_object_name,
    object_relpath,
    parse_slot_name,
    parse_temp_name,
    temp_name,
)
from castore.maintenance import reclaim, retention
from castore.medium import fsio, fsread, oserrors
from castore.medium.posix import PosixMedium
from castore.store import Store

DEFAULT_GRACE_S = 14 * 86400
# Objects set aside at once before the slots are read again: bounds how many objects a gc
# killed mid-run leaves under temp names, and how long any of them is away.
BATCH = 1024


@attrs.define
class GcReport:
    """What gc removed (or, with dry_run, would remove), by relative path."""

    removed: list[str] = attrs.field(factory=list)
    bytes_freed: int = 0
    kept_young: int = 0
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
        self, root: str, report: GcReport, *, restore: bool = False, dry_run: bool = False
    ) -> None:
        self._root = root
        self._medium = PosixMedium(root)
        self._report = report
        # restore: give each slot's snapshot its lost object name back (dry_run: only say so).
        self._objects = ObjectStore(PosixMedium(root)) if restore else None
        self._dry_run = dry_run
        self._seen: set[str] = set()  # slot paths read
        self._walk = references.Walk()
        self._loaded: set[str] = set()  # followed ids already loaded
        self.referenced = self._walk.reached
        # Objects set aside by the batch in progress: id -> temp path, read from there.
        self.aside: dict[str, str] = {}

    @property
    def unreadable(self) -> bool:
        return self._report.unreadable

    def read_new(self) -> None:
        """Read every slot not read before, and follow what the new ones name."""
        tasks_dir = os.path.join(self._root, TASKS_DIR)
        if not os.path.isdir(tasks_dir) or os.path.islink(tasks_dir):
            self._unreadable("<tasks/ is missing or not a directory>")
            return
        roots = [references.Names(followed=tuple(sorted(self._walk.missing)))]
        for task in sorted(_listdir(tasks_dir)):
            chain = os.path.join(tasks_dir, task, CHAIN_DIR)
            if os.path.islink(os.path.join(tasks_dir, task)) or os.path.islink(chain):
                self._unreadable(task)  # never followed: what it names is unknown
                continue
            if not os.path.isdir(chain):
                continue
            for name in _listdir(chain):
                path = os.path.join(chain, name)
                if parse_slot_name(name) is None or path in self._seen:
                    continue
                try:
                    data = fsread.read_regular(path)
                    # Read as a snapshot whatever its header says: a slot that does not
                    # decode might name anything.
                    roots.append(references.names("snapshot", codec.unframe(data)[1]))
                except (CastoreError, OSError, ValueError):
                    self._unreadable(task)
                    break
                self._seen.add(path)
                snapshot_id = hash_bytes(data)
                self.referenced.add(snapshot_id)
                objects = self._objects
                if objects is not None and name_is_lost(objects, snapshot_id):
                    self._restore_name(objects, os.path.relpath(path, self._root), snapshot_id)
        references.walk(roots, self._load, self._loaded, self._walk)
        self._report.unreadable_objects.update(self._walk.unreadable)
        # A named tree or pack that is missing might have named anything: keep everything
        # for the rest of this run, as for an unreadable chain (a writer that finds it gone
        # after its link stores it again, refs.py; a damaged store keeps it all until fsck).
        for object_id in self._walk.missing:
            self._report.unreadable_objects.setdefault(
                object_id, "named by a chain, but missing: what it names is unknown"
            )

    def _restore_name(self, objects: ObjectStore, slot: str, snapshot_id: str) -> None:
        """A slot whose snapshot has no object name: the name back, a link of the slot (its
        bytes hash to the name by construction), durable before gc goes on."""
        if self._dry_run or restore_name(objects, slot, snapshot_id):
            self._report.names_restored.append(object_relpath(snapshot_id))

    def _load(self, object_id: str) -> references.Loaded:
        """What a followed id names (a set-aside object is read under its temp name)."""
        if not is_object_name(object_id):
            return ""  # no object can have this name: it names nothing
        aside = self.aside.get(object_id)
        key = os.path.relpath(aside, self._root) if aside else object_relpath(object_id)
        return references.load_key(self._medium, key)

    def _unreadable(self, task: str) -> None:
        if task not in self._report.unreadable_tasks:
            self._report.unreadable_tasks.append(task)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []  # removed while gc ran (an empty chain directory of a task being made)
    except OSError as exc:
        raise StoreIOError(path, "listing", exc) from exc


def _raise_walk_error(exc: OSError) -> None:
    raise StoreIOError(str(exc.filename), "listing", exc) from exc


def _candidates(root: str, cutoff: float, report: GcReport) -> Iterator[tuple[str, bool]]:
    """(relative path, is_temp) of every object or temp file older than `cutoff`."""
    for name in _listdir(root):  # an interrupted write of the marker leaves one here
        with contextlib.suppress(FileNotFoundError):
            if parse_temp_name(name) and os.lstat(os.path.join(root, name)).st_mtime < cutoff:
                yield name, True
    for top in (os.path.join(root, OBJECTS_DIR), os.path.join(root, TASKS_DIR)):
        if not os.path.lexists(top):
            continue  # tasks/ missing: Reachable reports it; objects/ missing: nothing to do
        # An unreadable directory must not look like an empty one ("removed 0 files").
        for directory, _dirs, files in os.walk(top, onerror=_raise_walk_error):
            for name in files:
                is_temp = parse_temp_name(name) is not None
                if not is_temp and not (is_object_name(name) and top.endswith(OBJECTS_DIR)):
                    continue  # slots, locks, strangers: never gc's to remove
                path = os.path.join(directory, name)
                try:
                    young = os.lstat(path).st_mtime >= cutoff
                except FileNotFoundError:
                    continue  # a writer removed its temp file while gc was listing
                if young:
                    report.kept_young += 1
                    continue
                yield os.path.relpath(path, root), is_temp


def _old_size(path: str, cutoff: float) -> int | None:
    """The size of `path` if it is still older than `cutoff`; None if young or gone."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return info.st_size if info.st_mtime < cutoff else None


def _lost_object(path: str) -> str | None:
    """The object path a temp file in a fan-out directory should have, if it is a whole
    object whose name is missing (a gc killed between a set-aside and its put back)."""
    directory = os.path.dirname(path)
    if os.path.basename(os.path.dirname(directory)) != OBJECTS_DIR:
        return None
    try:
        data = fsread.read_regular(path)
        codec.unframe(data)
    except (CastoreError, OSError, ValueError):
        return None
    object_id = hash_bytes(data)
    target = os.path.join(directory, object_id)
    if not object_id.startswith(os.path.basename(directory)) or os.path.lexists(target):
        return None
    return target


def _remove_temp(
    root: str, full: str, cutoff: float, *, dry_run: bool, report: GcReport
) -> int | None:
    """Remove an old temp file (or give a lost object its name back); its size if removed."""
    size = _old_size(full, cutoff)
    if size is None:
        return None
    target = _lost_object(full)
    if target is not None:
        if not dry_run:
            fd = fsread.open_regular(full)
            try:
                os.fsync(fd)  # a writer's temp file may never have been synced: now it is
            finally:
                os.close(fd)
            fsio.link_new(full, target)
            fsio.fsync_dir(os.path.dirname(full))  # its name back before the temp name goes
        report.restored.append(os.path.relpath(target, root))
    if not dry_run:
        fsio.remove_if_present(full)
    return size


def _collect_batch(
    root: str, batch: list[str], cutoff: float, slots: Reachable, report: GcReport
) -> set[str]:
    """Set a batch of unnamed old objects aside, read the new slots, put back what they
    name (or what became young), unlink the rest; the directories changed."""
    aside: list[tuple[str, str, str, int]] = []
    for relpath in batch:
        full = os.path.join(root, relpath)
        size = _old_size(full, cutoff)
        if size is None:
            continue  # gone, or a writer refreshed it since it was listed
        temp = os.path.join(os.path.dirname(full), temp_name())  # a leftover if gc dies here
        try:
            os.link(full, temp, follow_symlinks=False)
        except FileNotFoundError:
            continue
        aside.append((relpath, full, temp, size))
    # Set aside as link, fsync, unlink rather than rename: a rename is two directory entry
    # changes that a power loss may split, leaving neither name; this way every state after
    # a crash has the object under one name or the other (and the next gc heals a temp one).
    _sync_second_names({os.path.dirname(full) for _, full, _, _ in aside})
    for _, full, _, _ in aside:
        fsio.remove_if_present(full)
    crashpoints.reach("gc.set_aside")
    # A tree or pack set aside is read under its temp name: what a new slot reaches through
    # it is put back with it.
    slots.aside = {os.path.basename(full): temp for _, full, temp, _ in aside}
    try:
        slots.read_new()  # after every set-aside: see the module docstring
    finally:
        slots.aside = {}
    crashpoints.reach("gc.reread")
    touched: set[str] = set()
    for relpath, full, temp, size in aside:
        touched.add(os.path.dirname(full))
        named = slots.unreadable or os.path.basename(full) in slots.referenced
        if named or os.lstat(temp).st_mtime >= cutoff:
            fsio.link_new(temp, full)  # put back (a writer may have stored it again: fine)
            fsio.fsync_dir(os.path.dirname(full))  # the name back before the temp name goes
            fsio.remove_if_present(temp)
            continue
        fsio.remove_if_present(temp)
        report.removed.append(relpath)
        report.bytes_freed += size
    for directory in sorted(touched):
        fsio.fsync_dir(directory)
    return touched


def _sync_second_names(directories: set[str]) -> None:
    """Make the set-aside names durable before the objects' own names go (the power-loss
    self-test removes exactly this step, tests/test_power_loss_gc.py)."""
    for directory in sorted(directories):
        fsio.fsync_dir(directory)


@oserrors.translating
def reachable(path: str | os.PathLike[str]) -> Reachable:
    """Everything the chains of the store at `path` name, directly and through the trees and
    packs they name (one read of every slot): what gc keeps. `.unreadable` says whether that
    is known at all (if not, gc keeps every object)."""
    reach = Reachable(Store.open(path).root, GcReport())
    reach.read_new()
    return reach


@oserrors.translating
def collect(
    path: str | os.PathLike[str],
    *,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    now: float | None = None,
    forget_finished_after: float | None = None,
) -> GcReport:
    """Remove what no chain names and is older than `grace_s` seconds. With
    `forget_finished_after` (seconds), first forget every finished task older than that."""
    if grace_s < 0:
        raise UsageError("the grace period cannot be negative")
    store = Store.open(path)
    root = store.root
    try:
        retired = _retire(store, forget_finished_after, now, dry_run)
        # -- forget hook: a forgotten task's slots go first, so what only they named is
        # unnamed when reachability is read below (reclaim.py) -------------------------
        reclaimed = reclaim.reclaim_forgotten(store, dry_run=dry_run)
        report = _collect(root, grace_s, dry_run, now, restore=store.format_version >= 2)
    except CastoreError:
        raise
    except OSError as exc:
        where = str(exc.filename) if exc.filename is not None else root
        raise StoreIOError(
            where,
            "gc",
            exc,
            "objects gc had set aside were put back or are temp files the next gc puts back",
        ) from exc
    report.forgotten, report.reclaimed = retired, reclaimed
    return report


def _retire(store: Store, after_s: float | None, now: float | None, dry_run: bool) -> list[str]:
    """forget hook (retention.py): the tasks forgot for retention, before reachability is
    read, so that this same gc can reclaim them."""
    if after_s is None:
        return []
    now_ms = int((now if now is not None else time.time()) * 1000)
    return [
        r.task for r in retention.forget_finished(store, after_s, now_ms=now_ms, dry_run=dry_run)
    ]


def _collect(
    root: str, grace_s: float, dry_run: bool, now: float | None, *, restore: bool
) -> GcReport:
    report = GcReport()
    cutoff = (now if now is not None else time.time()) - grace_s
    candidates = list(_candidates(root, cutoff, report))  # listed before reachability is read
    # restore (v2): lost snapshot names come back at this first read, before any decision.
    slots = Reachable(root, report, restore=restore, dry_run=dry_run)
    slots.read_new()
    crashpoints.reach("gc.slots_read")
    touched: set[str] = set()
    doomed: list[str] = []
    for relpath, is_temp in candidates:
        if not is_temp:
            if not slots.unreadable and os.path.basename(relpath) not in slots.referenced:
                doomed.append(relpath)  # an unreadable chain might name anything: keep all
            continue
        full = os.path.join(root, relpath)
        size = _remove_temp(root, full, cutoff, dry_run=dry_run, report=report)
        if size is not None:
            report.removed.append(relpath)
            report.bytes_freed += size
            touched.add(os.path.dirname(full))
    if dry_run:
        for relpath in doomed:
            size = _old_size(os.path.join(root, relpath), cutoff)
            if size is not None:
                report.removed.append(relpath)
                report.bytes_freed += size
        return report
    for start in range(0, len(doomed), BATCH):
        touched -= _collect_batch(root, doomed[start : start + BATCH], cutoff, slots, report)
    for directory in sorted(touched):
        fsio.fsync_dir(directory)
    return report
