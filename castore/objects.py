"""Write-once objects named by the blake3 of their bytes, in a two-hex-digit fan-out tree."""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict

from castore import codec, fsio
from castore.digest import hash_bytes
from castore.errors import (
    DurabilityError,
    ObjectCorruptError,
    ObjectMissingError,
    UnsafeFileError,
)
from castore.layout import Layout

# A put races gc at most once per gc run; a few tries cover any number of concurrent gcs.
_PUBLISH_TRIES = 3
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

    def path(self, object_id: str) -> str:
        return self._layout.object_path(object_id)

    def put(self, kind: str, body: bytes) -> str:
        """Durably store an object; return its id. Storing an existing object is a no-op."""
        return self.put_framed(codec.frame(kind, body))

    def put_framed(self, data: bytes, *, remember: bool = True) -> str:
        """Durably store already framed bytes; return their id. `remember`: keep the bytes a
        while, for a later commit that names the object (`hold`)."""
        object_id = hash_bytes(data)
        fanout = self._layout.fanout_dir(object_id)
        # A planted symlink in place of a fan-out directory must not receive objects.
        fsio.require_real_directory(fanout)
        for _ in range(_PUBLISH_TRIES):
            try:
                created = fsio.publish_file(fanout, object_id, data)
            except FileNotFoundError:
                # Fan-out directories are made on first use; gc or a person may remove them.
                fsio.make_dir_durable(fanout)
                continue
            except DurabilityError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                continue  # the temp file vanished before its link: a gc with no grace period
            if created or self._refresh(object_id):
                if remember:
                    self._remember(object_id, data)
                return object_id
        raise ObjectMissingError(object_id, self.path(object_id))

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

    def restore(self, object_id: str) -> None:
        """Store again an object this process stored lately if its name is gone (gc took it
        before a commit named it); a no-op otherwise."""
        with self._recent_lock:
            data = self._recent.get(object_id)
        if data is not None and not self.exists(object_id):
            self.put_framed(data)

    def hold(self, object_id: str) -> bytes:
        """The framed bytes of an object a commit is about to name, in hand (so the commit can
        store it again if gc removes it before gc sees the commit), and its mtime refreshed.
        ObjectMissingError or ObjectCorruptError if it is neither stored nor remembered."""
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

    def _refresh(self, object_id: str) -> bool:
        """The object already existed: check its bytes (never trust a damaged copy) and make
        it young again, since gc keeps what is younger than its grace period. False if it
        vanished meanwhile (gc set it aside): then the caller publishes it anew."""
        try:
            self.read(object_id)
        except ObjectMissingError:
            return False
        return fsio.refresh_mtime(self.path(object_id))  # best effort in a group store

    def read(self, object_id: str) -> bytes:
        """The framed bytes of an object, re-hashed: corrupt bytes are never returned."""
        path = self.path(object_id)
        try:
            data = fsio.read_regular(path)
        except FileNotFoundError:
            raise ObjectMissingError(object_id, path) from None
        actual = hash_bytes(data)
        if actual != object_id:
            reason = "file is empty" if not data else f"its bytes hash to {actual}"
            raise ObjectCorruptError(object_id, path, reason)
        return data

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
        try:
            head = fsio.read_prefix(self.path(object_id), codec.MAX_HEADER)
        except (FileNotFoundError, UnsafeFileError):
            return None
        parts = head.split(b"\n", 1)[0].split(b" ")
        return parts[2].decode("ascii", "replace") if len(parts) == 4 else None

    def exists(self, object_id: str) -> bool:
        return os.path.lexists(self.path(object_id))
