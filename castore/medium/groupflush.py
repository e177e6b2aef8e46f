"""Group commit: concurrent commits of one process share their flushes (FORMAT.md 9.8).

A commit waits on two flushes: its snapshot's bytes (before the commit point) and its chain
slot (after). A lone caller flushes precisely what it needs (an fsync of its file or of its
directory) and waits for nothing else. A caller that arrives while a flush is running joins
the next *round*: when the running flush ends, one member of the round calls `syncfs` on the
filesystem once, which makes durable every write and name that any member made before the
round started, and wakes them all. So batching grows with load by itself, with no timer, and
a lone writer pays nothing for it.

`syncfs` stands in for fsyncs only where the flush policy trusts it (flushpolicy.py: a local
journaling filesystem on a kernel that reports writeback errors to syncfs). Elsewhere every
call is its own precise flush, and the filesystem (or its server) groups them if it can.

One GroupFlush per filesystem per process (`for_store`): stores and runs that share a device
share rounds. Only the round's leader calls syncfs, one at a time, so the writeback error a
syncfs reports (once per descriptor) reaches the round it belongs to: every member fails.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from castore.errors import DurabilityError
from castore.medium import fsio, fsread
from castore.medium.flushpolicy import FlushPolicy, decide


class _Round:
    """The callers one syncfs covers; `error` is what that syncfs raised (None: durable).
    Its members sleep on their own events: a flush's end wakes its round and the next
    round's leader, not every waiting thread."""

    __slots__ = ("done", "error", "finished", "may_lead")

    def __init__(self) -> None:
        self.done = False
        self.error: OSError | None = None
        self.finished = threading.Event()  # set when the round's flush is over
        self.may_lead = threading.Event()  # set when its leader may start the flush


class GroupFlush:
    """Flushes of one filesystem, shared between concurrent callers where the policy allows."""

    def __init__(self, root: str, policy: FlushPolicy) -> None:
        self.root = root
        self.policy = policy
        self._lock = threading.Lock()
        self._running: _Round | None = None  # the flush in progress (precise or shared)
        self._next: _Round | None = None  # callers waiting for the flush after it
        self._root_fd: int | None = None
        if policy.shared:
            # Opened before any write it must answer for: syncfs reports a write-back error
            # only to descriptors opened before the error (the superblock's errseq).
            self._root_fd = fsread.open_directory(root)
        self.rounds = 0  # shared flushes made (syncfs calls): for tests and the benchmark
        self.precise = 0  # flushes a lone caller made for itself

    def file(self, fd: int, path: str) -> None:
        """Make the bytes written to `fd` (the file at `path`) durable; OSError if not."""
        self._flush(lambda: fsio.fsync_file(fd, path))

    def directory(self, path: str) -> None:
        """Make the names in directory `path` durable; DurabilityError if not."""
        try:
            self._flush(lambda: fsio.fsync_dir(path))
        except DurabilityError:
            raise  # the precise fsync's own error, naming the directory
        except OSError as exc:  # the shared syncfs's
            raise DurabilityError(path, "syncing the filesystem (syncfs) for", exc) from exc

    def filesystem(self) -> None:
        """Make every write and name made so far on this filesystem durable: one syncfs (a
        batch of objects, objects.py), shared with a round when one forms. Only where the
        policy is shared (OSError ENOTSUP otherwise: the caller flushes file by file)."""
        if not self.policy.shared:
            raise OSError(errno.ENOTSUP, "this filesystem's flushes are not shared")
        self._flush(lambda: fsio.syncfs(self._fd()))

    def _flush(self, precise: Callable[[], None]) -> None:
        if not self.policy.shared:
            self.precise += 1
            precise()
            return
        joined = self._join()
        if joined is None:
            return  # a round that started after this call made everything durable
        mine, alone = joined
        error: OSError | None = None
        try:
            if alone:
                self.precise += 1
                precise()
            else:
                self.rounds += 1
                fsio.syncfs(self._fd())
        except OSError as exc:
            error = exc
        finally:
            with self._lock:
                mine.done, mine.error = True, error
                self._running, self._next = self._next, None
                if self._running is not None:
                    self._running.may_lead.set()  # its first member leads it
            mine.finished.set()
        if error is not None:
            raise error

    def _join(self) -> tuple[_Round, bool] | None:
        """The round this caller leads, and whether it is alone (nothing running, nobody
        waiting: a precise flush is enough); None once a round covering it completed."""
        with self._lock:
            if self._running is None:
                self._running = _Round()
                return self._running, True
            if self._next is None:
                self._next = mine = _Round()
                leads = True
            else:
                mine, leads = self._next, False
        if leads:
            mine.may_lead.wait()
            return mine, False
        mine.finished.wait()
        if mine.error is not None:
            raise _copy(mine.error)
        return None

    def _fd(self) -> int:
        if self._root_fd is None:
            self._root_fd = fsread.open_directory(self.root)
        return self._root_fd


def _copy(error: OSError) -> OSError:
    """A fresh exception per member of a failed round (one instance raised in many threads
    would share and overwrite one traceback)."""
    return OSError(error.errno, f"a shared syncfs failed: {error.strerror}", error.filename)


_BY_DEVICE: dict[int, tuple[int, GroupFlush]] = {}
_BY_DEVICE_LOCK = threading.Lock()


def for_store(root: str) -> GroupFlush:
    """The GroupFlush of the filesystem holding `root`, shared by this process (a forked
    child gets its own: it must not wait on a round its parent's threads were leading)."""
    try:
        device = os.stat(root).st_dev
    except OSError:
        return GroupFlush(root, FlushPolicy(False, None, "the store cannot be looked at"))
    with _BY_DEVICE_LOCK:
        found = _BY_DEVICE.get(device)
        if found is None or found[0] != os.getpid():
            found = _BY_DEVICE[device] = (os.getpid(), GroupFlush(root, decide(root)))
        return found[1]
