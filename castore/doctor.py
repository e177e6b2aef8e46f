"""Doctor: probe whether a directory's filesystem gives castore the guarantees it relies on."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import secrets
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

from castore.errors import UsageError

__all__ = ["Check", "DoctorReport", "run_doctor"]

Verdict = Literal["ok", "fail", "warn", "skip"]

RACE_ROUNDS = 50
"""Rounds of each two-process race (O_CREAT|O_EXCL, and link())."""

VISIBILITY_TIMEOUT = 3.0
"""Seconds a change made through one path may take to show through the other."""

WORKER_TIMEOUT = 20.0
"""Seconds a helper process may take to answer before the check fails."""

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC

_LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs"})
_FS_NOTES = {
    "tmpfs": "tmpfs lives in memory: everything is lost on reboot (fine for tests only)",
    "ramfs": "ramfs lives in memory: everything is lost on reboot (fine for tests only)",
    "overlay": "overlayfs: the store vanishes with the container unless this is a volume",
    "nfs": "NFS: fsync is durable only if the server exports with 'sync'; readers on other "
    "clients see changes at open() (close-to-open consistency)",
    "nfs4": "NFS: fsync is durable only if the server exports with 'sync'; readers on other "
    "clients see changes at open() (close-to-open consistency)",
    "ceph": "CephFS: primitives are coherent across clients; fsync durability is the cluster's",
    "cifs": "SMB/CIFS: hard links and O_EXCL depend on the server and mount options",
    "smb3": "SMB/CIFS: hard links and O_EXCL depend on the server and mount options",
    "9p": "9p: semantics depend on the host side; do not share it between hosts",
    "virtiofs": "virtiofs: semantics and durability are the host's",
    "fuse.sshfs": "sshfs: file fsync is forwarded (fsync@openssh.com) but directory fsync never "
    "reaches the server, flock is per client, st_nlink is always 1, and a client that loses a "
    "create/link race sees EPERM, not EEXIST",
}


@dataclasses.dataclass(frozen=True)
class Check:
    """One probe of one filesystem property."""

    name: str
    verdict: Verdict
    detail: str
    required: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    """Every check `run_doctor` made, in the order it made them."""

    path: str
    peer: str | None
    checks: list[Check]

    @property
    def safe(self) -> bool:
        """True when no required check failed: castore's primitives hold here."""
        return not any(c.required and c.verdict == "fail" for c in self.checks)

    def check(self, name: str) -> Check:
        """The check called `name` (KeyError if there is none)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "peer": self.peer,
            "safe": self.safe,
            "checks": [c.to_json() for c in self.checks],
        }

    def to_text(self) -> str:
        """A human-readable table, one check per line."""
        width = max((len(c.name) for c in self.checks), default=0)
        where = self.path if self.peer is None else f"{self.path} (peer {self.peer})"
        lines = [f"castore doctor: {where}"]
        for c in self.checks:
            tag = "" if c.required else " (info)"
            lines.append(f"  {c.verdict:<4}  {c.name:<{width}}  {c.detail}{tag}")
        failed = [c.name for c in self.checks if c.required and c.verdict == "fail"]
        if failed:
            lines.append(f"NOT SAFE for castore: {', '.join(failed)} failed")
        else:
            lines.append("safe for castore: every required check passed")
        return "\n".join(lines)


class _CheckFailed(Exception):
    """Raised inside a check to fail it with a message."""


@dataclasses.dataclass
class _Context:
    a: str  # the scratch directory through `path`
    b: str | None  # the same scratch directory through `peer`, when usable
    peer_given: bool

    @property
    def peer_note(self) -> str:
        return " (peer part not run: the peer does not see the scratch directory)"


def _describe(exc: OSError) -> str:
    code = errno.errorcode.get(exc.errno or 0, "errno ?")
    where = f" on {exc.filename}" if exc.filename else ""
    return f"{code} ({exc.strerror or exc}){where}"


def _write_new(path: str, data: bytes, *, sync: bool = False) -> None:
    fd = os.open(path, _CREATE_FLAGS, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    fd = os.open(path, _READ_FLAGS)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _expect_eexist(op: Callable[[], object], what: str) -> None:
    """Run `op`, which must fail with EEXIST; raise _CheckFailed otherwise."""
    try:
        op()
    except FileExistsError:
        return
    except OSError as exc:
        raise _CheckFailed(f"{what} failed with {_describe(exc)} instead of EEXIST") from exc
    raise _CheckFailed(f"{what} succeeded: an existing name was not protected")


def _wait_for(probe: Callable[[], bool]) -> float | None:
    """Poll `probe` until it is true; seconds it took, or None after VISIBILITY_TIMEOUT."""
    timeout = VISIBILITY_TIMEOUT
    start = time.monotonic()
    while True:
        if probe():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(0.01)


def _reads(path: str, expected: bytes) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return _read(path) == expected
        except FileNotFoundError:
            return False

    return probe


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


# --- checks -------------------------------------------------------------------------------------


def _check_exclusive_create(ctx: _Context) -> tuple[Verdict, str]:
    a, b = ctx.a, ctx.b
    first = os.path.join(a, "excl-1")
    _write_new(first, b"first")
    _expect_eexist(lambda: _write_new(first, b"second"), "O_CREAT|O_EXCL on an existing name")
    detail = "O_CREAT|O_EXCL on an existing name fails with EEXIST"
    if b is not None:
        _expect_eexist(
            lambda: _write_new(os.path.join(b, "excl-1"), b"peer"),
            "O_CREAT|O_EXCL through peer on a name created through path",
        )
        _write_new(os.path.join(b, "excl-2"), b"from peer")
        _expect_eexist(
            lambda: _write_new(os.path.join(a, "excl-2"), b"path"),
            "O_CREAT|O_EXCL through path on a name created through peer",
        )
        detail += ", also across path and peer in both directions"
    elif ctx.peer_given:
        detail += ctx.peer_note
    if _read(first) != b"first":
        raise _CheckFailed("the losing O_CREAT|O_EXCL changed the winner's content")
    return "ok", detail


def _check_link_exclusive(ctx: _Context) -> tuple[Verdict, str]:
    a, b = ctx.a, ctx.b
    src1, dst = os.path.join(a, "link-src-1"), os.path.join(a, "link-dst")
    _write_new(src1, b"one")
    try:
        os.link(src1, dst)
    except OSError as exc:
        raise _CheckFailed(
            f"link() does not work here: {_describe(exc)}; castore commits by hard-linking "
            "a finished temp file, so this filesystem cannot hold a store"
        ) from exc
    src2 = os.path.join(a, "link-src-2")
    _write_new(src2, b"two")
    _expect_eexist(lambda: os.link(src2, dst), "link() onto an existing name")
    detail = "link() works and link() onto an existing name fails with EEXIST"
    if b is not None:
        src3 = os.path.join(b, "link-src-3")
        _write_new(src3, b"three")
        _expect_eexist(
            lambda: os.link(src3, os.path.join(b, "link-dst")),
            "link() through peer onto a name linked through path",
        )
        os.link(src3, os.path.join(b, "link-dst-2"))
        _expect_eexist(
            lambda: os.link(src2, os.path.join(a, "link-dst-2")),
            "link() through path onto a name linked through peer",
        )
        if _read(os.path.join(a, "link-dst-2")) != b"three":
            raise _CheckFailed("the name linked through peer does not read back through path")
        detail += ", also across path and peer in both directions"
    elif ctx.peer_given:
        detail += ctx.peer_note
    if _read(dst) != b"one":
        raise _CheckFailed("the losing link() changed the winner's content")
    return "ok", detail


def _check_rename_over(ctx: _Context) -> tuple[Verdict, str]:
    a, b = ctx.a, ctx.b
    target, tmp = os.path.join(a, "ren-target"), os.path.join(a, "ren-tmp-1")
    _write_new(target, b"old", sync=True)
    _write_new(tmp, b"new-1", sync=True)
    os.replace(tmp, target)
    if _read(target) != b"new-1":
        raise _CheckFailed("after os.replace the target does not hold the new content")
    if os.path.lexists(tmp):
        raise _CheckFailed("after os.replace the source name still exists")
    detail = "os.replace over an existing file leaves exactly the new content"
    if b is not None:
        took = _wait_for(_reads(os.path.join(b, "ren-target"), b"new-1"))
        if took is None:
            raise _CheckFailed(
                f"peer still does not read the new content {VISIBILITY_TIMEOUT:g}s after the "
                "rename through path"
            )
        tmp2 = os.path.join(b, "ren-tmp-2")
        _write_new(tmp2, b"new-2", sync=True)
        os.replace(tmp2, os.path.join(b, "ren-target"))
        took2 = _wait_for(_reads(target, b"new-2"))
        if took2 is None:
            raise _CheckFailed(
                f"path still does not read the new content {VISIBILITY_TIMEOUT:g}s after the "
                "rename through peer"
            )
        detail += (
            f"; the other side reads it (path->peer after {_ms(took)}, "
            f"peer->path after {_ms(took2)})"
        )
    elif ctx.peer_given:
        detail += ctx.peer_note
    return "ok", detail


_RENAME_READER = r"""
import json, os, sys, time
path, duration, size = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
reads = missing = torn = 0
sys.stdout.write("ready\n"); sys.stdout.flush()
end = time.monotonic() + duration
while time.monotonic() < end:
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        missing += 1
        continue
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
    finally:
        os.close(fd)
    reads += 1
    if len(data) != size or data != data[:16] * (size // 16):
        torn += 1
sys.stdout.write(json.dumps({"reads": reads, "missing": missing, "torn": torn}) + "\n")
"""


def _check_rename_no_gap(ctx: _Context) -> tuple[Verdict, str]:
    a = ctx.a
    reader_dir = ctx.b if ctx.b is not None else a
    target = os.path.join(a, "gap-target")
    size = 16 * 64

    def content(n: int) -> bytes:
        return f"gen-{n:011d}\n".encode() * 64

    _write_new(target, content(0))
    proc = _spawn(_RENAME_READER, os.path.join(reader_dir, "gap-target"), "0.4", str(size))
    renames = 0
    try:
        _expect_line(proc, b"ready")
        while proc.poll() is None:
            renames += 1
            tmp = os.path.join(a, f"gap-tmp-{renames}")
            _write_new(tmp, content(renames))
            os.replace(tmp, target)
        result = json.loads(_read_line(proc))
    finally:
        _stop(proc)
    side = "peer" if ctx.b is not None else "path"
    summary = (
        f"{result['reads']} reads through {side} during {renames} renames through path: "
        f"{result['missing']} found the name missing, {result['torn']} read torn content"
    )
    if result["torn"]:
        return "fail", summary
    if result["missing"]:
        return "warn", summary + "; a reader can briefly miss a file being replaced"
    if result["reads"] == 0:
        return "warn", summary + "; the reader never got a read in"
    return "ok", summary


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_directory_fsync(ctx: _Context) -> tuple[Verdict, str]:
    where = [("path", ctx.a)] + ([("peer", ctx.b)] if ctx.b is not None else [])
    for label, directory in where:
        try:
            _fsync_dir(directory)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return "warn", (
                    f"fsync of a directory through {label} is refused with EINVAL (policy: "
                    "EINVAL -> warn, any other error -> fail): some FUSE and NFS setups cannot "
                    "sync a directory, so whether a published name survives a crash depends on "
                    "the server committing renames and links itself"
                )
            raise
    return "ok", (
        "open(dir, O_RDONLY|O_DIRECTORY) + fsync works"
        + (" through path and peer" if ctx.b is not None else "")
        + " (policy: EINVAL would be a warning, any other error a failure)"
    )


def _check_file_fsync(ctx: _Context) -> tuple[Verdict, str]:
    _write_new(os.path.join(ctx.a, "fsync-a"), b"x" * 4096, sync=True)
    detail = "fsync of a freshly written regular file works"
    if ctx.b is not None:
        _write_new(os.path.join(ctx.b, "fsync-b"), b"y" * 4096, sync=True)
        detail += " through path and peer"
    return "ok", detail


def _check_o_nofollow(ctx: _Context) -> tuple[Verdict, str]:
    a = ctx.a
    _write_new(os.path.join(a, "nf-target"), b"target")
    link = os.path.join(a, "nf-link")
    try:
        os.symlink("nf-target", link)
    except OSError as exc:
        return "skip", (
            f"cannot create symlinks here ({_describe(exc)}), so none can be planted either"
        )
    sides = [("path", a)] + ([("peer", ctx.b)] if ctx.b is not None else [])
    for label, directory in sides:
        try:
            fd = os.open(os.path.join(directory, "nf-link"), _READ_FLAGS)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise _CheckFailed(
                    f"open(symlink, O_NOFOLLOW) through {label} failed with {_describe(exc)} "
                    "instead of ELOOP"
                ) from exc
        else:
            os.close(fd)
            raise _CheckFailed(f"open(symlink, O_NOFOLLOW) through {label} followed the link")
    dangling = os.path.join(a, "nf-dangling")
    os.symlink("nf-absent", dangling)
    _expect_eexist(
        lambda: _write_new(dangling, b"through the link"),
        "O_CREAT|O_EXCL|O_NOFOLLOW on a dangling symlink",
    )
    if os.path.lexists(os.path.join(a, "nf-absent")):
        raise _CheckFailed("O_CREAT|O_EXCL created the file a dangling symlink points to")
    detail = (
        "open(symlink, O_NOFOLLOW) fails with ELOOP"
        + (" through path and peer" if ctx.b is not None else "")
        + "; O_CREAT|O_EXCL on a dangling symlink fails with EEXIST"
    )
    return "ok", detail


def _try_flock(fd: int) -> bool:
    """True if the exclusive lock was granted, False if it is held elsewhere."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _check_flock(ctx: _Context) -> tuple[Verdict, str]:
    lock_a = os.path.join(ctx.a, "flock")
    _write_new(lock_a, b"")
    fds: list[int] = []
    try:
        fds.append(os.open(lock_a, os.O_RDWR | _O_NOFOLLOW | _O_CLOEXEC))
        try:
            if not _try_flock(fds[0]):
                return "warn", "the first flock on a fresh file was refused"
        except OSError as exc:
            return "warn", f"flock does not work here ({_describe(exc)}); castore does not need it"
        fds.append(os.open(lock_a, os.O_RDWR | _O_NOFOLLOW | _O_CLOEXEC))
        same_path = not _try_flock(fds[1])
        across: bool | None = None
        if ctx.b is not None:
            fds.append(os.open(os.path.join(ctx.b, "flock"), os.O_RDWR | _O_NOFOLLOW | _O_CLOEXEC))
            across = not _try_flock(fds[2])
    finally:
        for fd in fds:
            os.close(fd)
    parts = [
        "a second open file description through path "
        + ("is refused" if same_path else "also gets the lock")
    ]
    if across is not None:
        parts.append("through peer " + ("it is refused" if across else "it also gets the lock"))
    elif ctx.peer_given:
        parts.append("peer part not run")
    detail = "; ".join(parts)
    if same_path and across is not False:
        return "ok", f"flock is exclusive: {detail}"
    return "warn", (
        f"flock is not coherent here: {detail}; castore uses flock only to queue local "
        "contenders, never for correctness"
    )


_RACER = r"""
import os, sys
directory, me, op = sys.argv[1], sys.argv[2], sys.argv[3]
flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
out = sys.stdout.buffer

def write_new(path, data):
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)

for line in sys.stdin.buffer:
    words = line.split()
    if len(words) != 2:
        break
    verb, name = words[0].decode(), words[1].decode()
    target = os.path.join(directory, name)
    temp = os.path.join(directory, f"tmp-{me}-{name}")
    content = f"{me}:{name}".encode()
    try:
        if verb == "prep":
            if op == "link":
                write_new(temp, content)
            answer = b"ready"
        elif op == "link":
            try:
                os.link(temp, target)
            finally:
                os.unlink(temp)
            answer = b"won"
        else:
            write_new(target, content)
            answer = b"won"
    except FileExistsError:
        answer = b"lost"
    except OSError as exc:
        answer = b"error %d" % (exc.errno or 0)
    out.write(answer + b"\n")
    out.flush()
"""

_RACE_OPS = {"create": "O_CREAT|O_EXCL", "link": "link()"}


def _race(ctx: _Context, op: str) -> tuple[Verdict, str]:
    """RACE_ROUNDS rounds of two processes, one per side, making the same new name at once."""
    a, what = ctx.a, _RACE_OPS[op]
    other, other_label = (ctx.b, "peer") if ctx.b is not None else (a, "path-2")
    labels = ["path", other_label]
    racers = [_spawn(_RACER, a, "path", op), _spawn(_RACER, other, other_label, op)]
    wins = [0, 0]
    loser_errors: dict[str, int] = {}
    problems: list[str] = []
    try:
        for rnd in range(RACE_ROUNDS):
            name = f"race-{rnd}"
            for verb in ("prep", "go"):  # prep writes the temp files; go makes the name
                for proc in racers:
                    _send(proc, f"{verb} {name}")
                answers = [_read_line(proc).decode() for proc in racers]
                if verb == "prep" and answers != ["ready", "ready"]:
                    problems.append(f"round {rnd}: preparing failed: {_answers(answers)}")
                    break
            else:
                problem = _judge_round(
                    a, name, labels, answers, wins=wins, loser_errors=loser_errors
                )
                if problem:
                    problems.append(f"round {rnd}: {problem}")
    finally:
        for proc in racers:
            _stop(proc)
    who = "path and peer" if ctx.b is not None else "two processes through path"
    if problems:
        shown = "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")
        return "fail", (
            f"{len(problems)} of {RACE_ROUNDS} {what} races between {who} did not have exactly "
            f"one winner: {shown}"
        )
    detail = (
        f"{RACE_ROUNDS}/{RACE_ROUNDS} {what} races between {who} had exactly one winner, whose "
        f"content is intact (first racer won {wins[0]}, second {wins[1]})"
    )
    if ctx.peer_given and ctx.b is None:
        detail += ctx.peer_note
    odd = {k: v for k, v in loser_errors.items() if k != "EEXIST"}
    if not odd:
        return "ok", detail + "; every loser got EEXIST"
    seen = ", ".join(f"{k} {v}x" for k, v in sorted(loser_errors.items()))
    return "warn", (
        f"{detail}; but losers did not always get EEXIST ({seen}): the name was still made "
        "exactly once, so castore must treat any failed exclusive create or link as 'maybe lost' "
        "and lstat the name before calling it an error (sshfs reports SFTP's generic failure, "
        "which is what the server sends for EEXIST, as EPERM)"
    )


