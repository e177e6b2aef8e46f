"""`castore watch --exec`: a hook run per alert, and the verb's warnings on stderr. Apart
from `watch.py` so that the parser, built for every verb, does not import logging and
subprocess (about 10 ms of every command's start; issue 26)."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

from castore.errors import UsageError

log = logging.getLogger(__name__)


class Hooks:
    """Runs `--exec` once per alert, the alert JSON on its stdin, on a thread of its own so a
    slow hook never delays the next alert line. A hook that fails or hangs is logged."""

    def __init__(self, argv: list[str], timeout: float) -> None:
        self._argv = argv
        self._timeout = timeout
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="castore-watch-hooks", daemon=True)
        self._thread.start()

    def submit(self, alert_json: str, what: str) -> None:
        """Run the hook on `alert_json` (one alert, as `watch --json` prints it); `what` names
        the alert in a warning ("raised stuck alert")."""
        self._queue.put((alert_json, what))

    def close(self) -> None:
        """Skip hooks not started yet; let the running one finish (within its timeout)."""
        skipped = 0
        with contextlib.suppress(queue.Empty):
            while True:
                skipped += self._queue.get_nowait() is not None
        if skipped:
            log.warning("shutting down: skipped the hook for %d alert(s)", skipped)
        self._queue.put(None)
        self._thread.join(timeout=self._timeout + 5.0)

    def _run(self) -> None:
        while (alert := self._queue.get()) is not None:
            try:
                self._call(*alert)
            except Exception:  # a hook must never stop the watcher
                log.exception("hook %s failed", shlex.join(self._argv))

    def _call(self, alert_json: str, what: str) -> None:
        command = shlex.join(self._argv)
        try:
            # The command line is the operator's own --exec, run without a shell. Its own
            # session lets a timeout kill everything it started. Its stdout goes to our
            # stderr (fd 2) so it never mixes with the alert stream on stdout.
            child = subprocess.Popen(  # noqa: S603
                self._argv, stdin=subprocess.PIPE, stdout=2, start_new_session=True
            )
        except OSError as exc:
            log.warning("hook %s could not start for a %s: %s", command, what, exc)
            return
        try:
            child.communicate((alert_json + "\n").encode(), timeout=self._timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            log.warning(
                "hook %s timed out after %gs on a %s; killed it", command, self._timeout, what
            )
            return
        if child.returncode != 0:
            log.warning("hook %s exited %d on a %s", command, child.returncode, what)


def hook_argv(command: str | None) -> list[str] | None:
    """`--exec`'s command as argv (None without one); UsageError if it names no program."""
    if command is None:
        return None
    try:
        argv = shlex.split(command)
    except ValueError as exc:  # an unclosed quote, or a backslash at the end
        raise UsageError(f"--exec {command!r}: {exc}; quote it as a shell would") from None
    if not argv:
        raise UsageError("--exec needs a command, as in --exec 'notify-team --channel ops'")
    if shutil.which(argv[0]) is None:
        raise UsageError(f"--exec: {argv[0]!r} is not an executable file or on PATH")
    return argv


@contextlib.contextmanager
def log_to_stderr() -> Iterator[None]:
    """The watcher's and the hooks' warnings, one line each on stderr, while the verb runs."""
    logger = logging.getLogger("castore")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("castore watch: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
