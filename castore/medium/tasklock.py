"""Per-task local lock (the only importer of filelock): queues workers on one host.

No commit rests on it: on a network filesystem two hosts' locks may not see each other. The
commit point (an exclusive link) is what makes a commit safe; for commits the lock only spares
local contenders a ConflictError. For effects it says more: a run holds it until its sends
have ended (Run.close, castore.run.inflight), so where locks are coherent a run that got it knows
no earlier run's send still runs (docs/FORMAT.md §14).
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import TYPE_CHECKING, Protocol

from castore.errors import TaskBusyError
from castore.medium import oserrors

LOCK_MODE = 0o664  # group members share a store
LOCK_LOGGER = "castore.lock"  # where a wait for a held lock is told (docs/howto/agents.md)
_NO_FLOCK = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}

if TYPE_CHECKING:
    import filelock


class HeldLock(Protocol):
    """What a run does with its task's lock or lease: let it go when it is done."""

    def release(self) -> None: ...


class TaskLock:
    """A held or not-yet-held lock on one task."""

    def __init__(self, path: str, task_id: str) -> None:
        # Imported by the first lock (with logging, ~20 ms): a reader never takes one.
        import filelock  # noqa: PLC0415

        self._filelock = filelock
        self._task_id = task_id
        self._path = path
        # Never delete the lock file (unlinking splits waiters across inodes), and never fall
        # back to filelock's soft lock, which a crashed holder on another host would wedge.
        self._lock: filelock.FileLock = filelock.FileLock(
            path,
            mode=LOCK_MODE,
            thread_local=False,
            preserve_lock_file=True,
            fallback_to_soft=False,
        )

    def acquire(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds (negative: forever) for the lock; False if this
        filesystem has no flock at all (then the commit point alone keeps commits safe)."""
        try:
            self._wait(timeout)
        except self._filelock.Timeout:
            raise TaskBusyError(self._task_id, timeout) from None
        except NotImplementedError:
            return False
        except OSError as exc:
            if exc.errno in _NO_FLOCK:
                return False
            # A planted symlink (O_NOFOLLOW: ELOOP), no permission, an I/O error.
            raise oserrors.io_error(self._path, "opening and locking the task lock", exc) from exc
        return True

    def _wait(self, timeout: float) -> None:
        """Take the lock at once if it is free; else say so (a person at a terminal sees a
        second copy of a task waiting, not hanging) and wait up to `timeout` seconds."""
        try:
            self._lock.acquire(blocking=False)
        except self._filelock.Timeout:
            if timeout == 0:
                raise
            # logging, loaded with filelock already: a program's own handlers get the line,
            # and with none configured Python's last-resort handler prints it on stderr.
            import logging  # noqa: PLC0415

            limit = "with no time limit" if timeout < 0 else f"up to {timeout:g}s"
            logging.getLogger(LOCK_LOGGER).warning(
                "task %r is held by another worker on this host; waiting %s for its lock",
                self._task_id,
                limit,
            )
            self._lock.acquire(timeout=timeout)

    def release(self) -> None:
        """Release the lock; the lock file stays (unlinking it would split waiters)."""
        try:
            self._lock.release()
        except OSError as exc:  # the kernel dropped the lock with the descriptor; an I/O error
            raise oserrors.io_error(self._path, "releasing the task lock", exc) from exc


def held(path: str) -> bool:
    """True if a worker holds the lock file `path`; asks with a shared, non-blocking flock
    (taken and let go at once: nothing is written, no worker is kept waiting)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
