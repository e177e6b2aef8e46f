"""fsck's walk of the store tree: what each directory entry is, before anything is read."""

from __future__ import annotations

import functools
import os
import re
import stat
import time
from collections.abc import Iterator

import attrs

from castore.format.layout import (
    MARKER_NAME,
    OBJECTS_DIR,
    QUARANTINE_DIR,
    TASKS_DIR,
    is_object_name,
    parse_temp_name,
)
from castore.maintenance.fsck.findings import Finding
from castore.medium import posixinit as storeinit
from castore.medium.oserrors import file_kind

_FANOUT = re.compile(r"[0-9a-f]{2}")
_TOP_LEVEL = {MARKER_NAME, OBJECTS_DIR, TASKS_DIR, QUARANTINE_DIR}


@attrs.define
class Inventory:
    """The object files found, by id, and the findings the walk itself made."""

    # object id -> inode number, of each file named by an object id in its own fan-out
    # directory (its path is layout.object_relpath(id))
    inodes: dict[str, int] = attrs.field(factory=dict)
    temp_inodes: set[int] = attrs.field(factory=set)  # leftover temp files in fan-out dirs
    findings: list[Finding] = attrs.field(factory=list)


def _age(path: str) -> str:
    try:
        seconds = time.time() - os.lstat(path).st_mtime
    except OSError:
        return "unknown age"
    return f"{seconds / 3600:.1f} h old" if seconds >= 3600 else f"{seconds:.0f} s old"


def temp_finding(root: str, relpath: str) -> Finding:
    host_pid = parse_temp_name(os.path.basename(relpath))
    writer = f"written by {host_pid[0]} pid {host_pid[1]}, " if host_pid else ""
    return Finding("temp-file", relpath, f"{writer}{_age(os.path.join(root, relpath))}")


def walk_top(root: str) -> Iterator[Finding]:
    """Entries at the top of the store that castore did not write."""
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if parse_temp_name(entry.name):
            yield temp_finding(root, entry.name)  # e.g. an interrupted write of the marker
        elif entry.name not in _TOP_LEVEL:
            yield Finding("unknown-file", entry.name, "not part of a castore store")
        elif entry.name != MARKER_NAME and not entry.is_dir(follow_symlinks=False):
            kind = file_kind(entry.stat(follow_symlinks=False).st_mode)
            yield Finding("unsafe-file", entry.name, f"a {kind} where a directory belongs")


def missing_directories(root: str) -> Iterator[Finding]:
    """objects/ and tasks/ must exist (as real directories: walk_top reports anything else)."""
    for name in (OBJECTS_DIR, TASKS_DIR):
        if not os.path.lexists(os.path.join(root, name)):
            yield Finding("missing-directory", name, f"the store has no {name}/ directory")


def walk_objects(root: str) -> Inventory:
    """Every file under objects/, classified: object, temp file, or something else."""
    inventory = Inventory()
    objects_dir = os.path.join(root, OBJECTS_DIR)
    if not os.path.isdir(objects_dir) or os.path.islink(objects_dir):
        return inventory  # missing_directories / walk_top report it
    for fanout in sorted(os.scandir(objects_dir), key=lambda e: e.name):
        relfan = f"{OBJECTS_DIR}/{fanout.name}"
        if fanout.is_symlink():
            inventory.findings.append(Finding("unsafe-file", relfan, "a symlink; never followed"))
            continue
        if not _FANOUT.fullmatch(fanout.name) or not fanout.is_dir(follow_symlinks=False):
            inventory.findings.append(Finding("bad-fanout", relfan, "not a fan-out directory"))
            continue
        _walk_fanout(root, fanout, relfan, inventory)
    return inventory


@functools.cache
def _object_names(fanout: str) -> re.Pattern[str]:
    """Lines of object ids that belong in fan-out directory `fanout` (two hex digits)."""
    return re.compile(f"(?:{fanout}[0-9a-f]{{62}}\n)*")


def _walk_fanout(root: str, fanout: os.DirEntry[str], relfan: str, inventory: Inventory) -> None:
    """One fan-out directory: objects indexed (the common case, tested first), anything else
    a finding, in name order."""
    entries = list(os.scandir(fanout.path))
    names = [entry.name for entry in entries]
    # The common case in one regex call: every name is an object id of this directory (one
    # line each: a name with a newline in it would make more lines than names).
    joined = "\n".join(names) + "\n" if names else ""
    if len(joined) == 65 * len(names) and _object_names(fanout.name).fullmatch(joined):
        inventory.inodes.update(zip(names, [entry.inode() for entry in entries], strict=True))
        return
    inodes = inventory.inodes
    findings: list[Finding] = []
    for entry in entries:
        name = entry.name
        if len(name) == 64 and name.startswith(fanout.name) and is_object_name(name):
            inodes[name] = entry.inode()  # from the directory read: free
            continue
        relpath = f"{relfan}/{name}"
        if is_object_name(name):  # in the wrong fan-out directory
            # Never indexed: a copy here must not hide (or stand in for) the real one.
            message = f"object {name} is not in objects/{name[:2]}/"
            findings.append(Finding("misplaced-object", relpath, message, name))
        elif parse_temp_name(name):
            findings.append(temp_finding(root, relpath))
            inventory.temp_inodes.add(entry.inode())
        else:
            mode = entry.stat(follow_symlinks=False).st_mode
            what = "a file" if stat.S_ISREG(mode) else f"a {file_kind(mode)}"
            findings.append(Finding("stray-file", relpath, f"{what} not named by an object id"))
    inventory.findings.extend(sorted(findings, key=lambda finding: finding.path))


def marker_finding(root: str) -> tuple[Finding, bool] | None:
    """For a directory whose castore.json is missing or empty: the finding, and whether the
    rest of the store is worth checking. None if it is no castore store at all (no objects/
    and no tasks/ of its own, or a marker that is something else): fsck refuses to run."""
    marker = os.path.join(root, MARKER_NAME)
    try:
        info = os.lstat(marker)
    except FileNotFoundError:
        info = None
    except OSError:
        return None
    if info is not None and not (stat.S_ISREG(info.st_mode) and info.st_size == 0):
        return None  # a marker that is not castore's, or a symlink: the open's error says it
    if info is None and not storeinit.listdir(root):
        return None  # an empty directory: no store, and nothing castore made
    if info is None and storeinit.leftovers_only(root) is None:
        message = (
            "no castore.json, only the empty directories init makes: an interrupted "
            f"`castore init`; run `castore init {root}` to complete it"
        )
        return Finding("interrupted-init", MARKER_NAME, message), False
    shaped = [
        name
        for name in (OBJECTS_DIR, TASKS_DIR)
        if os.path.isdir(os.path.join(root, name)) and not os.path.islink(os.path.join(root, name))
    ]
    if not shaped:
        return None
    objects, tasks = storeinit.content_counts(root)
    what = "empty" if info is not None else "missing"
    message = (
        f"castore.json is {what}, and objects/ holds {objects} file(s), tasks/ {tasks} "
        "task(s); restore castore.json from a backup (33 bytes, docs/FORMAT.md §3)"
    )
    return Finding("missing-marker", MARKER_NAME, message), True
