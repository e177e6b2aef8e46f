"""The POSIX directory as castore's medium: keys are relative paths under the store's root.

Exclusive create is `link()` of a complete, fsynced temp file (or `O_CREAT|O_EXCL`); a name is
made durable by an fsync of its directory; both go through the process's group flush of the
filesystem (groupflush.py), which shares them between concurrent commits where the flush
policy trusts `syncfs`. Every system call is fsio's, so errors carry their path and errno.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import threading
from collections.abc import Callable, Iterator

from castore import crashpoints
from castore.errors import DurabilityError, StoreIOError
from castore.format.layout import TMP_PREFIX
from castore.format.limits import MAX_OBJECT_SIZE
from castore.medium import fsio, fsread, groupflush, oserrors, posixinit, setaside, tasklock
from castore.medium.base import Entry, Judge, Medium, SetAside
from castore.medium.mountinfo import names_are_coherent
from castore.medium.posixbatch import OBJECT_KEYS, Batch, name_unsure
from castore.medium.tasklock import HeldLock, TaskLock

# gc may remove a snapshot object between its publish and the link only if the writer
# paused longer than the grace period; each try publishes it anew.
_CLAIM_TRIES = 3
# A chain directory at most this large (st_size: ~340 slot names on ext4, ~400 on tmpfs) is
# listed to find HEAD; a larger one is searched with lstat (FORMAT.md 9.4).
LIST_BELOW = 8192


class PosixMedium(Medium):
    """A store in a directory of a local or shared filesystem."""

    kind = "posix"
    frees_names = True

    def __init__(self, root: str) -> None:
        self.root = root
        self.url = root
        self._prefix = root + os.sep
        self._flush: groupflush.GroupFlush | None = None
        self._coherent: bool | None = None
        self._batches = threading.local()  # the open batch of each thread (batch())

    @functools.cached_property
    def identity(self) -> str:
        """The store directory's device and inode: one directory reached by two paths (a
        symlink, a relative path from another working directory) is one store."""
        with oserrors.translated(self.root, "looking up the store directory"):
            found = os.stat(self.root)
        return f"posix:{found.st_dev}:{found.st_ino}"

    def path(self, key: str) -> str:
        """The filesystem path of `key` (for messages, and for the POSIX-only tools)."""
        return self._prefix + key if key else self.root

    @property
    def flush(self) -> groupflush.GroupFlush:
        """The flushes of this store's filesystem, shared by the process (groupflush.py)."""
        if self._flush is None:
            self._flush = groupflush.for_store(self.root)
        return self._flush

    # -- reading ---------------------------------------------------------------------------
    def read(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes:
        return fsread.read_regular(self.path(key), limit)

    def read_fresh(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes:
        return fsread.read_uncached(self.path(key), limit)

    def read_head(self, key: str, size: int) -> bytes:
        return fsread.read_prefix(self.path(key), size)

    def hash(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> str:
        return fsread.hash_regular(self.path(key), limit)

    def exists(self, key: str) -> bool:
        return fsread.exists(self.path(key))

    def still_named(self, key: str) -> bool:
        """A lookup on a local filesystem; elsewhere a listing of its directory too, since a
        client may go on finding a name another client removed (its lookup is served from
        cache, a listing reaches the server)."""
        path = self.path(key)
        try:
            if not fsread.exists(path):
                return False
        except StoreIOError as exc:
            if exc.errno != errno.ESTALE:
                raise
            return False
        if self.names_are_coherent():
            return True
        try:
            return os.path.basename(path) in fsread.list_names(os.path.dirname(path))
        except FileNotFoundError:
            return False

    def names(self, key: str) -> list[str]:
        return fsread.list_names(self.path(key))

    def names_if_small(self, key: str) -> list[str] | None:
        """One listing of a directory whose st_size is at most LIST_BELOW bytes (ext4 and
        tmpfs: a few hundred names), which costs less than the O(log n) lookups it replaces."""
        below = LIST_BELOW
        path = self.path(key)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                return None  # the lookups say what a file in a directory's place means
            raise oserrors.io_error(path, "looking up", exc) from exc
        if not stat.S_ISDIR(info.st_mode):
            fsio.require_real_directory(path)  # raises, naming what is there instead
        if info.st_size > below:
            return None
        try:
            return fsread.list_names(path)
        except FileNotFoundError:
            return []

    def scan(self, key: str) -> list[Entry]:
        path = self.path(key)
        found = []
        with oserrors.translated(path, "listing the directory"):
            entries = list(os.scandir(path))
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while listed
            found.append(fsread.entry_of(entry.name, info))
        return found

    def stat(self, key: str) -> Entry:
        path = self.path(key)
        with oserrors.translated(path, "looking up"):
            info = os.lstat(path)
        return fsread.entry_of(os.path.basename(path), info)

    def same_file(self, key: str, other: str) -> bool:
        # Two lstats and no Entry: asked of each of the 4,096 slots a seal prunes.
        try:
            first, second = os.lstat(self.path(key)), os.lstat(self.path(other))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise oserrors.io_error(self.path(key), "looking up", exc) from exc
        return (first.st_ino, first.st_dev) == (second.st_ino, second.st_dev)

    def read_entry(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, Entry]:
        path = self.path(key)
        data, info = fsread.read_regular_with_stat(path, limit)
        return data, fsread.entry_of(os.path.basename(path), info)

    @contextlib.contextmanager
    def reader(self, key: str) -> Iterator[Callable[[str], tuple[bytes, Entry]]]:
        """The directory opened once (never through a symlink); if it cannot be, each read
        goes by its path, and says why it fails."""
        try:
            dir_fd = fsread.open_directory(self.path(key))
        except OSError:
            prefix = f"{key}/" if key else ""
            yield lambda name: self.read_entry(prefix + name)
            return

        def read(name: str) -> tuple[bytes, Entry]:
            data, info = fsread.read_in(dir_fd, name)
            return data, fsread.entry_of(name, info)

        try:
            yield read
        finally:
            fsread.close_read(dir_fd)

    def names_and_inodes(self, key: str) -> list[tuple[str, int | None]]:
        path = self.path(key)
        with oserrors.translated(path, "listing the directory"):
            return [(entry.name, entry.inode()) for entry in os.scandir(path)]

    def lock_held(self, key: str) -> bool:
        return tasklock.held(self.path(key))

    def set_aside(self, key: str, target: str, still_bad: Judge) -> SetAside:
        return "moved" if setaside.set_aside(self.root, key, target, still_bad) else "kept"

    # -- writing ---------------------------------------------------------------------------
    def create(
        self, key: str, data: bytes, *, sync_name: bool = True, mode: int = fsio.OBJECT_MODE
    ) -> bool:
        opened: Batch | None = getattr(self._batches, "open", None)
        directory, name = os.path.split(self.path(key))
        # Objects only: a mark's or a lock's create is an exclusive create that must answer
        # now (a seal inside the block, as a commit inside it may make, moves a mark).
        if opened is not None and key.startswith(OBJECT_KEYS):
            return opened.add(self, key, directory, data)
        return self._publish_now(directory, name, data, sync_name=sync_name, mode=mode)

    def _publish_now(
        self, directory: str, name: str, data: bytes, *, sync_name: bool, mode: int
    ) -> bool:
        flush = self.flush
        return fsio.publish_file(
            directory,
            name,
            data,
            mode,
            sync=flush.file,
            sync_dir=flush.directory,
            name_durable=sync_name,
        )

    def claim(self, key: str, data: bytes, *, alias_of: str, alias_durable: bool) -> bool:
        """The snapshot's object first (its bytes fsynced; its name synced only in a v1 store,
        FORMAT.md 9.3 step 2), then `link()` of it as the slot: one inode, two names. Never
        part of a batch (a commit inside one publishes its snapshot with the batch first and
        links it: castore.chain.refs)."""
        source, target = self.path(alias_of), self.path(key)
        fanout = os.path.dirname(source)
        for _ in range(_CLAIM_TRIES):
            fsio.require_real_directory(fanout)
            try:
                self._publish_now(
                    fanout,
                    os.path.basename(source),
                    data,
                    sync_name=alias_durable,
                    mode=fsio.OBJECT_MODE,
                )
            except FileNotFoundError:
                fsio.make_dir_durable(fanout)  # made on first use; gc or a person may remove it
                continue
            crashpoints.reach("commit.before_link")
            try:
                return fsio.link_new(source, target)
            except DurabilityError as exc:
                if exc.errno != errno.ENOENT or os.path.lexists(source):
                    raise
                if not os.path.isdir(os.path.dirname(target)):
                    raise
                # gc removed the object before the link (a long pause): store it anew
        raise FileNotFoundError(errno.ENOENT, "the snapshot's object kept vanishing", source)

    def link(self, source: str, key: str) -> bool:
        return fsio.link_new(self.path(source), self.path(key))

    def flush_dir(self, key: str) -> None:
        self.flush.directory(self.path(key))

    def remove(self, key: str) -> None:
        fsio.remove_if_present(self.path(key))

    def make_dir(self, key: str) -> bool:
        return fsio.make_dir_durable(self.path(key))

    def require_dir(self, key: str) -> None:
        fsio.require_real_directory(self.path(key))

    def touch(self, key: str) -> bool:
        path = self.path(key)
        # A name a failed batch left (posixbatch.name_unsure): its directory flushed first,
        # at every reliance (kept: a later failed batch may name it again meanwhile).
        if name_unsure(path) and os.path.lexists(path):
            self.flush.directory(os.path.dirname(path))
        return fsio.refresh_mtime(path)

    def replace(self, key: str, data: bytes) -> None:
        directory, name = os.path.split(self.path(key))
        fsio.replace_file(directory, name, data)

    @contextlib.contextmanager
    def batch(self) -> Iterator[list[tuple[str, bytes]]]:
        """Objects created in this thread inside the block are published together when it
        ends: their bytes written first, one syncfs for all of them, then their names, then
        one syncfs for the names (FORMAT.md 9.2, batches). Where flushes are not shared (FUSE,
        NFS: flushpolicy.py) each create publishes itself, as outside a block. An error inside
        the block publishes nothing."""
        if getattr(self._batches, "open", None) is not None or not self.flush.policy.shared:
            yield []  # nested, or nothing to share
            return
        opened = self._batches.open = Batch()
        try:
            yield opened.existed
        except BaseException:
            opened.discard()
            raise
        finally:
            self._batches.open = None
        opened.publish(self)

    def pending(self, key: str) -> bytes | None:
        opened: Batch | None = getattr(self._batches, "open", None)
        return None if opened is None else opened.data.get(key)

    def batch_open(self) -> bool:
        return getattr(self._batches, "open", None) is not None

    def publish_batch(self) -> list[tuple[str, bytes]]:
        opened: Batch | None = getattr(self._batches, "open", None)
        if opened is None:
            return []
        before = len(opened.existed)
        opened.publish(self)
        existed = opened.existed[before:]
        del opened.existed[before:]
        return existed

    def lock(self, key: str, task_id: str, timeout: float) -> HeldLock | None:
        lock = TaskLock(self.path(key), task_id)
        return lock if lock.acquire(timeout) else None

    def init_store(self, marker: bytes) -> None:
        posixinit.build(self.root, marker)

    def interrupted_init(self, *, but_marker: bool = False) -> str | None:
        return posixinit.leftovers_only(self.root, but_marker=but_marker)

    def is_void(self) -> bool:
        return not os.path.isdir(self.root) or not posixinit.listdir(self.root)

    def content_counts(self) -> tuple[int, int]:
        return posixinit.content_counts(self.root)

    def where(self, key: str) -> str:
        return self.path(key)

    def names_are_coherent(self) -> bool:
        if self._coherent is None:
            self._coherent = names_are_coherent(self.root)
        return self._coherent

    def walk(self, key: str) -> Iterator[tuple[str, list[str]]]:
        """os.walk: a symlink to a directory is among its directories (never entered), so
        it is listed as neither; only the names are read (no lstat of every slot)."""
        top = self.path(key)
        if not os.path.lexists(top):
            return
        for directory, _dirs, files in os.walk(top, onerror=_raise_listing_error):
            yield directory[len(self._prefix) :], files

    def flush_file(self, key: str) -> None:
        path = self.path(key)
        fd = fsread.open_regular(path)
        try:
            with oserrors.translated(path, "syncing"):
                os.fsync(fd)
        except BaseException:
            fsread.close_read(fd)  # the fsync's error is the one to report
            raise
        with oserrors.translated(path, "closing a synced file"):
            os.close(fd)  # a deferred error of the sync (NFS) is a failed sync


def _raise_listing_error(exc: OSError) -> None:
    """os.walk's onerror: a directory that cannot be listed is an error, never empty."""
    raise StoreIOError(str(exc.filename), "listing", exc) from exc


def is_temp(name: str) -> bool:
    """True for a temp file's name (FORMAT.md 2.2): a write in progress, or a leftover."""
    return name.startswith(TMP_PREFIX)
