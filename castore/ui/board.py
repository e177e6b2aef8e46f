"""The alerts page's board: `castore watch --json` on the store, run on the first visit, and
what it raised that still holds, with the latest alerts as they came (read-only).

The watch is the command itself, in a process of its own, so the page shows exactly the
alerts the command prints; and its scans (every chain verified in full, every 30 s) run on
another core than the pages, which they would otherwise slow, holding this interpreter's
lock. The process is stopped with the server, and by the kernel if the server dies first.
"""

from __future__ import annotations

import collections
import ctypes
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

RECENT = 50  # alerts kept for the page's "latest" list
_PR_SET_PDEATHSIG = 1
_SIGTERM = 15
_MODE = re.compile(r"^castore watch: watching .* \((.+?); rescan every ")


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the watch is stopped with the server only
        return None


# Looked up here, not in the child: a lookup after fork, in a process with threads, could wait
# forever on a loader lock some other thread held at the fork.
_PRCTL = _libc_prctl()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it ends (Linux)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, _SIGTERM)


class Board:
    """What holds now, by (task, step, kind), and the newest alerts; thread-safe. `argv` is
    the watch command, one JSON alert a line on its stdout."""

    def __init__(self, argv: Sequence[str]) -> None:
        self._argv = list(argv)
        self._lock = threading.Lock()
        self._active: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT)
        self._version = 0
        self._state = "not started"  # not started, starting, watching, stopped: <why>
        self._mode = ""
        self._proc: subprocess.Popen[str] | None = None
        self._stopping = threading.Event()

    def ensure_started(self) -> None:
        """Start watching (the alerts page's visit), unless it runs already."""
        with self._lock:
            if self._state in ("starting", "watching") or self._stopping.is_set():
                return
            self._state = "starting"
            self._active.clear()  # a new watch alerts again on whatever holds
            self._version += 1
        # The thread that starts the process lives as long as it: the kernel's "parent died"
        # signal follows the starting thread, not the process.
        threading.Thread(target=self._run, name="castore-ui-watch", daemon=True).start()

    def _run(self) -> None:
        try:
            proc = subprocess.Popen(  # noqa: S603 - castore's own command, no shell
                self._argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                errors="replace",
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - one prctl, before exec
            )
        except OSError as exc:
            self._set_state(f"stopped: the watch did not start ({exc})")
            return
        with self._lock:
            self._proc = proc
        if self._stopping.is_set():
            proc.terminate()
        errors = threading.Thread(target=self._read_errors, args=(proc,), daemon=True)
        errors.start()
        for line in proc.stdout or ():
            self._take(line)
        code = proc.wait()
        errors.join(timeout=5)
        if not self._stopping.is_set():
            self._set_state(f"stopped: castore watch exited with status {code}; {self._last}")

    _last = ""  # the watch's last line on stderr: why it stopped

    def _read_errors(self, proc: subprocess.Popen[str]) -> None:
        for line in proc.stderr or ():
            found = _MODE.match(line)
            if found is not None:
                with self._lock:
                    self._mode, self._state = found.group(1), "watching"
                    self._version += 1
            elif line.strip():
                self._last = line.strip()

    def _take(self, line: str) -> None:
        try:
            alert = json.loads(line)
        except ValueError:
            return  # not an alert line
        if not isinstance(alert, dict) or alert.get("type") != "alert":
            return
        alert["when"] = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(float(alert["time"])))
        ident = (alert.get("task"), alert.get("step"), alert.get("kind"))
        with self._lock:
            if alert.get("status") == "raised":
                self._active[ident] = alert
            else:
                self._active.pop(ident, None)
            self._recent.appendleft(alert)
            self._version += 1

    def _set_state(self, state: str) -> None:
        with self._lock:
            self._state = state
            self._version += 1

    def stop(self) -> None:
        """Stop the watch (the server is stopping)."""
        self._stopping.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def snapshot(self) -> dict[str, Any]:
        """The board as JSON values: its version (it grows with every change), the state of
        the watch, the alerts that hold now (oldest first) and the latest ones."""
        with self._lock:
            active = sorted(self._active.values(), key=lambda alert: float(alert["time"]))
            return {
                "version": self._version,
                "state": self._state,
                "mode": self._mode,
                "active": active,
                "recent": list(self._recent),
            }


def watch_argv(store: str, stuck_after: float) -> list[str]:
    """`castore watch --json` on `store`, by this interpreter."""
    return [
        sys.executable,
        "-m",
        "castore",
        "watch",
        "--json",
        "--stuck-after",
        f"{stuck_after:g}",
        "--store",
        store,
    ]
