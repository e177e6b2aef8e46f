"""`castore gc`: remove unreachable objects and leftover temp files older than a grace period.

Nothing younger than the grace period is removed, and no object of an acknowledged commit is
ever removed, however long a writer pauses. The second holds by a handshake with the writer
(refs.py), because age alone cannot protect an object whose writer paused longer than the
grace period between publishing it and linking the slot that names it:

1. gc reads every slot, then sets every old object no slot names aside (a second name, a temp
   name, then its own name removed: gone from then on);
2. only then does it read the slots again (those linked since step 1), and puts back every
   set-aside object one of them names, or that became young (a writer refreshed it);
3. only then does it remove the rest.

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

Every step goes through the store's medium, by key (castore.medium.base). On POSIX the
second name is a hard link: the same file, so a writer's refresh of the object shows on it.
On a medium without hard links (`aliases` False) it is a copy, made when gc sets it aside,
so the age that counts is the object's own, looked at once more just before its name goes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import time
from collections.abc import Iterator

from castore import crashpoints
from castore.errors import CastoreError, StoreIOError, UsageError
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import (
    OBJECTS_DIR,
    TASKS_DIR,
    is_object_name,
    parse_temp_name,
    temp_name,
)
from castore.format.model import attrs
from castore.maintenance import reclaim, retention
from castore.maintenance.grace import DEFAULT_GRACE_S
from castore.maintenance.pendingseal import PendingSeals
from castore.maintenance.reach import GcReport, Reachable, listed
from castore.medium import oserrors
from castore.medium.base import Entry, Medium
from castore.store import Store

__all__ = ["BATCH", "DEFAULT_GRACE_S", "GcReport", "Reachable", "collect", "reachable"]

# Objects set aside at once before the slots are read again: bounds how many objects a gc
# killed mid-run leaves under temp names, and how long any of them is away.
BATCH = 1024
# What a gc that fails midway leaves, said with its error.
LEFT_BEHIND = "objects gc had set aside were put back or are temp files the next gc puts back"


def _failed(medium: Medium, key: str, exc: OSError) -> StoreIOError:
    """The error of a look, sync or link of gc's own protocol that failed: it says what gc
    leaves behind."""
    return StoreIOError(medium.where(key), "gc", exc, LEFT_BEHIND)


def _stat(medium: Medium, key: str) -> Entry:
    """What the medium knows of `key` (FileNotFoundError if it is gone)."""
    try:
        return medium.stat(key)
    except FileNotFoundError:
        raise
    except StoreIOError as exc:
        raise _failed(medium, key, exc) from exc


def _candidates(medium: Medium, cutoff: float, report: GcReport) -> Iterator[tuple[str, bool]]:
    """(key, is_temp) of every object or temp file older than `cutoff`."""
    # An interrupted write of the marker leaves one at the top.
    for name in listed(medium, "") or []:
        with contextlib.suppress(FileNotFoundError):
            if parse_temp_name(name) and _stat(medium, name).mtime < cutoff:
                yield name, True
    # tasks/ missing: Reachable reports it; objects/ missing: nothing to do. An unreadable
    # directory must not look like an empty one ("removed 0 files"): walk raises.
    for top in (OBJECTS_DIR, TASKS_DIR):
        for directory, names in medium.walk(top):
            for name in names:
                is_temp = parse_temp_name(name) is not None
                if not is_temp and not (is_object_name(name) and top == OBJECTS_DIR):
                    continue  # slots, locks, strangers: never gc's to remove
                key = f"{directory}/{name}"
                try:
                    young = _stat(medium, key).mtime >= cutoff
                except FileNotFoundError:
                    continue  # a writer removed its temp file while gc was listing
                if young:
                    report.kept_young += 1
                    continue
                yield key, is_temp


def _old_size(medium: Medium, key: str, cutoff: float) -> int | None:
    """The size of `key` if it is still older than `cutoff`; None if young or gone."""
    try:
        entry = _stat(medium, key)
    except FileNotFoundError:
        return None
    return entry.size if entry.mtime < cutoff else None


def _lost_object(medium: Medium, key: str) -> str | None:
    """The object key a temp file in a fan-out directory should have, if it is a whole
    object whose name is missing (a gc killed between a set-aside and its put back)."""
    directory = posixpath.dirname(key)
    if posixpath.basename(posixpath.dirname(directory)) != OBJECTS_DIR:
        return None
    try:
        data = medium.read(key)
        codec.unframe(data)
    except (CastoreError, OSError, ValueError):
        return None
    object_id = hash_bytes(data)
    target = f"{directory}/{object_id}"
    if not object_id.startswith(posixpath.basename(directory)) or medium.exists(target):
        return None
    return target


def _remove_temp(
    medium: Medium, key: str, cutoff: float, *, dry_run: bool, report: GcReport
) -> int | None:
    """Remove an old temp file (or give a lost object its name back); its size if removed."""
    size = _old_size(medium, key, cutoff)
    if size is None:
        return None
    target = _lost_object(medium, key)
    if target is not None:
        if not dry_run and not _name_lost_object(medium, key, target):
            return None  # its writer published it and removed its temp file meanwhile
        report.restored.append(target)
    if not dry_run:
        medium.remove(key)
    return size


def _name_lost_object(medium: Medium, key: str, target: str) -> bool:
    """Give the temp file `key` the object name `target`, durably, before its own name goes;
    False if it vanished first (a writer's temp file: its writer linked it and removed it)."""
    try:
        medium.flush_file(key)  # a writer's temp file may never have been synced
    except FileNotFoundError:
        return False
    except StoreIOError as exc:
        raise _failed(medium, key, exc) from exc
    try:
        medium.link(key, target)  # False: the writer linked it first (the same bytes)
    except FileNotFoundError:
        return False
    except StoreIOError as exc:
        if exc.errno != errno.ENOENT:
            raise
        return False  # POSIX's link: the temp file went after its sync
    medium.flush_dir(posixpath.dirname(key))  # its name back before the temp name goes
    return True


@attrs.frozen
class _Aside:
    """An object set aside: its own key, its set-aside key, its size."""

    key: str
    aside: str
    size: int

    @property
    def directory(self) -> str:
        return posixpath.dirname(self.key)


def _set_aside(medium: Medium, batch: list[str], cutoff: float) -> list[_Aside]:
    """Give each object of `batch` that is still old a second, temp name; make those names
    durable; only then take the objects' own names away. What was set aside.

    Set aside as link, flush, remove rather than rename: a rename is two directory entry
    changes that a power loss may split, leaving neither name; this way every state after a
    crash has the object under one name or the other (and the next gc heals a temp one).
    Without hard links the second name is a copy, whose age is when gc made it: the age that
    counts is the object's own, looked at once more before its name goes (`aliases`)."""
    aside: list[_Aside] = []
    for key in batch:
        size = _old_size(medium, key, cutoff)
        if size is None:
            continue  # gone, or a writer refreshed it since it was listed
        # A leftover if gc dies here.
        second = f"{posixpath.dirname(key)}/{temp_name()}"
        if _link_aside(medium, key, second):
            aside.append(_Aside(key, second, size))
    _sync_second_names(medium, {each.directory for each in aside})
    kept = []
    for each in aside:
        if not medium.aliases and _old_size(medium, each.key, cutoff) is None:
            medium.remove(each.aside)  # refreshed since it was copied: it stays as it is
            continue
        medium.remove(each.key)
        kept.append(each)
    return kept


def _link_aside(medium: Medium, key: str, second: str) -> bool:
    """`key`'s bytes under the new name `second`; False if `key` went meanwhile."""
    try:
        return medium.link(key, second)
    except FileNotFoundError:
        return False
    except StoreIOError as exc:
        if exc.errno == errno.ENOENT:
            return False  # the object went since it was listed
        raise _failed(medium, key, exc) from exc


def _collect_batch(
    medium: Medium, batch: list[str], cutoff: float, slots: Reachable, report: GcReport
) -> set[str]:
    """Set a batch of unnamed old objects aside, read the new slots, put back what they
    name (or what became young), remove the rest; the directories changed."""
    aside = _set_aside(medium, batch, cutoff)
    # A removal sent without an answer (S3) may land later: were it to land after the read
    # of new slots, it could take away an object a writer stored again and committed since,
    # with nobody left to put it back. So it is waited out first (docs/FORMAT.md §19.4).
    medium.settle()
    crashpoints.reach("gc.set_aside")
    # A tree or pack set aside is read under its set-aside key: what a new slot reaches
    # through it is put back with it.
    slots.aside = {posixpath.basename(each.key): each.aside for each in aside}
    try:
        slots.read_new()  # after every set-aside: see the module docstring
    finally:
        slots.aside = {}
    crashpoints.reach("gc.reread")
    touched: set[str] = set()
    for each in aside:
        touched.add(each.directory)
        named = slots.unreadable or posixpath.basename(each.key) in slots.referenced
        if named or _refreshed(medium, each, cutoff):
            medium.link(each.aside, each.key)  # put back (a writer may have stored it again)
            medium.flush_dir(each.directory)  # the name back before the temp name goes
            medium.remove(each.aside)
            continue
        medium.remove(each.aside)
        report.removed.append(each.key)
        report.bytes_freed += each.size
    for directory in sorted(touched):
        medium.flush_dir(directory)
    return touched


def _refreshed(medium: Medium, each: _Aside, cutoff: float) -> bool:
    """True if a writer refreshed the object before its name went: with hard links the
    set-aside name is the same file, so it shows as young. A copy's age is when gc made it:
    the object's own was looked at before its name went (`_set_aside`)."""
    return medium.aliases and _stat(medium, each.aside).mtime >= cutoff


def _sync_second_names(medium: Medium, directories: set[str]) -> None:
    """Make the set-aside names durable before the objects' own names go (the power-loss
    self-test removes exactly this step, tests/test_power_loss_gc.py)."""
    for directory in sorted(directories):
        medium.flush_dir(directory)


@oserrors.translating
def reachable(path: str | os.PathLike[str]) -> Reachable:
    """Everything the chains of the store at `path` name, directly and through the trees and
    packs they name (one read of every slot): what gc keeps. `.unreadable` says whether that
    is known at all (if not, gc keeps every object)."""
    reach = Reachable(Store.open(path).medium, GcReport())
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
        report = _collect(store.medium, grace_s, dry_run, now, restore=store.format_version >= 2)
    except CastoreError:
        raise
    except OSError as exc:
        where = str(exc.filename) if exc.filename is not None else root
        raise StoreIOError(where, "gc", exc, LEFT_BEHIND) from exc
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
    medium: Medium, grace_s: float, dry_run: bool, now: float | None, *, restore: bool
) -> GcReport:
    report = GcReport()
    cutoff = (now if now is not None else time.time()) - grace_s
    candidates = list(_candidates(medium, cutoff, report))  # listed before reachability is read
    # restore (v2): lost snapshot names come back at this first read, before any decision.
    slots = Reachable(medium, report, restore=restore, dry_run=dry_run)
    slots.read_new()
    crashpoints.reach("gc.slots_read")
    touched: set[str] = set()
    doomed: list[str] = []
    pending = PendingSeals(medium)
    for key, is_temp in candidates:
        if not is_temp:
            if slots.unreadable or posixpath.basename(key) in slots.referenced:
                continue  # an unreadable chain might name anything: keep all
            if not pending.holds(key):  # a pack a seal in progress may name: pendingseal.py
                doomed.append(key)
            continue
        size = _remove_temp(medium, key, cutoff, dry_run=dry_run, report=report)
        if size is not None:
            report.removed.append(key)
            report.bytes_freed += size
            touched.add(posixpath.dirname(key))
    report.kept_pending = pending.kept
    if dry_run:
        for key in doomed:
            size = _old_size(medium, key, cutoff)
            if size is not None:
                report.removed.append(key)
                report.bytes_freed += size
        return report
    for start in range(0, len(doomed), BATCH):
        touched -= _collect_batch(medium, doomed[start : start + BATCH], cutoff, slots, report)
    for directory in sorted(touched):
        medium.flush_dir(directory)
    return report
