"""Plain helpers shared by the tests: tree snapshots, waiting on conditions, damaging files."""

from __future__ import annotations

import hashlib
import os
import select
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from castore import crashpoints
from castore.cli import main as cli_main
from castore.format.digest import hash_bytes
from castore.format.layout import is_object_name

# (mode, size, mtime_ns, sha256 of the content | symlink target | None for other kinds)
Entry = tuple[int, int, int, str | None]


def tree_snapshot(path: str | os.PathLike[str]) -> dict[str, Entry]:
    """Every entry under `path` (itself included, as '.'), for byte-identical comparisons.

    Never follows a symlink and never opens anything but a regular file, so it is safe on a
    damaged store (FIFOs, links) and does not change what it looks at (beyond atimes).
    """
    root = os.fspath(path)
    found: dict[str, Entry] = {".": _entry(root)}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(directory, name)
            found[os.path.relpath(full, root)] = _entry(full)
    return found


def _entry(path: str) -> Entry:
    info = os.lstat(path)
    digest: str | None = None
    if stat.S_ISREG(info.st_mode):
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
    elif stat.S_ISLNK(info.st_mode):
        digest = "-> " + os.readlink(path)
    return (info.st_mode, info.st_size, info.st_mtime_ns, digest)


def wait_for(condition: Callable[[], object], timeout: float = 20.0, what: str = "") -> object:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(0.002)  # a poll interval, not a wait for the event itself


def spawn_child(
    children: list[subprocess.Popen[str]],
    code: str,
    *args: str,
    crash: str | None = None,
    pause: str | None = None,
) -> subprocess.Popen[str]:
    """A Python child running `code` with `args`, pipes for its output, armed to SIGKILL
    itself at crash point `crash` or to stop at `pause` (castore.crashpoints; neither is
    inherited from this process), and appended to `children` (the conftest fixture)."""
    env = {
        k: v for k, v in os.environ.items() if k not in (crashpoints.ENV_VAR, crashpoints.PAUSE_VAR)
    }
    if crash is not None:
        env[crashpoints.ENV_VAR] = crash
    if pause is not None:
        env[crashpoints.PAUSE_VAR] = pause
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    children.append(proc)
    return proc


def acks(lines: str) -> dict[int, str]:
    """seq -> id of every commit a child acknowledged ("ack SEQ ID" lines) in `lines`. A kill
    can tear the last line mid-print: only complete lines (ending in a newline) count."""
    found = {}
    for line in lines.split("\n")[:-1]:
        parts = line.split()
        if parts and parts[0] == "ack":
            found[int(parts[1])] = parts[2]
    return found


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """Wait (on the condition, with a deadline) until `proc` stopped itself at a pause point
    (CASTORE_PAUSE_AT); AssertionError if it ended instead."""

    def stopped() -> bool:
        pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
        if pid and not os.WIFSTOPPED(status):
            raise AssertionError(f"pid {proc.pid} ended instead of pausing: {status}")
        return bool(pid)

    wait_for(stopped, timeout, f"pid {proc.pid} to pause")


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """The next line of a child's stdout, or AssertionError if none comes before the deadline."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"no output from pid {proc.pid} within {timeout}s")
    return proc.stdout.readline()


def object_files(store_root: str | os.PathLike[str]) -> dict[str, Path]:
    """name -> path of every file in the objects fan-out directories (temp files included)."""
    found = {}
    for fanout in sorted(Path(store_root, "objects").iterdir()):
        for item in fanout.iterdir():
            found[item.name] = item
    return found


def misnamed_objects(store_root: str | os.PathLike[str]) -> list[str]:
    """Final-named object files whose bytes do not hash to their name (partial or damaged)."""
    bad = []
    for name, path in object_files(store_root).items():
        if is_object_name(name) and hash_bytes(path.read_bytes()) != name:
            bad.append(name)
    return bad


def rewrite(path: Path, transform: Callable[[bytes], bytes]) -> None:
    """Replace a read-only file's content in place (same inode), keeping its mode."""
    mode = stat.S_IMODE(path.stat().st_mode)
    path.chmod(0o644)
    data = transform(path.read_bytes())
    with open(path, "r+b") as handle:
        handle.write(data)
        handle.truncate(len(data))
    path.chmod(mode)


def flip_bit(data: bytes, index: int | None = None, bit: int = 0) -> bytes:
    """`data` with one bit flipped (in the middle byte unless `index` is given)."""
    position = len(data) // 2 if index is None else index
    return data[:position] + bytes([data[position] ^ (1 << bit)]) + data[position + 1 :]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = cli_main(list(argv))
    except SystemExit as exc:  # --help and --version exit through argparse
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def make_every_fanout(root: str | os.PathLike[str]) -> None:
    """All 256 fan-out directories, as a store in use has them: castore makes each one on
    first use, with one more flush (of objects/). For tests that count a commit's flushes."""
    for fanout in range(256):
        Path(root, "objects", f"{fanout:02x}").mkdir(exist_ok=True)
