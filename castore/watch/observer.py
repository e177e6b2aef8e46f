"""A filesystem observer of a store's tasks/ directory: events become "re-read this task"
hints, and the observer can say when it is not healthy. The only importer of watchdog.

Events are only hints (see castore.watch): the observer never reads a task itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from castore.errors import InvalidTaskIdError
from castore.format.layout import CHAIN_DIR, decode_task_id

# Opens and closes (the task lock) are not commits; asking for fewer events keeps the
# inotify queue shorter, and an overflowing queue loses events.
_HINT_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]


class _Hints(FileSystemEventHandler):
    """Turns filesystem events under tasks/ into 're-read this task' hints."""

    def __init__(
        self, tasks_dir: str, hint: Callable[[str], None], hint_all: Callable[[], None]
    ) -> None:
        self._tasks_dir = tasks_dir
        self._hint = hint
        self._hint_all = hint_all

    def on_any_event(self, event: FileSystemEvent) -> None:
        for raw in (event.src_path, event.dest_path):
            if raw:
                self._route(os.path.relpath(os.fsdecode(raw), self._tasks_dir))

    def _route(self, relative: str) -> None:
        if relative == os.curdir:
            self._hint_all()  # tasks/ itself changed (replaced, removed): look at everything
            return
        parts = relative.split(os.sep)
        if parts[0] == os.pardir or (len(parts) > 1 and parts[1] != CHAIN_DIR):
            return  # outside tasks/, or the task's lock file: not a commit
        try:
            self._hint(decode_task_id(parts[0]))
        except InvalidTaskIdError:
            return  # not castore's: fsck reports it


class TasksObserver:
    """One run of a watchdog observer on `tasks_dir`: inotify, or polling every `poll`
    seconds (on a network filesystem, where inotify does not see other hosts' writes).
    `hint(task)` is called from the observer's thread for each commit-like event,
    `hint_all()` when tasks/ itself changed; both must be quick and take no lock the
    caller holds while it stops this observer."""

    def __init__(
        self,
        tasks_dir: str,
        poll: float | None,
        hint: Callable[[str], None],
        hint_all: Callable[[], None],
    ) -> None:
        self.tasks_dir = tasks_dir
        self.watched = _identity(tasks_dir)  # OSError if it cannot be observed at all
        self.observer: BaseObserver = Observer() if poll is None else PollingObserver(timeout=poll)
        handler = _Hints(tasks_dir, hint, hint_all)
        self.observer.schedule(handler, tasks_dir, recursive=True, event_filter=_HINT_EVENTS)
        self.observer.start()
        self.since = time.monotonic()

    def stop(self) -> None:
        self.observer.stop()
        if self.observer.is_alive():
            self.observer.join(timeout=5.0)

    def problem(self) -> str | None:
        """What keeps this observer from seeing commits, or None if it is healthy."""
        if not self.observer.is_alive():
            return "its thread exited"
        if not _emitters_alive(self.observer):
            return "its event emitter stopped"
        # inotify watches an inode: after tasks/ is replaced (restored, remounted) it goes
        # on watching the old one, alive and silent.
        try:
            if _identity(self.tasks_dir) != self.watched:
                return f"{self.tasks_dir} was replaced"
        except OSError as exc:
            return f"{self.tasks_dir} cannot be read: {exc.strerror or exc}"
        return None


def _emitters_alive(observer: BaseObserver) -> bool:
    try:
        emitters = tuple(observer.emitters)
    except RuntimeError:  # the set changed while copied: judge on the next tick
        return True
    return bool(emitters) and all(emitter.is_alive() for emitter in emitters)


def _identity(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return (info.st_dev, info.st_ino)
