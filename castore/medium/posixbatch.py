"""A batch of objects on a POSIX medium (FORMAT.md 9.2): written as unsynced temp files, then
published together, one `syncfs` for all their bytes, their links, one `syncfs` for all
their names; early, when a commit inside the block publishes it with its snapshot.
"""

from __future__ import annotations

import errno
import threading
from typing import Protocol

from castore import crashpoints
from castore.errors import DurabilityError
from castore.format.layout import OBJECTS_DIR
from castore.medium import fsio
from castore.medium.groupflush import GroupFlush


class Host(Protocol):
    """What a batch needs of its medium (castore.medium.posix.PosixMedium)."""

    root: str

    @property
    def flush(self) -> GroupFlush: ...

    def path(self, key: str) -> str: ...


# Names a batch linked, or found there already, before its names flush failed: not known to be
# durable. Kept for the whole process (every medium opened on the store: FORMAT.md 9.2), and
# for its life: whoever relies on one (PosixMedium.touch: a commit's hold, a put that finds
# it) flushes its directory first, every time.
_UNSURE: set[str] = set()
_UNSURE_LOCK = threading.Lock()


def name_unsure(path: str) -> bool:
    """True if `path` is a name a failed batch left (see _UNSURE)."""
    if not _UNSURE:
        return False
    with _UNSURE_LOCK:
        return path in _UNSURE


OBJECT_KEYS = OBJECTS_DIR + "/"


class Batch:
    """Objects written as unsynced temp files, waiting for the batch's end (batch()).
    `existed`: (key, bytes) of the names that were there already when the batch linked them:
    the caller checks what they hold (ObjectStore does, as for any create that finds its
    name) and publishes the bytes again if the name went meanwhile."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self._temps: list[tuple[str, str, str]] = []  # temp path, final path, key
        self.existed: list[tuple[str, bytes]] = []

    def add(self, medium: Host, key: str, directory: str, data: bytes) -> bool:
        if key in self.data:
            return True
        fsio.require_real_directory(directory)
        try:
            temp = fsio.write_temp(directory, data, sync=_later)
        except FileNotFoundError:
            # Made on first use (gc or a person may remove it); the batch's first syncfs makes
            # its name durable before any name is linked in it.
            fsio.make_dir(directory)
            temp = fsio.write_temp(directory, data, sync=_later)
        self.data[key] = data
        self._temps.append((temp, medium.path(key), key))
        return True

    def discard(self) -> None:
        for temp, _, _ in self._temps:
            fsio.discard(temp)

    def publish(self, medium: Host) -> None:
        """Data durable, then names, then names durable; a failed flush publishes nothing
        more and raises (rule O4: the temp files go, never synced again). The batch is then
        empty: a commit inside the block publishes it early (publish_batch), and the block
        goes on. Nothing to publish, no flush."""
        temps = self._temps
        if not temps:
            return
        try:
            _sync_all(medium, "syncing a batch's bytes")
            for temp, final, key in temps:
                try:
                    created = fsio.link_new(temp, final)
                except DurabilityError as exc:
                    if exc.errno != errno.ENOENT:
                        raise
                    created = False  # its directory or temp went (gc): the caller republishes
                crashpoints.reach("object.linked")
                if not created:
                    self.existed.append((key, self.data[key]))
            _sync_all(medium, "syncing a batch's names")
        except BaseException:
            with _UNSURE_LOCK:  # named (by it or before it), never flushed since
                _UNSURE.update(final for _, final, _ in temps)
            raise
        finally:
            self.discard()
            self._temps, self.data = [], {}
        for _ in temps:
            crashpoints.reach("object.published")  # as many arrivals as a create of each


def _sync_all(medium: Host, operation: str) -> None:
    """One syncfs of the store's filesystem; DurabilityError naming `operation` if it fails."""
    try:
        medium.flush.filesystem()
    except OSError as exc:
        raise DurabilityError(medium.root, operation, exc) from exc


def _later(fd: int, path: str) -> None:
    """A batch's temp file is flushed with the others at the batch's end (one syncfs)."""
    del fd, path
