"""`castore watch`: follow a store and print one line per alert, optionally running a hook."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

from castore.cli.common import EXIT_OK, add_path_argument, parse_duration, store_path
from castore.format.layout import display_name

if TYPE_CHECKING:
    from castore.cli.watchhooks import Hooks
    from castore.watch.alerts import Alert

DEFAULT_EXEC_TIMEOUT_S = 10.0


def alert_line(alert: Alert) -> str:
    """One alert as one line for people: UTC time, RAISED/CLEARED, kind, what to do."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(alert.time))
    return f"{when} {alert.status.upper()} {alert.kind}: {display_name(alert.message)}"


def alert_json(alert: Alert) -> str:
    """The alert as `watch --json` prints it and a hook reads it: its fields and a "type"."""
    return json.dumps({"type": "alert", **alert.to_dict()}, sort_keys=True, ensure_ascii=False)


def _printer(as_json: bool, hooks: Hooks | None, stop: threading.Event) -> Callable[[Alert], None]:
    def on_alert(alert: Alert) -> None:
        try:
            print(alert_json(alert) if as_json else alert_line(alert), flush=True)
        except BrokenPipeError:
            # The reader went away (`castore watch | head -1`): stop quietly, and keep the
            # interpreter's final flush from complaining about the closed pipe.
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            stop.set()
            return
        if hooks is not None:
            hooks.submit(alert_json(alert), f"{alert.status} {alert.kind} alert")

    return on_alert


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM end the watch cleanly (only the main thread may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def cmd_watch(args: argparse.Namespace) -> int:
    # Imported here, not at the top: only this verb needs watchdog, logging and subprocess,
    # and every verb module is imported whenever the parser is built.
    from castore.cli.watchhooks import Hooks, hook_argv, log_to_stderr  # noqa: PLC0415
    from castore.watch import Watcher  # noqa: PLC0415
    from castore.watch.alerts import span  # noqa: PLC0415

    argv = hook_argv(args.exec)
    stop = threading.Event()
    with log_to_stderr(), _stop_on_signals(stop), warnings.catch_warnings():
        # watchdog's inotify observer warns when a new directory's watch is added twice
        # (the create event and its own scan of the new tree race); it is harmless noise.
        warnings.filterwarnings("ignore", "Callback with id", RuntimeWarning, r"watchdog\.")
        hooks = Hooks(argv, args.exec_timeout) if argv is not None else None
        try:
            watcher = Watcher(
                store_path(args),
                _printer(args.json, hooks, stop),
                stuck_after=args.stuck_after,
                poll=args.poll,
                rescan_every=args.rescan,
            )
            print(
                f"castore watch: watching {watcher.root} ({watcher.mode}; rescan every "
                f"{span(args.rescan)}; stuck after {span(args.stuck_after)}); stop with Ctrl-C",
                file=sys.stderr,
                flush=True,
            )
            with watcher:
                while not stop.wait(1.0):
                    pass
        finally:
            if hooks is not None:
                hooks.close()
    return EXIT_OK


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watch = verbs.add_parser(
        "watch", help="follow a store; alert on unresolved, stuck or expiring effects"
    )
    add_path_argument(watch)
    watch.add_argument(
        "--json", action="store_true", help='one JSON object per alert ("type": "alert")'
    )
    watch.add_argument(
        "--stuck-after",
        type=parse_duration,
        default=300.0,
        metavar="DURATION",
        help="alert on an effect SUBMITTED this long (300, 300s, 5m, 2h, 1d; default 5m)",
    )
    watch.add_argument(
        "--poll",
        type=parse_duration,
        metavar="SECONDS",
        help="poll every SECONDS instead of inotify (network filesystems: NFS, sshfs, CephFS)",
    )
    watch.add_argument(
        "--rescan",
        type=parse_duration,
        default=30.0,
        metavar="SECONDS",
        help="re-read every task this often, whatever the events say (default 30s)",
    )
    watch.add_argument(
        "--exec",
        metavar="CMD",
        help="run CMD (no shell) per alert with the alert JSON on stdin",
    )
    watch.add_argument(
        "--exec-timeout",
        type=parse_duration,
        default=DEFAULT_EXEC_TIMEOUT_S,
        metavar="SECONDS",
        help="kill a hook still running after this long (default 10s)",
    )
    watch.set_defaults(handler=cmd_watch)
