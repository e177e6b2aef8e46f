"""start_service and ServiceProcess: the service as a subprocess, started and stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from castore.lab.service.client import ServiceClient
from castore.lab.service.errors import ServiceStartError
from castore.lab.service.wire import HOST, MODES

READY_POLL_S: Final = 0.005


class ServiceProcess:
    """A running service subprocess; stop() or leaving a `with` block ends it."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, stderr: IO[bytes]) -> None:
        self.process = process
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self._stderr = stderr
        self._stderr_text: str | None = None

    @property
    def pid(self) -> int:
        """The service's process id."""
        return self.process.pid

    def client(self, timeout: float = 5.0) -> ServiceClient:
        """A client for this service."""
        return ServiceClient(self.url, timeout)

    def stderr_text(self) -> str:
        """Everything the service wrote to stderr so far."""
        if self._stderr_text is not None:
            return self._stderr_text
        return _read_all(self._stderr)

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, wait, SIGKILL if it will not go; returns the exit code (0 when clean)."""
        _terminate(self.process, timeout)
        return self._finish()

    def kill(self) -> int:
        """SIGKILL with no warning, like a crash; returns the exit code (-9)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        return self._finish()

    def _finish(self) -> int:
        if self._stderr_text is None:
            self._stderr_text = _read_all(self._stderr)
            self._stderr.close()
        return int(self.process.returncode)

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_service(
    ledger: Path,
    mode: str,
    retention_s: float = 86400.0,
    *,
    clock_offset_s: float = 0.0,
    python: str = sys.executable,
    port: int = 0,
    ready_timeout_s: float = 10.0,
    exit_with_parent: bool = True,
) -> ServiceProcess:
    """Spawn `python -m castore.lab.service` and return once it listens on 127.0.0.1.
    `clock_offset_s` sets the service's clock apart from the wall clock (its retention
    window and ledger times follow it), as for a service on a host with a skewed clock."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    workdir = Path(tempfile.mkdtemp(prefix="castore-service-"))
    ready = workdir / "port"
    argv = [
        python,
        "-m",
        "castore.lab.service",
        "--ledger",
        os.fspath(ledger),
        "--mode",
        mode,
        "--retention",
        str(retention_s),
        "--clock-offset",
        str(clock_offset_s),
        "--port",
        str(port),
        "--ready-file",
        str(ready),
    ]
    if exit_with_parent:
        argv += ["--parent-pid", str(os.getpid())]
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - owned by ServiceProcess, closed on stop
    # Our own argv, no shell; a new session keeps a terminal's Ctrl-C (or a campaign killing
    # the worker's process group) from reaching the outside world by accident.
    process = subprocess.Popen(  # noqa: S603
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=_child_env(),
        start_new_session=True,
    )
    try:
        bound = _await_ready(process, ready, stderr, ready_timeout_s)
    except BaseException:
        _terminate(process, 1.0)
        stderr.close()
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return ServiceProcess(process, bound, stderr)


def _child_env() -> dict[str, str]:
    """The parent's environment, with this checkout importable even when not installed."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _await_ready(
    process: subprocess.Popen[bytes], ready: Path, stderr: IO[bytes], timeout_s: float
) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            return int(ready.read_text())
        code = process.poll()
        if code is not None:
            raise ServiceStartError(
                f"the service exited with code {code} before listening; its stderr:\n"
                f"{_read_all(stderr)}"
            )
        time.sleep(READY_POLL_S)
    raise ServiceStartError(
        f"the service did not listen within {timeout_s} s; its stderr so far:\n{_read_all(stderr)}"
    )


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _read_all(stream: IO[bytes]) -> str:
    stream.seek(0)
    return stream.read().decode(errors="replace")