def _answers(answers: list[str]) -> str:
    return ", ".join(_errno_answer(x) for x in answers)


def _judge_round(
    directory: str,
    name: str,
    labels: list[str],
    answers: list[str],
    *,
    wins: list[int],
    loser_errors: dict[str, int],
) -> str | None:
    """What was wrong with one round, or None; counts wins and the losers' errors."""
    winners = [i for i, ans in enumerate(answers) if ans == "won"]
    if len(winners) != 1:
        return f"{len(winners)} winners ({_answers(answers)})"
    winner = winners[0]
    try:
        content = _read(os.path.join(directory, name))
    except OSError as exc:
        return f"the winner's file cannot be read: {_describe(exc)}"
    if content != f"{labels[winner]}:{name}".encode():
        return f"the file holds {content[:40]!r}, not the winner's content"
    wins[winner] += 1
    loser = answers[1 - winner]
    key = "EEXIST" if loser == "lost" else _errno_answer(loser).split()[0]
    loser_errors[key] = loser_errors.get(key, 0) + 1
    return None


def _check_create_race(ctx: _Context) -> tuple[Verdict, str]:
    return _race(ctx, "create")


def _check_link_race(ctx: _Context) -> tuple[Verdict, str]:
    return _race(ctx, "link")


def _check_unlink_visible(ctx: _Context) -> tuple[Verdict, str]:
    a = ctx.a
    other, label = (ctx.b, "peer") if ctx.b is not None else (a, "path")
    name = os.path.join(a, "unlink-me")
    _write_new(name, b"doomed")
    os.unlink(name)
    again = os.path.join(other, "unlink-me")

    def recreate() -> bool:
        try:
            _write_new(again, b"again")
        except FileExistsError:
            return False
        return True

    took = _wait_for(recreate)
    if took is None:
        return "warn", (
            f"{VISIBILITY_TIMEOUT:g}s after an unlink through path, O_CREAT|O_EXCL through "
            f"{label} still says EEXIST"
        )
    return "ok", (
        f"after an unlink through path, O_CREAT|O_EXCL through {label} can reuse the name "
        f"(after {_ms(took)})"
    )


