"""Write-once objects named by the blake3 of their bytes, in a two-hex-digit fan-out tree."""

from __future__ import annotations

import os

from castore import codec, fsio
from castore.digest import hash_bytes
from castore.errors import ObjectCorruptError, ObjectMissingError, UnsafeFileError
from castore.layout import Layout

# A put races gc at most once per gc run; a few tries cover any number of concurrent gcs.
_PUBLISH_TRIES = 3


class ObjectStore:
    """Puts and verified gets of objects."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def path(self, object_id: str) -> str:
        return self._layout.object_path(object_id)

    def put(self, kind: str, body: bytes) -> str:
        """Durably store an object; return its id. Storing an existing object is a no-op."""
        return self.put_framed(codec.frame(kind, body))

    def put_framed(self, data: bytes) -> str:
        """Durably store already framed bytes; return their id."""
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
                created = fsio.publish_file(fanout, object_id, data)
            if created or self._refresh(object_id):
                return object_id
        raise ObjectMissingError(object_id, self.path(object_id))

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
