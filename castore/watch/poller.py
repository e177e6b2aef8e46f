"""An observer of a store without filesystem events (S3): every `poll` seconds it lists the
task names through the store's medium and hints each task, whose re-read (the watcher's
`extend_head`) costs a HEAD lookup and the slots committed since, a few requests a task.

Like the filesystem observer it never reads a task itself; a listing that fails makes it
unhealthy (the watcher alerts and restarts it), never a task that looks empty.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from castore.errors import CastoreError, InvalidTaskIdError
from castore.format.layout import TASKS_DIR, decode_task_id
from castore.medium.base import Medium

DEFAULT_POLL_S = 5.0  # an S3 listing per task every 5 s: about a request a second per 5 tasks


class MediumPoller:
    """One run of a thread that hints every task of `medium` each `poll` seconds."""

    def __init__(
        self,
        medium: Medium,
        poll: float,
        hint: Callable[[str], None],
        hint_all: Callable[[], None],
    ) -> None:
        del hint_all  # a listing sees tasks come and go: each is hinted by name
        self.tasks_dir = medium.where(TASKS_DIR)
        self._medium = medium
        self._poll = poll
        self._hint = hint
        self._stop = threading.Event()
        self._failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="castore-watch-poll", daemon=True)
        self._thread.start()
        self.since = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def problem(self) -> str | None:
        """What keeps this poller from seeing commits, or None if it is healthy."""
        if not self._thread.is_alive():
            return "its thread exited"
        return self._failure

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                names = self._medium.names(TASKS_DIR)
            except (CastoreError, OSError) as exc:
                self._failure = f"listing {self.tasks_dir} failed: {exc}"
                return  # unhealthy: the watcher alerts, then starts a new poller
            for name in names:
                try:
                    self._hint(decode_task_id(name))
                except InvalidTaskIdError:
                    continue  # not castore's: fsck reports it
