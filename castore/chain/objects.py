"""Write-once objects named by the blake3 of their bytes, in a two-hex-digit fan-out tree,
stored through the store's medium (castore.medium: every read and write of an object)."""

from __future__ import annotations

import errno
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from castore.errors import (
    DurabilityError,
    ObjectCorruptError,
    ObjectMissingError,
    StoreIOError,
    UnsafeFileError,
)
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import fanout_key, object_key
from castore.medium.base import Medium

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

    def __init__(self, medium: Medium) -> None:
        self.medium = medium
        self._recent: OrderedDict[str, bytes] = OrderedDict()
        self._recent_size = 0
        self._recent_lock = threading.Lock()
        # v1 readers find a snapshot by its object name alone, so a v1 store keeps making
        # that name durable; v2 readers fall back to the chain slot (FORMAT.md 9.3).
        self.snapshot_names_durable = True

    def path(self, object_id: str) -> str:
        """Where object `object_id` is, as a person is told (a path, a URL)."""
        return self.medium.where(object_key(object_id))

    def put(self, kind: str, body: bytes) -> str:
        """Durably store an object; return its id. Storing an existing object is a no-op."""
        return self.put_framed(codec.frame(kind, body))

    def put_framed(self, data: bytes, *, remember: bool = True) -> str:
        """Durably store already framed bytes (inside this thread's open batch: when the
        batch is published); return their id. `remember`: keep the bytes a while, for a
        later commit that names the object (`hold`)."""
        medium = self.medium
        object_id = hash_bytes(data)
        key = object_key(object_id)
        # A planted symlink in place of a fan-out directory must not receive objects.
        medium.require_dir(fanout_key(object_id))
        started, pause, tries = time.monotonic(), _BACKOFF_FIRST_S, 0
        while True:
            tries += 1
            try:
                created = medium.create(key, data)
            except FileNotFoundError:
                # Fan-out directories are made on first use; gc or a person may remove them.
                medium.make_dir(fanout_key(object_id))
                created = False
            except DurabilityError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                created = False  # the temp file vanished before its link: a gc with no grace
            else:
                if (
                    created
                    or medium.pending(key) is not None
                    or self._refresh_or_heal(object_id, data)
                ):
                    if remember:
                        self._remember(object_id, data)
                    return object_id
            if tries < _PUBLISH_TRIES:
                continue
            if medium.names_are_coherent() or time.monotonic() - started > _STALE_NAME_S:
                raise ObjectMissingError(object_id, self.path(object_id))
            time.sleep(pause)  # our client still holds the removed name: wait for it to expire
            pause = min(pause * 2, _BACKOFF_MAX_S)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Objects put in this thread inside the block are published together when it ends
        (the medium's batch: on a local disk whose flushes castore shares, two flushes for
        any number of objects instead of two each, FORMAT.md 9.2), or when a commit inside
        the block claims its slot: the claim publishes them with its snapshot before the
        link, so the commit may name them. An error inside the block publishes nothing that
        no commit published already."""
        with self.medium.batch() as existed:
            yield
        for key, data in existed:  # linked onto a name that was there: checked as a put is
            if not self._refresh(key.rsplit("/", 1)[1]):
                self.put_framed(data)

    def publish_with_batch(self, data: bytes) -> bool:
        """Inside this thread's open batch: put the framed bytes `data` (the snapshot a commit
        is about to link) into it, and publish the batch now, each name that existed already
        checked as a put checks it (and stored again if it went). Every object of the batch
        is then stored, bytes and name durable: the commit may name them (FORMAT.md 9.2, "A
        commit inside a batch"). False, doing nothing, outside a batch."""
        if not self.medium.batch_open():
            return False
        self.put_framed(data, remember=False)  # one more object of the batch
        self.publish_open_batch()
        return True

    def publish_open_batch(self) -> None:
        """Publish what waits in this thread's open batch now (nothing outside one), each
        name that existed already checked as a put checks it, and stored again (through the
        batch, published in turn) if it went; ObjectMissingError if one keeps vanishing."""
        existed = self.medium.publish_batch()
        for _ in range(_PUBLISH_TRIES):
            if not existed:
                return
            for key, there in existed:
                if not self._refresh(key.rsplit("/", 1)[1]):
                    self.put_framed(there)  # joins the open batch: published just below
            existed = self.medium.publish_batch()
        if existed:
            object_id = existed[0][0].rsplit("/", 1)[1]
            raise ObjectMissingError(object_id, self.path(object_id))

    def pending(self, object_id: str) -> bytes | None:
        """The bytes of an object put in this thread's open batch, not yet published."""
        if not self.medium.batch_open():
            return None  # the common case, asked many times a commit: no key to make
        return self.medium.pending(object_key(object_id))

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
        ObjectMissingError or ObjectCorruptError if it is neither stored nor remembered. An
        object of this thread's open batch has no name yet: the commit publishes the batch
        before its link (`publish_with_batch`), so its bytes are all the commit needs."""
        pending = self.pending(object_id)
        if pending is not None:
            return pending
        with self._recent_lock:
            data = self._recent.get(object_id)
        if data is None:
            data = self.read(object_id)
        self.ensure(object_id, data)
        return data

    def ensure(self, object_id: str, data: bytes) -> None:
        """Store `data` (the bytes of `object_id`) again if its name is gone; else refresh it."""
        try:
            there = self.medium.touch(object_key(object_id))
        except StoreIOError as exc:
            if exc.errno != errno.ESTALE:
                raise
            there = False  # the name's inode is gone on the server
        if not there:
            self.put_framed(data)  # set aside or removed by gc: store it again

    def _refresh_or_heal(self, object_id: str, data: bytes) -> bool:
        """`_refresh` of the object `data` names; where its stored bytes are damaged, the
        medium's `heal` puts these verified ones in their place (S3, where fsck's quarantine
        cannot always take a damaged key away); ObjectCorruptError where it cannot."""
        try:
            return self._refresh(object_id)
        except ObjectCorruptError:
            if not self.medium.heal(object_key(object_id), data):
                raise
            return True

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
            refreshed = self.medium.touch(object_key(object_id))  # best effort in a group store
        except ObjectMissingError:
            return False
        except StoreIOError as exc:
            if exc.errno != errno.ESTALE:
                raise
            return False  # the server no longer has the inode our client's name led to
        return refreshed and self.still_named(object_id)

    def names_are_coherent(self) -> bool:
        """True when a lookup in this store is the truth (a local filesystem, decided once)."""
        return self.medium.names_are_coherent()

    def still_named(self, object_id: str) -> bool:
        """True if the object's name exists now, as the medium's server holds it (a client
        may go on finding a name another client removed). A False is always safe: the
        caller stores again."""
        return self.medium.still_named(object_key(object_id))

    def read(self, object_id: str) -> bytes:
        """The framed bytes of an object, re-hashed: corrupt bytes are never returned. Bytes
        that do not hash to the id are read once more, past the client's caches, before the
        object counts as corrupt (a stale read on a shared filesystem, FORMAT.md 11.5)."""
        pending = self.pending(object_id)
        if pending is not None:
            return pending  # put in this thread's open batch: hashed when it was put
        key = object_key(object_id)
        data = self._read_file(object_id, key, self.medium.read)
        if hash_bytes(data) == object_id:
            return data
        data = self._read_file(object_id, key, self.medium.read_fresh)
        actual = hash_bytes(data)
        if actual != object_id:
            reason = "file is empty" if not data else f"its bytes hash to {actual}"
            raise ObjectCorruptError(object_id, self.path(object_id), reason)
        return data

    def check(self, object_id: str) -> None:
        """That object `object_id` is there and hashes to its id, read a megabyte at a time
        (a long plan is checked without being held in memory); what `read` raises if not."""
        if self.pending(object_id) is not None:
            return
        try:
            if self.medium.hash(object_key(object_id)) == object_id:
                return
        except FileNotFoundError:
            raise ObjectMissingError(object_id, self.path(object_id)) from None
        self.read(object_id)  # read again past the caches: corrupt, or a stale first read

    def _read_file(self, object_id: str, key: str, read: Callable[[str], bytes]) -> bytes:
        try:
            return read(key)
        except FileNotFoundError:
            raise ObjectMissingError(object_id, self.path(object_id)) from None

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
            head = pending or self.medium.read_head(object_key(object_id), codec.MAX_HEADER)
        except (FileNotFoundError, UnsafeFileError):
            return None
        parts = head.split(b"\n", 1)[0].split(b" ")
        return parts[2].decode("ascii", "replace") if len(parts) == 4 else None

    def exists(self, object_id: str) -> bool:
        return self.medium.exists(object_key(object_id))
