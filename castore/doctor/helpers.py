"""Helper processes: our own interpreter running a probe's script, spoken to line by line."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import subprocess
import sys
import time

from castore.doctor import settings
from castore.doctor.primitives import CheckFailed


def spawn(script: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 -- our own interpreter running our own script
        [sys.executable, "-I", "-S", "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def send(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None  # noqa: S101 -- spawned with stdin=PIPE
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


def read_line(proc: subprocess.Popen[bytes]) -> bytes:
    """One line from a helper's stdout, without blocking past settings.WORKER_TIMEOUT."""
    assert proc.stdout is not None  # noqa: S101 -- spawned with stdout=PIPE
    timeout = settings.WORKER_TIMEOUT
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise CheckFailed(f"a helper process did not answer within {timeout:g}s")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise CheckFailed(f"a helper process exited early (status {proc.wait()})")
        buf += chunk
    return buf.strip()


def expect_line(proc: subprocess.Popen[bytes], expected: bytes) -> None:
    line = read_line(proc)
    if line != expected:
        raise CheckFailed(f"a helper process said {line!r} instead of {expected!r}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def errno_answer(answer: str) -> str:
    parts = answer.split()
    if len(parts) == 2 and parts[0] == "error" and parts[1].isdigit():
        code = int(parts[1])
        return f"{errno.errorcode.get(code, 'errno ?')} ({os.strerror(code)})"
    return answer