# --- helper processes ---------------------------------------------------------------------------


def _spawn(script: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 -- our own interpreter running our own script
        [sys.executable, "-I", "-S", "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def _send(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None  # noqa: S101 -- spawned with stdin=PIPE
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


def _read_line(proc: subprocess.Popen[bytes], timeout: float = WORKER_TIMEOUT) -> bytes:
    """One line from a helper's stdout, without blocking past `timeout`."""
    assert proc.stdout is not None  # noqa: S101 -- spawned with stdout=PIPE
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise _CheckFailed(f"a helper process did not answer within {timeout:g}s")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise _CheckFailed(f"a helper process exited early (status {proc.wait()})")
        buf += chunk
    return buf.strip()


def _expect_line(proc: subprocess.Popen[bytes], expected: bytes) -> None:
    line = _read_line(proc)
    if line != expected:
        raise _CheckFailed(f"a helper process said {line!r} instead of {expected!r}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _errno_answer(answer: str) -> str:
    parts = answer.split()
    if len(parts) == 2 and parts[0] == "error" and parts[1].isdigit():
        code = int(parts[1])
        return f"{errno.errorcode.get(code, 'errno ?')} ({os.strerror(code)})"
    return answer


# --- filesystem identification -------------------------------------------------------------------


def _mount_of(path: str) -> tuple[str, str, str] | None:
    """(fstype, source, mount point) of the mount holding `path`, from /proc/self/mountinfo."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)

    def unescape(s: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)

    best: tuple[str, str, str] | None = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        point = unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[2])):
            best = (tail[0], unescape(tail[1]), point)
    return best


def _describe_fs(label: str, path: str) -> tuple[bool, str]:
    found = _mount_of(path)
    if found is None:
        return True, f"{label}: filesystem type unknown"
    fstype, source, point = found
    text = f"{label}: {fstype} ({source} on {point})"
    if fstype in _LOCAL_FILESYSTEMS:
        return False, text
    note = _FS_NOTES.get(fstype)
    if note is None and fstype.startswith("fuse"):
        note = "FUSE: the daemon decides what fsync, links and locks mean"
    return True, f"{text}; {note or 'not a filesystem castore has been measured on'}"


def _check_filesystem(path: str, peer: str | None) -> Check:
    warn_a, text_a = _describe_fs("path", path)
    parts, warn = [text_a], warn_a
    if peer is not None:
        warn_b, text_b = _describe_fs("peer", peer)
        parts.append(text_b)
        warn = warn or warn_b
    return Check("filesystem", "warn" if warn else "ok", "; ".join(parts), required=False)


# --- driver -------------------------------------------------------------------------------------

_CHECKS: list[tuple[str, bool, Callable[[_Context], tuple[Verdict, str]]]] = [
    ("exclusive-create", True, _check_exclusive_create),
    ("link-exclusive", True, _check_link_exclusive),
    ("rename-over", True, _check_rename_over),
    ("directory-fsync", True, _check_directory_fsync),
    ("file-fsync", True, _check_file_fsync),
    ("o-nofollow", True, _check_o_nofollow),
    ("exclusive-create-race", True, _check_create_race),
    ("link-race", True, _check_link_race),
    ("flock-coherent", False, _check_flock),
    ("unlink-visible", False, _check_unlink_visible),
    ("rename-no-gap", False, _check_rename_no_gap),
]


def _subcontext(ctx: _Context, name: str) -> _Context:
    """A fresh directory of the check's own, so that checks cannot disturb each other."""
    sub = os.path.join(ctx.a, name)
    os.mkdir(sub, 0o700)
    if ctx.b is None:
        return _Context(sub, None, ctx.peer_given)
    sub_b = os.path.join(ctx.b, name)
    if _wait_for(lambda: os.path.isdir(sub_b)) is None:
        raise _CheckFailed("peer does not see the check's own directory")
    return _Context(sub, sub_b, ctx.peer_given)


def _run_one(
    name: str, required: bool, fn: Callable[[_Context], tuple[Verdict, str]], ctx: _Context
) -> Check:
    try:
        verdict, detail = fn(_subcontext(ctx, name))
    except _CheckFailed as exc:
        return Check(name, "fail", str(exc), required)
    except OSError as exc:
        return Check(name, "fail", f"unexpected error: {_describe(exc)}", required)
    except (subprocess.SubprocessError, ValueError, KeyError) as exc:
        return Check(name, "fail", f"unexpected error: {type(exc).__name__}: {exc}", required)
    return Check(name, verdict, detail, required)


def _check_peer(scratch: str, peer_scratch: str) -> Check:
    name = "peer-same-directory"
    took = _wait_for(lambda: os.path.isdir(peer_scratch))
    if took is None:
        return Check(
            name,
            "fail",
            (
                f"{peer_scratch} does not exist {VISIBILITY_TIMEOUT:g}s after {scratch} was "
                "created: peer is not a second view of the same directory as path (check the mount "
                "source and sub-path), so nothing about cross-client behaviour could be tested"
            ),
            True,
        )
    token = secrets.token_hex(16).encode()
    try:
        _write_new(os.path.join(scratch, "peer-marker"), token, sync=True)
        took2 = _wait_for(_reads(os.path.join(peer_scratch, "peer-marker"), token))
    except OSError as exc:
        return Check(name, "fail", f"could not compare through peer: {_describe(exc)}", True)
    if took2 is None:
        return Check(
            name,
            "fail",
            (
                f"peer sees a directory named like the scratch directory, but not the file written "
                f"into it through path within {VISIBILITY_TIMEOUT:g}s"
            ),
            True,
        )
    st_a, st_b = os.stat(scratch), os.stat(peer_scratch)
    if (st_a.st_dev, st_a.st_ino) == (st_b.st_dev, st_b.st_ino):
        return Check(
            name,
            "warn",
            (
                "peer is the same mount as path (same device and inode), so the cross-client "
                "checks exercise only one client; pass a second mount of the directory as peer"
            ),
            True,
        )
    return Check(
        name,
        "ok",
        (
            f"peer sees the scratch directory (after {_ms(took)}) and a file written through path "
            f"(after {_ms(took2)})"
        ),
        True,
    )


def _scratch_name() -> str:
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:64] or "host"
    return f".castore-doctor-{host}-{os.getpid()}-{secrets.token_hex(4)}"


def _remove(scratch: str) -> str | None:
    """Remove the scratch tree; an error description if that keeps failing."""
    last: OSError | None = None
    for _ in range(5):
        try:
            shutil.rmtree(scratch)
        except FileNotFoundError:
            return None
        except OSError as exc:  # e.g. NFS silly-renamed files still being released
            last = exc
            time.sleep(0.2)
        else:
            return None
    return _describe(last) if last is not None else None


def run_doctor(
    path: str | os.PathLike[str], peer: str | os.PathLike[str] | None = None
) -> DoctorReport:
    """Probe the filesystem holding `path` for the primitives castore's safety rests on.

    `peer`, if given, is a second view of the same directory (another NFS or sshfs client's
    mount): cross-client behaviour is then tested too. Works in a fresh scratch directory that
    is always removed again; never raises for a filesystem problem, only reports it.
    """
    where = os.fspath(path)
    if not os.path.isdir(where):
        raise UsageError(
            f"{where} is not a directory; point the doctor at the directory that holds (or will "
            "hold) the store"
        )
    other = None if peer is None else os.fspath(peer)
    if other is not None and not os.path.isdir(other):
        raise UsageError(
            f"peer {other} is not a directory; pass the same directory as seen through a second "
            "mount (another client), or no peer"
        )
    checks = [_check_filesystem(where, other)]
    name = _scratch_name()
    scratch = os.path.join(where, name)
    try:
        os.mkdir(scratch, 0o700)
    except OSError as exc:
        checks.append(
            Check(
                "scratch-directory",
                "fail",
                (
                    f"cannot create a scratch directory in {where}: {_describe(exc)}; castore "
                    "needs to create files and directories there"
                ),
                True,
            )
        )
        checks.extend(Check(n, "skip", "not run: no scratch directory", r) for n, r, _ in _CHECKS)
        return DoctorReport(where, other, checks)
    try:
        checks.append(Check("scratch-directory", "ok", f"created {name} in {where}", True))
        scratch_b = None
        if other is not None:
            peer_check = _check_peer(scratch, os.path.join(other, name))
            checks.append(peer_check)
            if peer_check.verdict != "fail":
                scratch_b = os.path.join(other, name)
        ctx = _Context(scratch, scratch_b, other is not None)
        checks.extend(_run_one(n, required, fn, ctx) for n, required, fn in _CHECKS)
    finally:
        problem = _remove(scratch)
    if problem is not None:
        checks.append(
            Check(
                "cleanup",
                "warn",
                (f"could not remove {scratch}: {problem}; remove it by hand"),
                False,
            )
        )
    return DoctorReport(where, other, checks)
