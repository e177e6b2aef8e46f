"""Write-once objects named by the blake3 of their bytes, in a two-hex-digit fan-out tree."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from castore import crashpoints
from castore.errors import (
    DurabilityError,
    ObjectCorruptError,
    ObjectMissingError,
    StoreIOError,
    UnsafeFileError,
    UsageError,
)
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import Layout
from castore.medium import fsio, groupflush
from castore.medium.mountinfo import names_are_coherent

# A put races gc at most once per gc run; a few tries cover any number of concurrent gcs.
_PUBLISH_TRIES = 3
# On a filesystem whose client caches names (GlusterFS' default entry-timeout, 1 s), link()
# onto a name another client's gc just removed fails EEXIST until the entry expires: the
# publish is retried with a backoff for this long before the object counts as lost.
_STALE_NAME_S = 3.0
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.01, 0.25
# The bytes of objects this process stored lately, so a commit that names one (a blob put
# earlier) can store it again if gc removed it meanwhile, without reading it back (gc.py).
_RECENT_BYTES = 32 << 20
_RECENT_ONE = 4 << 20


class ObjectStore:
    """Puts and verified gets of objects."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._recent: OrderedDict[str, bytes] = OrderedDict()
        self._recent_size = 0
        self._recent_lock = threading.Lock()
        self._coherent: bool | None = None
        self._flush: groupflush.GroupFlush | None = None
        # v1 readers find a snapshot by its object name alone, so a v1 store keeps making
        # that name durable; v2 readers fall back to the chain slot (FORMAT.md 9.3).
        self.snapshot_names_durable = True
        self._batches = threading.local()  # the open batch of each thread (batch())

    @property
    def flush(self) -> groupflush.GroupFlush:
        """The flushes of this store's filesystem, shared by the process (groupflush.py)."""
        if self._flush is None:
            self._flush = groupflush.for_store(self._layout.root)
        return self._flush

    def path(self, object_id: str) -> str:
        return self._layout.object_path(object_id)

    def put(self, kind: str, body: bytes) -> str:
        """Durably store an object; return its id. Storing an existing object is a no-op."""
        return self.put_framed(codec.frame(kind, body))

    def put_framed(self, data: bytes, *, remember: bool = True, snapshot: bool = False) -> str:
        """Durably store already framed bytes; return their id. `remember`: keep the bytes a
        while, for a later commit that names the object (`hold`). `snapshot`: the bytes of a
        snapshot about to be linked as a chain slot, whose name in a v2 store need not be
        durable (the slot is: FORMAT.md 9.3), which saves a directory flush per commit."""
        flush = self.flush
        name_durable = self.snapshot_names_durable or not snapshot
        object_id = hash_bytes(data)
        pending: _Batch | None = getattr(self._batches, "open", None)
        if pending is not None and not snapshot:
            return pending.add(self, object_id, data, remember)
        fanout = self._layout.fanout_dir(object_id)
        # A planted symlink in place of a fan-out directory must not receive objects.
        fsio.require_real_directory(fanout)
        started, pause, tries = time.monotonic(), _BACKOFF_FIRST_S, 0
        while True:
            tries += 1
            try:
                created = fsio.publish_file(
                    fanout,
                    object_id,
                    data,
                    sync=flush.file,
                    sync_dir=flush.directory,
                    name_durable=name_durable,
                )
            except FileNotFoundError:
                # Fan-out directories are made on first use; gc or a person may remove them.
                fsio.make_dir_durable(fanout)
                created = False
            except DurabilityError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                created = False  # the temp file vanished before its link: a gc with no grace
            else:
                if created or self._refresh(object_id):
                    if remember:
                        self._remember(object_id, data)
                    return object_id
            if tries < _PUBLISH_TRIES:
                continue
            if self.names_are_coherent() or time.monotonic() - started > _STALE_NAME_S:
                raise ObjectMissingError(object_id, self.path(object_id))
            time.sleep(pause)  # our client still holds the removed name: wait for it to expire
            pause = min(pause * 2, _BACKOFF_MAX_S)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Objects put in this thread inside the block are published together when it ends:
        their bytes written first, one syncfs for all of them, then their names, then one
        syncfs for the names (FORMAT.md 9.2, batches). Two flushes for any number of objects
        instead of two each; nothing names them before the block ends, so no commit may be
        made inside it. Where flushes are not shared (FUSE, NFS: flushpolicy.py) a batch is
        each put on its own, as outside one. An error inside the block publishes nothing."""
        if getattr(self._batches, "open", None) is not None or not self.flush.policy.shared:
            yield  # nested, or nothing to share: every put publishes itself
            return
        opened = self._batches.open = _Batch()
        try:
            yield
        except BaseException:
            opened.discard()
            raise
        finally:
            self._batches.open = None
        opened.publish(self)

    def pending(self, object_id: str) -> bytes | None:
        """The bytes of an object put in this thread's open batch, not yet published."""
        opened: _Batch | None = getattr(self._batches, "open", None)
        return None if opened is None else opened.data.get(object_id)

    def _remember(self, object_id: str, data: bytes) -> None:
        if len(data) > _RECENT_ONE:
            return  # a commit naming it reads it back instead (hold)
        with self._recent_lock:
            if object_id in self._recent:
                self._recent.move_to_end(object_id)
                return
            self._recent[object_id] = data
            self._recent_size += len(data)
            while self._recent_size > _RECENT_BYTES:
                self._recent_size -= len(self._recent.popitem(last=False)[1])

    def restore(self, object_id: str, *, known_gone: bool = False) -> None:
        """Store again an object this process stored lately if its name is gone (gc took it
        before a commit named it); a no-op otherwise. `known_gone`: a read just failed to
        find it, whatever a (cached) lookup says."""
        with self._recent_lock:
            data = self._recent.get(object_id)
        if data is not None and (known_gone or not self.still_named(object_id)):
            self.put_framed(data)

    def hold(self, object_id: str) -> bytes:
        """The framed bytes of an object a commit is about to name, in hand (so the commit can
        store it again if gc removes it before gc sees the commit), and its mtime refreshed.
        ObjectMissingError or ObjectCorruptError if it is neither stored nor remembered."""
        if self.pending(object_id) is not None:
            raise UsageError(
                f"a commit names {object_id}, put in this thread's open store.batch(): "
                "commit after the batch's block ends (until then the object has no name)"
            )
        with self._recent_lock:
            data = self._recent.get(object_id)
        if data is None:
            data = self.read(object_id)
        self.ensure(object_id, data)
        return data

    def ensure(self, object_id: str, data: bytes) -> None:
        """Store `data` (the bytes of `object_id`) again if its name is gone; else refresh it."""
        try:
            os.utime(self.path(object_id), follow_symlinks=False)
        except FileNotFoundError:
            self.put_framed(data)  # set aside or removed by gc: store it again
        except PermissionError:
            pass  # not the owner in a group store: best effort (FORMAT.md, gc)
        except OSError as exc:
            if exc.errno != errno.ESTALE:
                raise fsio.io_error(self.path(object_id), "refreshing", exc) from exc
            self.put_framed(data)  # the name's inode is gone on the server: as above

    def _refresh(self, object_id: str) -> bool:
        """The object already existed: check its bytes (never trust a damaged copy) and make
        it young again, since gc keeps what is younger than its grace period. False if it
        vanished meanwhile (gc set it aside): then the caller publishes it anew.

        The name is confirmed *after* the refresh, by `still_named`: a client that still
        caches a name another client's gc removed refreshes the set-aside inode by it
        (read and utime succeed), and that inode is unlinked soon after. If the name is
        there after the utime, the utime came before gc's removal of the name, hence before
        gc reads the slots again and looks at the mtimes: gc sees the object young and puts
        it back (gc.py, step 2). If it is gone, the put publishes again."""
        try:
            self.read(object_id)
            refreshed = fsio.refresh_mtime(self.path(object_id))  # best effort in a group store
        except ObjectMissingError:
            return False
        except StoreIOError as exc:
            if exc.errno != errno.ESTALE:
                raise
            return False  # the server no longer has the inode our client's name led to
        return refreshed and self.still_named(object_id)

    def names_are_coherent(self) -> bool:
        """True when a lookup in this store is the truth (a local filesystem, decided once)."""
        if self._coherent is None:
            self._coherent = names_are_coherent(self._layout.root)
        return self._coherent

    def still_named(self, object_id: str) -> bool:
        """True if the object's name exists now, as the directory holds it: a lookup on a
        local filesystem; elsewhere a listing of its fan-out directory too, since a client
        may go on finding a name another client removed (its lookup is served from cache,
        a listing reaches the server). A False is always safe: the caller stores again."""
        path = self.path(object_id)
        try:
            if not fsio.exists(path):
                return False
        except StoreIOError as exc:
            if exc.errno != errno.ESTALE:
                raise
            return False
        if self.names_are_coherent():
            return True
        try:
            return object_id in fsio.list_names(os.path.dirname(path))
        except FileNotFoundError:
            return False

    def read(self, object_id: str) -> bytes:
        """The framed bytes of an object, re-hashed: corrupt bytes are never returned. Bytes
        that do not hash to the id are read once more, past the client's caches, before the
        object counts as corrupt (a stale read on a shared filesystem, FORMAT.md 11.5)."""
        pending = self.pending(object_id)
        if pending is not None:
            return pending  # put in this thread's open batch: hashed when it was put
        path = self.path(object_id)
        data = self._read_file(object_id, path, fsio.read_regular)
        if hash_bytes(data) == object_id:
            return data
        data = self._read_file(object_id, path, fsio.read_uncached)
        actual = hash_bytes(data)
        if actual != object_id:
            reason = "file is empty" if not data else f"its bytes hash to {actual}"
            raise ObjectCorruptError(object_id, path, reason)
        return data

    def check(self, object_id: str) -> None:
        """That object `object_id` is there and hashes to its id, read a megabyte at a time
        (a long plan is checked without being held in memory); what `read` raises if not."""
        if self.pending(object_id) is not None:
            return
        try:
            if fsio.hash_regular(self.path(object_id)) == object_id:
                return
        except FileNotFoundError:
            raise ObjectMissingError(object_id, self.path(object_id)) from None
        self.read(object_id)  # read again past the caches: corrupt, or a stale first read

    @staticmethod
    def _read_file(object_id: str, path: str, read: Callable[[str], bytes]) -> bytes:
        try:
            return read(path)
        except FileNotFoundError:
            raise ObjectMissingError(object_id, path) from None

    def get(self, object_id: str, kind: str) -> bytes:
        """The verified body of an object of `kind`."""
        data = self.read(object_id)
        try:
            found, body = codec.unframe(data, self.path(object_id))
        except codec.FrameError as exc:
            raise ObjectCorruptError(object_id, self.path(object_id), exc.reason) from None
        if found != kind:
            raise ObjectCorruptError(object_id, self.path(object_id), f"a {found}, not a {kind}")
        return body

    def kind_of(self, object_id: str) -> str | None:
        """The kind an object's header declares (None if absent or headerless); reads only
        the header, so checking a reference to a large blob costs one small read."""
        pending = self.pending(object_id)
        try:
            head = pending or fsio.read_prefix(self.path(object_id), codec.MAX_HEADER)
        except (FileNotFoundError, UnsafeFileError):
            return None
        parts = head.split(b"\n", 1)[0].split(b" ")
        return parts[2].decode("ascii", "replace") if len(parts) == 4 else None

    def exists(self, object_id: str) -> bool:
        return os.path.lexists(self.path(object_id))


