"""Opening a store: its marker read and judged through the medium, and what a place without
a usable marker is, said so that the user knows what to do (docs/FORMAT.md §3)."""

from __future__ import annotations

import errno

from castore.errors import (
    StoreIOError,
    StoreNotFoundError,
    UnsafeFileError,
)
from castore.format.layout import MARKER_KEY, OBJECTS_DIR, TASKS_DIR
from castore.format.marker import parse_version
from castore.medium.base import Medium


def open_marker(medium: Medium) -> int:
    """The format version of the store `medium` holds; StoreNotFoundError (saying what is
    there instead, and what to do), FormatVersionError, or the medium's own errors."""
    where = medium.where(MARKER_KEY)
    try:
        data = medium.read(MARKER_KEY)
    except FileNotFoundError:
        raise no_marker(medium, "") from None
    except StoreIOError as exc:
        if exc.errno != errno.ENOTDIR:
            raise
        raise StoreNotFoundError(
            medium.url,
            "it is a file, not a directory"
            if _is_file(medium)
            else "a component of it is not a directory",
            "give the path of a store directory",
        ) from None
    except UnsafeFileError as exc:
        raise StoreNotFoundError(medium.url, f"{where} is a {exc.found}") from None
    except OSError as exc:
        raise StoreIOError(where, "reading the store marker", exc) from exc
    # A symlinked directory inside the store would let commits write outside it.
    for directory in (OBJECTS_DIR, TASKS_DIR):
        medium.require_dir(directory)
    if not data:
        raise no_marker(medium, f"{where} is empty")
    version = parse_version(data, where)
    if version is None:
        raise StoreNotFoundError(medium.url, f"{where} is not castore's")
    return version


def _is_file(medium: Medium) -> bool:
    try:
        return medium.stat("").regular
    except OSError:
        return False


def no_marker(medium: Medium, empty: str) -> StoreNotFoundError:
    """What a place without a (usable) marker is, and what to do about it."""
    root, where = medium.url, medium.where(MARKER_KEY)
    if medium.is_void():
        return StoreNotFoundError(root)  # nothing there yet: init makes a store of it
    found = medium.interrupted_init(but_marker=bool(empty))
    if empty and found is None:
        # Only the empty marker beside init's directories: not written by castore.
        return StoreNotFoundError(
            root,
            f"{empty}, and nothing else is there but empty directories",
            f"remove {where}, then `castore init {root}` completes the store",
        )
    if found is None:
        return StoreNotFoundError(
            root,
            "an interrupted `castore init`: no castore.json yet, only the empty "
            "directories init makes",
            f"`castore init {root}` (or Store.open(..., create=True)) completes it",
        )
    objects, tasks = medium.content_counts()
    if objects or tasks:
        what = empty or f"{where} is missing"
        return StoreNotFoundError(
            root,
            f"{what}, but objects/ holds {objects} file(s) and tasks/ {tasks} task(s): "
            "the marker was deleted or damaged",
            "if this is a castore store, restore castore.json from a backup (its 33 bytes "
            'are {"format":"castore","version":2} and a newline, or 1 for a store older '
            "than castore 0.2, docs/FORMAT.md §3), then "
            f"run `castore fsck {root}`; `castore fsck` shows what is there meanwhile",
        )
    return StoreNotFoundError(
        root,
        empty or f"the directory is not empty: {found}",
        "castore init needs a new or empty directory; choose another path, or point "
        "--store / $CASTORE_STORE at an existing store",
    )
