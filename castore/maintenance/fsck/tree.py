"""fsck's walk of the store tree: what each directory entry is, before anything is read."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator

from castore.format.layout import (
    MARKER_NAME,
    OBJECTS_DIR,
    QUARANTINE_DIR,
    TASKS_DIR,
    is_object_name,
    parse_temp_name,
)
from castore.format.model import attrs
from castore.maintenance.fsck.findings import Finding
from castore.medium.base import Medium

_FANOUT = re.compile(r"[0-9a-f]{2}")
_TOP_LEVEL = {MARKER_NAME, OBJECTS_DIR, TASKS_DIR, QUARANTINE_DIR}


@attrs.define
class Inventory:
    """The object files found, by id, and the findings the walk itself made."""

    # object id -> inode number (None: the medium has no inodes), of each file named by an
    # object id in its own fan-out directory (its path is layout.object_relpath(id))
    inodes: dict[str, int | None] = attrs.field(factory=dict)
    temp_inodes: set[int | None] = attrs.field(factory=set)  # leftover temp files in fan-out dirs
    findings: list[Finding] = attrs.field(factory=list)


def _age(medium: Medium, key: str) -> str:
    try:
        seconds = time.time() - medium.stat(key).mtime
    except OSError:
        return "unknown age"
    return f"{seconds / 3600:.1f} h old" if seconds >= 3600 else f"{seconds:.0f} s old"


def temp_finding(medium: Medium, relpath: str) -> Finding:
    host_pid = parse_temp_name(relpath.rsplit("/", 1)[-1])
    writer = f"written by {host_pid[0]} pid {host_pid[1]}, " if host_pid else ""
    return Finding("temp-file", relpath, f"{writer}{_age(medium, relpath)}")


def walk_top(medium: Medium) -> Iterator[Finding]:
    """Entries at the top of the store that castore did not write."""
    for entry in sorted(medium.scan(""), key=lambda e: e.name):
        if entry.name in medium.private_names:
            continue  # the medium's own (an S3 store's record of its endpoint)
        if parse_temp_name(entry.name):
            yield temp_finding(medium, entry.name)  # e.g. an interrupted write of the marker
        elif entry.name not in _TOP_LEVEL:
            yield Finding("unknown-file", entry.name, "not part of a castore store")
        elif entry.name != MARKER_NAME and entry.kind != "directory":
            yield Finding("unsafe-file", entry.name, f"a {entry.kind} where a directory belongs")


def missing_directories(medium: Medium) -> Iterator[Finding]:
    """objects/ and tasks/ must exist (as real directories: walk_top reports anything else).
    Where a directory is a key prefix (S3), an empty one is no directory: nothing to miss."""
    if not medium.directories:
        return
    for name in (OBJECTS_DIR, TASKS_DIR):
        if not medium.exists(name):
            yield Finding("missing-directory", name, f"the store has no {name}/ directory")


def is_directory(medium: Medium, key: str) -> bool:
    """True if `key` is a directory itself (a symlink to one is not)."""
    try:
        return medium.stat(key).kind == "directory"
    except FileNotFoundError:
        return False


def walk_objects(medium: Medium) -> Inventory:
    """Every file under objects/, classified: object, temp file, or something else."""
    inventory = Inventory()
    if not is_directory(medium, OBJECTS_DIR):
        return inventory  # missing_directories / walk_top report it
    for fanout in sorted(medium.scan(OBJECTS_DIR), key=lambda e: e.name):
        relfan = f"{OBJECTS_DIR}/{fanout.name}"
        if fanout.kind == "symlink":
            inventory.findings.append(Finding("unsafe-file", relfan, "a symlink; never followed"))
            continue
        if not _FANOUT.fullmatch(fanout.name) or fanout.kind != "directory":
            inventory.findings.append(Finding("bad-fanout", relfan, "not a fan-out directory"))
            continue
        _walk_fanout(medium, fanout.name, relfan, inventory)
    return inventory


@functools.cache
def _object_names(fanout: str) -> re.Pattern[str]:
    """Lines of object ids that belong in fan-out directory `fanout` (two hex digits)."""
    return re.compile(f"(?:{fanout}[0-9a-f]{{62}}\n)*")


def _walk_fanout(medium: Medium, fanout: str, relfan: str, inventory: Inventory) -> None:
    """One fan-out directory: objects indexed (the common case, tested first), anything else
    a finding, in name order."""
    entries = medium.names_and_inodes(relfan)
    names = [name for name, _ in entries]
    # The common case in one regex call: every name is an object id of this directory (one
    # line each: a name with a newline in it would make more lines than names).
    joined = "\n".join(names) + "\n" if names else ""
    if len(joined) == 65 * len(names) and _object_names(fanout).fullmatch(joined):
        inventory.inodes.update(entries)
        return
    inodes = inventory.inodes
    findings: list[Finding] = []
    for name, inode in entries:
        if len(name) == 64 and name.startswith(fanout) and is_object_name(name):
            inodes[name] = inode  # from the directory read: free
            continue
        relpath = f"{relfan}/{name}"
        if is_object_name(name):  # in the wrong fan-out directory
            # Never indexed: a copy here must not hide (or stand in for) the real one.
            message = f"object {name} is not in objects/{name[:2]}/"
            findings.append(Finding("misplaced-object", relpath, message, name))
        elif parse_temp_name(name):
            findings.append(temp_finding(medium, relpath))
            inventory.temp_inodes.add(inode)
        else:
            kind = medium.stat(relpath).kind
            what = "a file" if kind == "regular file" else f"a {kind}"
            findings.append(Finding("stray-file", relpath, f"{what} not named by an object id"))
    inventory.findings.extend(sorted(findings, key=lambda finding: finding.path))


def marker_finding(medium: Medium) -> tuple[Finding, bool] | None:
    """For a store whose castore.json is missing or empty: the finding, and whether the
    rest of the store is worth checking. None if it is no castore store at all (no objects/
    and no tasks/ of its own, or a marker that is something else): fsck refuses to run."""
    try:
        info = medium.stat(MARKER_NAME)
    except FileNotFoundError:
        info = None
    except OSError:
        return None
    if info is not None and not (info.regular and info.size == 0):
        return None  # a marker that is not castore's, or a symlink: the open's error says it
    if info is None and medium.is_void():
        return None  # an empty directory: no store, and nothing castore made
    if info is None and medium.interrupted_init() is None:
        message = (
            "no castore.json, only the empty directories init makes: an interrupted "
            f"`castore init`; run `castore init {medium.url}` to complete it"
        )
        return Finding("interrupted-init", MARKER_NAME, message), False
    if not any(is_directory(medium, name) for name in (OBJECTS_DIR, TASKS_DIR)):
        return None
    objects, tasks = medium.content_counts()
    what = "empty" if info is not None else "missing"
    message = (
        f"castore.json is {what}, and objects/ holds {objects} file(s), tasks/ {tasks} "
        "task(s); restore castore.json from a backup (33 bytes, docs/FORMAT.md §3)"
    )
    return Finding("missing-marker", MARKER_NAME, message), True
