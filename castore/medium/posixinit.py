"""Creating a store so that a kill anywhere leaves something the next init completes.

Init works in place and writes the marker last, and every step is one that a second init
(after a crash, or racing this one) can repeat: a mkdir that finds its directory, a marker
publish that finds the marker. What an interrupted init leaves is recognised exactly (see
`leftovers_only`), so the next `init` or `open(create=True)` completes it, and a directory
with anything else in it (a user's files, a store whose marker was deleted) is never adopted.
"""

from __future__ import annotations

import os
import re
import stat

from castore import crashpoints
from castore.errors import CastoreError, DurabilityError, StoreIOError
from castore.format.layout import MARKER_NAME, OBJECTS_DIR, TASKS_DIR, Layout, parse_temp_name
from castore.format.marker import MARKER_BYTES
from castore.medium import fsio, oserrors

_FANOUT = re.compile(r"[0-9a-f]{2}")


def build(root: str, marker: bytes) -> None:
    """Create (or complete) the store at `root`; the marker (these bytes) last. Safe to
    repeat. A v1 marker makes a v1 store, as castore 0.1.x did (the golden stores' generator)."""
    layout = Layout(root)
    try:
        fsio.make_dirs_durable(layout.root)
        crashpoints.reach("init.root")
        # Empty: a fan-out directory is made by the first put of an id it holds, as git does,
        # so a small store (or a test's) is not 256 directories to list, check and remove.
        fsio.make_dir_durable(layout.objects)
        fsio.make_dir_durable(layout.tasks)
        crashpoints.reach("init.tasks")
        # Last: a directory without it is an interrupted init, which the next init completes.
        fsio.publish_file(layout.root, MARKER_NAME, marker)
    except DurabilityError as exc:  # a mkdir, a flush or the marker's publish
        cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        raise _not_created(exc.path, cause, layout.root) from exc
    except CastoreError:
        raise  # UnsafeFileError: it says what is in the way
    except OSError as exc:
        where = exc.filename if exc.filename is not None else layout.root
        raise _not_created(str(where), exc, layout.root) from exc


def _not_created(where: str, cause: OSError, root: str) -> StoreIOError:
    return StoreIOError(
        where,
        "creating the store at",
        cause,
        f"the store is not created yet; once the cause is fixed, `castore init {root}` "
        "completes it",
    )


def leftovers_only(root: str, *, but_marker: bool = False) -> str | None:
    """None if `root` is absent, or a directory holding nothing but what an interrupted init
    of castore leaves: `objects/` with empty fan-out directories only (castore made all 256
    at init until 2026-12-04), an empty `tasks/`, and temp files no longer than the marker at the
    top (its publish). Otherwise a short description of the first other thing found (the
    marker itself included, unless `but_marker`)."""
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreIOError(root, "looking at", exc) from exc
    if not stat.S_ISDIR(info.st_mode):
        return f"{root} is a {oserrors.file_kind(info.st_mode)}, not a directory"
    for name in sorted(listdir(root)):
        if but_marker and name == MARKER_NAME:
            continue
        path = os.path.join(root, name)
        try:
            found = _foreign(path, name)
        except StoreIOError:
            raise
        except OSError as exc:
            raise StoreIOError(path, "looking at", exc) from exc
        if found is not None:
            return found
    return None


def _foreign(path: str, name: str) -> str | None:
    """What is not an interrupted init's about this top-level entry, or None."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None  # a concurrent init's temp file, gone already
    if name == MARKER_NAME:
        return f"it has a {MARKER_NAME}"
    if parse_temp_name(name):
        ours = stat.S_ISREG(info.st_mode) and info.st_size <= len(MARKER_BYTES)
        return None if ours else f"it holds {name}, which is not a temp file of the marker"
    if name not in (OBJECTS_DIR, TASKS_DIR) or not stat.S_ISDIR(info.st_mode):
        return f"it holds {name!r}"
    entries = sorted(listdir(path))
    if name == TASKS_DIR:
        return f"{TASKS_DIR}/ holds {entries[0]!r}" if entries else None
    return next(filter(None, (_foreign_fanout(path, entry) for entry in entries)), None)


def _foreign_fanout(objects: str, entry: str) -> str | None:
    """None if `objects/<entry>` is an empty fan-out directory, else what it is."""
    sub = os.path.join(objects, entry)
    if not _FANOUT.fullmatch(entry) or not stat.S_ISDIR(os.lstat(sub).st_mode):
        return f"{OBJECTS_DIR}/ holds {entry!r}"
    inside = listdir(sub)
    return f"{OBJECTS_DIR}/{entry}/ holds {min(inside)!r}" if inside else None


def listdir(path: str) -> list[str]:
    """The names in directory `path` ([] if it is gone); StoreIOError if it cannot be read."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreIOError(path, "listing", exc) from exc


def content_counts(root: str) -> tuple[int, int]:
    """(files under objects/, entries of tasks/): what a store whose marker is gone holds."""
    objects = 0
    for _directory, _dirs, files in os.walk(os.path.join(root, OBJECTS_DIR)):
        objects += len(files)
    return objects, len(listdir(os.path.join(root, TASKS_DIR)))
