"""The alerts page's board: a castore.watch Watcher of the store, started on the first visit,
and what it raised that still holds, with the latest alerts as they came (read-only).

The watcher is the one `castore watch` runs, with its defaults: the page shows exactly the
alerts the command would print. It starts in a thread of its own, since its first scan
verifies every chain, which on a large store takes longer than a page may wait.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from castore.errors import CastoreError
from castore.watch.alerts import Alert, Ident

RECENT = 50  # alerts kept for the page's "latest" list


class Board:
    """What holds now, by (task, step, kind), and the newest alerts; thread-safe."""

    def __init__(self, store_path: str, *, stuck_after: float, **watch_options: Any) -> None:
        self._store_path = store_path
        self._stuck_after = stuck_after
        self._options = watch_options
        self._lock = threading.Lock()
        self._active: dict[Ident, Alert] = {}
        self._recent: collections.deque[Alert] = collections.deque(maxlen=RECENT)
        self._version = 0
        self._state = "not started"  # not started, scanning, watching, failed: <why>
        self._mode = ""
        self._watcher: Any = None
        self._stopping = threading.Event()

    def ensure_started(self) -> None:
        """Start watching, once (the first visit of the alerts page)."""
        with self._lock:
            if self._state != "not started":
                return
            self._state = "scanning"
            self._version += 1
        threading.Thread(target=self._start, name="castore-ui-watch", daemon=True).start()

    def _start(self) -> None:
        from castore.watch import Watcher  # noqa: PLC0415 - watchdog, only for this page

        try:
            watcher = Watcher(
                self._store_path, self._on_alert, stuck_after=self._stuck_after, **self._options
            )
            watcher.start()  # its first scan: every alert that holds now, before it returns
        except (CastoreError, OSError) as exc:
            self._set_state(f"failed: {exc}")
            return
        with self._lock:
            self._watcher, self._mode = watcher, watcher.mode
        if self._stopping.is_set():
            watcher.stop()
            return
        self._set_state("watching")

    def _set_state(self, state: str) -> None:
        with self._lock:
            self._state = state
            self._version += 1

    def _on_alert(self, alert: Alert) -> None:
        ident = (alert.task, alert.step, alert.kind)
        with self._lock:
            if alert.status == "raised":
                self._active[ident] = alert
            else:
                self._active.pop(ident, None)
            self._recent.appendleft(alert)
            self._version += 1

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            watcher = self._watcher
        if watcher is not None:
            watcher.stop()

    def snapshot(self) -> dict[str, Any]:
        """The board as JSON values: its version (it grows with every change), the state of
        the watcher, the alerts that hold now (oldest first) and the latest ones."""
        with self._lock:
            active = sorted(self._active.values(), key=lambda alert: alert.time)
            return {
                "version": self._version,
                "state": self._state,
                "mode": self._mode,
                "active": [_shown(alert) for alert in active],
                "recent": [_shown(alert) for alert in self._recent],
            }


def _shown(alert: Alert) -> dict[str, Any]:
    data = alert.to_dict()
    data["when"] = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(alert.time))
    return data
