"""Per-task local lock (the only importer of filelock): queues workers on one host.

Correctness never rests on it: on a network filesystem two hosts' locks may not see each
other. The commit point (an exclusive link) is what makes a commit safe; the lock only
spares local contenders a ConflictError.
"""

from __future__ import annotations

import filelock

from castore.errors import TaskBusyError

LOCK_MODE = 0o664  # group members share a store


class TaskLock:
    """A held or not-yet-held lock on one task."""

    def __init__(self, path: str, task_id: str) -> None:
        self._task_id = task_id
        self._lock = filelock.FileLock(path, mode=LOCK_MODE, thread_local=False)

    def acquire(self, timeout: float) -> None:
        """Wait up to `timeout` seconds (negative: forever) for the lock."""
        try:
            self._lock.acquire(timeout=timeout)
        except filelock.Timeout:
            raise TaskBusyError(self._task_id, timeout) from None

    def release(self) -> None:
        """Release the lock; the lock file stays (unlinking it would split waiters)."""
        self._lock.release()
