"""A reader's view of a medium: every read passes through, every write raises.

`Store.open(..., read_only=True)` opens a store through it, and so do castore's read paths
(`status`, `log`, `show`, `brief`, a LangGraph saver's reads in the tests): a read that would
write (finish an interrupted prune, take a lock file) fails loudly instead of writing, as it
would on S3 with read-only keys. FORMAT.md §12: a reader never writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import NoReturn

from castore.errors import ReadOnlyStoreError
from castore.format.limits import MAX_OBJECT_SIZE
from castore.medium.base import Entry, Judge, Medium, SetAside
from castore.medium.tasklock import HeldLock


class ReadOnlyMedium(Medium):
    """`inner` for reading; ReadOnlyStoreError for any write."""

    read_only = True

    def __init__(self, inner: Medium) -> None:
        self.inner = inner
        self.url = inner.url
        self.kind = inner.kind
        self.frees_names = inner.frees_names
        self.aliases = inner.aliases
        self.keeps_retired = inner.keeps_retired
        self.directories = inner.directories
        self.seal_every = inner.seal_every
        self.file_events = inner.file_events
        self.private_names = inner.private_names

    @property
    def identity(self) -> str:
        return self.inner.identity

    def _refuse(self, operation: str, key: str) -> NoReturn:
        raise ReadOnlyStoreError(self.url, operation, key)

    # -- reading: passed through ---------------------------------------------------------------
    def read(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes:
        return self.inner.read(key, limit=limit)

    def read_fresh(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes:
        return self.inner.read_fresh(key, limit=limit)

    def read_head(self, key: str, size: int) -> bytes:
        return self.inner.read_head(key, size)

    def hash(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> str:
        return self.inner.hash(key, limit=limit)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def still_named(self, key: str) -> bool:
        return self.inner.still_named(key)

    def names(self, key: str) -> list[str]:
        return self.inner.names(key)

    def names_after(self, key: str, after: str) -> list[str]:
        return self.inner.names_after(key, after)

    def names_if_small(self, key: str) -> list[str] | None:
        return self.inner.names_if_small(key)

    def scan(self, key: str) -> list[Entry]:
        return self.inner.scan(key)

    def stat(self, key: str) -> Entry:
        return self.inner.stat(key)

    def same_file(self, key: str, other: str) -> bool:
        return self.inner.same_file(key, other)

    def read_entry(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, Entry]:
        return self.inner.read_entry(key, limit=limit)

    @contextlib.contextmanager
    def reader(self, key: str) -> Iterator[Callable[[str], tuple[bytes, Entry]]]:
        with self.inner.reader(key) as read:
            yield read

    def names_and_inodes(self, key: str) -> list[tuple[str, int | None]]:
        return self.inner.names_and_inodes(key)

    def lock_held(self, key: str) -> bool:
        return self.inner.lock_held(key)

    def walk(self, key: str) -> Iterator[tuple[str, list[str]]]:
        return self.inner.walk(key)

    def interrupted_init(self, *, but_marker: bool = False) -> str | None:
        return self.inner.interrupted_init(but_marker=but_marker)

    def is_void(self) -> bool:
        return self.inner.is_void()

    def content_counts(self) -> tuple[int, int]:
        return self.inner.content_counts()

    def check_safe(self) -> None:
        self.inner.check_safe()

    def where(self, key: str) -> str:
        return self.inner.where(key)

    def names_are_coherent(self) -> bool:
        return self.inner.names_are_coherent()

    def pending(self, key: str) -> bytes | None:
        return None  # a reader has no batch of its own

    def lock(self, key: str, task_id: str, timeout: float) -> HeldLock | None:
        del key, task_id, timeout
        return None  # a reader queues behind nobody, and a lock file would be a write

    # -- writing: refused ----------------------------------------------------------------------
    def set_aside(self, key: str, target: str, still_bad: Judge) -> SetAside:
        self._refuse("setting aside", key)

    def create(self, key: str, data: bytes, *, sync_name: bool = True, mode: int = 0o444) -> bool:
        self._refuse("creating", key)

    def claim(self, key: str, data: bytes, *, alias_of: str, alias_durable: bool) -> bool:
        self._refuse("committing", key)

    def link(self, source: str, key: str) -> bool:
        self._refuse("linking", key)

    def flush_dir(self, key: str) -> None:
        self._refuse("flushing", key)

    def flush_file(self, key: str) -> None:
        self._refuse("flushing", key)

    def remove(self, key: str) -> None:
        self._refuse("removing", key)

    def retire(self, key: str) -> None:
        self._refuse("pruning", key)

    def make_dir(self, key: str) -> bool:
        self._refuse("making the directory", key)

    def require_dir(self, key: str) -> None:
        self.inner.require_dir(key)  # a look, not a write

    def touch(self, key: str) -> bool:
        self._refuse("touching", key)

    def heal(self, key: str, data: bytes) -> bool:
        self._refuse("healing", key)

    def replace(self, key: str, data: bytes) -> None:
        self._refuse("replacing", key)

    def init_store(self, marker: bytes) -> None:
        self._refuse("creating a store at", "")

    @contextlib.contextmanager
    def batch(self) -> Iterator[list[tuple[str, bytes]]]:
        self._refuse("batching writes in", "")
        yield []  # not reached: mypy wants a generator

    def publish_batch(self) -> list[tuple[str, bytes]]:
        self._refuse("publishing a batch in", "")
