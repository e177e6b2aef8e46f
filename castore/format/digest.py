"""blake3 hashing: object ids and environment digests (the only importer of blake3)."""

from __future__ import annotations

from collections.abc import Iterable

import blake3

DIGEST_HEX_LEN = 64


def hash_bytes(data: bytes) -> str:
    """The object id of `data`: blake3, 32 bytes, lowercase hex."""
    return blake3.blake3(data).hexdigest()


def hash_chunks(chunks: Iterable[bytes | memoryview]) -> str:
    """The blake3 hex digest of the concatenation of `chunks`, without joining them."""
    hasher = blake3.blake3()
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.hexdigest()


class Hasher:
    """An incremental blake3 hash, for digests built piece by piece."""

    def __init__(self) -> None:
        self._hasher = blake3.blake3()

    def update(self, data: bytes) -> None:
        self._hasher.update(data)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()
