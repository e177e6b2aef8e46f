"""What every probe uses: the scratch context, exclusive create, whole reads, waiting to see."""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections.abc import Callable

# The tunables live on the package, where tests set them: read them there at call time.
from castore.doctor import settings

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC
READ_FLAGS = os.O_RDONLY | O_NOFOLLOW | O_CLOEXEC


class CheckFailed(Exception):
    """Raised inside a check to fail it with a message."""


@dataclasses.dataclass
class Context:
    a: str  # the scratch directory through `path`
    b: str | None  # the same scratch directory through `peer`, when usable
    peer_given: bool

    @property
    def peer_note(self) -> str:
        return " (peer part not run: the peer does not see the scratch directory)"


def describe(exc: OSError) -> str:
    code = errno.errorcode.get(exc.errno or 0, "errno ?")
    where = f" on {exc.filename}" if exc.filename else ""
    return f"{code} ({exc.strerror or exc}){where}"


def write_new(path: str, data: bytes, *, sync: bool = False) -> None:
    fd = os.open(path, CREATE_FLAGS, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_bytes(path: str) -> bytes:
    fd = os.open(path, READ_FLAGS)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def expect_eexist(op: Callable[[], object], what: str) -> None:
    """Run `op`, which must fail with EEXIST; raise CheckFailed otherwise."""
    try:
        op()
    except FileExistsError:
        return
    except OSError as exc:
        raise CheckFailed(f"{what} failed with {describe(exc)} instead of EEXIST") from exc
    raise CheckFailed(f"{what} succeeded: an existing name was not protected")


def wait_for(probe: Callable[[], bool]) -> float | None:
    """Poll `probe` until it is true; seconds it took, or None after settings.VISIBILITY_TIMEOUT."""
    timeout = settings.VISIBILITY_TIMEOUT
    start = time.monotonic()
    while True:
        if probe():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(0.01)


def reads(path: str, expected: bytes) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return read_bytes(path) == expected
        except FileNotFoundError:
            return False

    return probe


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"
