"""`castore gc`: remove unreachable objects and leftover temp files older than a grace period.

Safe against a concurrent writer by one rule: nothing younger than the grace period is ever
removed. A writer's new object is young until its commit names it; a writer that finds an
object already present refreshes its mtime (ObjectStore.put) so it is young again, and gc
renames an object aside before its last look at its age, so no refresh can slip in between
that look and the removal. Lock files, chain slots and anything gc cannot classify are never
touched.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import attrs

from castore import codec, fsio
from castore.digest import hash_bytes
from castore.errors import CastoreError, UsageError
from castore.layout import (
    CHAIN_DIR,
    TASKS_DIR,
    is_object_name,
    parse_slot_name,
    parse_temp_name,
    temp_name,
)
from castore.store import Store
from castore.verify import named_ids

DEFAULT_GRACE_S = 14 * 86400


@attrs.define
class GcReport:
    """What gc removed (or, with dry_run, would remove), by relative path."""

    removed: list[str] = attrs.field(factory=list)
    bytes_freed: int = 0
    kept_young: int = 0
    unreadable_tasks: list[str] = attrs.field(factory=list)


def _referenced(root: str, report: GcReport) -> set[str]:
    """Every object id any chain slot names, read from the slots themselves."""
    seen: set[str] = set()
    tasks_dir = os.path.join(root, TASKS_DIR)
    if not os.path.isdir(tasks_dir) or os.path.islink(tasks_dir):
        report.unreadable_tasks.append("<tasks/ is missing or not a directory>")
        return seen
    for task in sorted(os.listdir(tasks_dir)):
        chain = os.path.join(tasks_dir, task, CHAIN_DIR)
        if os.path.islink(os.path.join(tasks_dir, task)) or os.path.islink(chain):
            report.unreadable_tasks.append(task)  # never followed: what it names is unknown
            continue
        if not os.path.isdir(chain):
            continue
        for name in os.listdir(chain):
            if parse_slot_name(name) is None:
                continue
            try:
                data = fsio.read_regular(os.path.join(chain, name))
                entry = codec.decode_value(codec.unframe(data)[1])
            except (CastoreError, OSError, ValueError):
                report.unreadable_tasks.append(task)
                break
            seen.add(hash_bytes(data))
            seen.update(named_ids(entry))
    return seen


def _candidates(root: str, cutoff: float, report: GcReport) -> Iterator[tuple[str, bool]]:
    """(relative path, is_temp) of every object or temp file older than `cutoff`."""
    for name in os.listdir(root):  # an interrupted write of the marker leaves one here
        with contextlib.suppress(FileNotFoundError):
            if parse_temp_name(name) and os.lstat(os.path.join(root, name)).st_mtime < cutoff:
                yield name, True
    for top in (os.path.join(root, "objects"), os.path.join(root, TASKS_DIR)):
        for directory, _dirs, files in os.walk(top):
            for name in files:
                is_temp = parse_temp_name(name) is not None
                if not is_temp and not (is_object_name(name) and top.endswith("objects")):
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


def _remove_if_still_old(path: str, cutoff: float, *, dry_run: bool) -> int | None:
    """Remove `path` if it is still older than `cutoff`; its size, or None if it was kept.

    The object is first renamed aside, and only then is its age read: a writer that
    refreshed it before the rename makes it young (it is put back), and a writer that comes
    after the rename finds the name free and publishes the object again. Between one look
    and the removal no refresh can be lost, as it could with lstat-then-unlink.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if info.st_mtime >= cutoff:
        return None
    if dry_run:
        return info.st_size
    aside = os.path.join(os.path.dirname(path), temp_name())  # a leftover if gc dies here
    try:
        fsio.rename(path, aside)
    except FileNotFoundError:
        return None
    if os.lstat(aside).st_mtime >= cutoff:
        fsio.link_new(aside, path)  # refreshed just before: put it back (unless re-published)
        fsio.remove_if_present(aside)
        fsio.fsync_dir(os.path.dirname(path))
        return None
    fsio.remove_if_present(aside)
    return info.st_size


@fsio.translating
def collect(
    path: str | os.PathLike[str],
    *,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    now: float | None = None,
) -> GcReport:
    """Remove what no chain names and is older than `grace_s` seconds."""
    if grace_s < 0:
        raise UsageError("the grace period cannot be negative")
    root = Store.open(path).root
    report = GcReport()
    cutoff = (now if now is not None else time.time()) - grace_s
    candidates = list(_candidates(root, cutoff, report))  # listed before reachability is read
    referenced = _referenced(root, report)
    touched: set[str] = set()
    for relpath, is_temp in candidates:
        name = os.path.basename(relpath)
        if not is_temp and (report.unreadable_tasks or name in referenced):
            continue  # an unreadable chain might name it: keep every object
        full = os.path.join(root, relpath)
        size = _remove_if_still_old(full, cutoff, dry_run=dry_run or is_temp)
        if size is None:
            continue  # gone, or a writer refreshed it since it was listed
        if is_temp and not dry_run:
            fsio.remove_if_present(full)  # a leftover: nobody refreshes it
        report.removed.append(relpath)
        report.bytes_freed += size
        if not dry_run:
            touched.add(os.path.dirname(full))
    for directory in sorted(touched):
        fsio.fsync_dir(directory)
    return report