class _Batch:
    """Objects written as unsynced temp files, waiting for the batch's end (batch())."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self._temps: list[tuple[str, str, str, bool]] = []  # temp, fan-out dir, id, remember

    def add(self, objects: ObjectStore, object_id: str, data: bytes, remember: bool) -> str:
        if object_id in self.data:
            return object_id
        fanout = objects._layout.fanout_dir(object_id)
        fsio.require_real_directory(fanout)
        try:
            temp = fsio.write_temp(fanout, data, sync=_later)
        except FileNotFoundError:
            fsio.make_dir_durable(fanout)  # made on first use; gc or a person may remove it
            temp = fsio.write_temp(fanout, data, sync=_later)
        self.data[object_id] = data
        self._temps.append((temp, fanout, object_id, remember))
        return object_id

    def discard(self) -> None:
        for temp, *_ in self._temps:
            fsio.discard(temp)

    def publish(self, objects: ObjectStore) -> None:
        """Data durable, then names, then names durable; a failed flush publishes nothing
        more and raises (rule O4: the temp files go, never synced again)."""
        try:
            _sync_all(objects, "syncing a batch's bytes")
            again = []
            for temp, fanout, object_id, remember in self._temps:
                try:
                    created = fsio.link_new(temp, os.path.join(fanout, object_id))
                except (FileNotFoundError, DurabilityError):
                    created = False  # its directory or temp went (gc): publish it alone
                crashpoints.reach("object.linked")
                if not created and not objects._refresh(object_id):
                    again.append(object_id)
                elif remember:
                    objects._remember(object_id, self.data[object_id])
            _sync_all(objects, "syncing a batch's names")
        finally:
            self.discard()
        for _ in self._temps:
            crashpoints.reach("object.published")  # as many arrivals as a put of each
        for object_id in again:
            objects.put_framed(self.data[object_id])


def _sync_all(objects: ObjectStore, operation: str) -> None:
    """One syncfs of the store's filesystem; DurabilityError naming `operation` if it fails."""
    try:
        objects.flush.filesystem()
    except OSError as exc:
        raise DurabilityError(objects._layout.objects, operation, exc) from exc


def _later(fd: int, path: str) -> None:
    """A batch's temp file is flushed with the others at the batch's end (one syncfs)."""
    del fd, path
