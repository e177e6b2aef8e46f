"""The service process's main(): serve until SIGTERM/SIGINT or the parent's death."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from types import FrameType

from castore.lab.service.ledger import Ledger
from castore.lab.service.modes import Service
from castore.lab.service.server import Server
from castore.lab.service.wire import MODES

DESCRIPTION = (
    "A fake remote service with its own durable ledger (the outside world of castore's crash "
    "campaigns): it applies operations and appends each to a JSON-lines ledger, fsynced before "
    "the answer. Modes: idempotent (dedupe by key within a retention window), lookup (no "
    "dedupe; GET /lookup answers a key's first receipt), none."
)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m castore.lab.service", description=DESCRIPTION)
    parser.add_argument("--ledger", required=True, type=Path, help="JSON-lines ledger file")
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--retention", type=float, default=86400.0, help="dedupe window, seconds")
    parser.add_argument(
        "--clock-offset", type=float, default=0.0, help="seconds added to the wall clock"
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--ready-file", type=Path, help="receives the port once listening")
    parser.add_argument("--parent-pid", type=int, help="exit when this parent process is gone")
    return parser.parse_args(argv)


def _write_atomically(path: Path, text: str) -> None:
    """Publish a file whole: a reader never sees it half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _wait_for_stop(stop: threading.Event, parent_pid: int | None) -> None:
    # Re-parenting means the spawning process died; an orphaned service would hold its port
    # and ledger forever.
    while not stop.wait(0.2):
        if parent_pid is not None and os.getppid() != parent_pid:
            return


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or the parent's death), then exit 0."""
    args = _parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    service = Service(Ledger(args.ledger), args.mode, args.retention, args.clock_offset)
    server = Server(args.port, service)
    # serve_forever runs in a thread because shutdown() deadlocks if called from its thread.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    if args.ready_file is not None:
        _write_atomically(args.ready_file, f"{server.server_port}\n")
    _wait_for_stop(stop, args.parent_pid)
    server.shutdown()
    thread.join()
    service.shut()
    server.server_close()
    return 0
