"""Probes of open files: fsync of files and directories, O_NOFOLLOW, and flock."""

from __future__ import annotations

import errno
import fcntl
import os

from castore.doctor.primitives import (
    O_CLOEXEC,
    O_NOFOLLOW,
    READ_FLAGS,
    CheckFailed,
    Context,
    describe,
    expect_eexist,
    write_new,
)
from castore.doctor.report import Verdict


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_directory_fsync(ctx: Context) -> tuple[Verdict, str]:
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


def check_file_fsync(ctx: Context) -> tuple[Verdict, str]:
    write_new(os.path.join(ctx.a, "fsync-a"), b"x" * 4096, sync=True)
    detail = "fsync of a freshly written regular file works"
    if ctx.b is not None:
        write_new(os.path.join(ctx.b, "fsync-b"), b"y" * 4096, sync=True)
        detail += " through path and peer"
    return "ok", detail


def check_o_nofollow(ctx: Context) -> tuple[Verdict, str]:
    a = ctx.a
    write_new(os.path.join(a, "nf-target"), b"target")
    link = os.path.join(a, "nf-link")
    try:
        os.symlink("nf-target", link)
    except OSError as exc:
        return "skip", (
            f"cannot create symlinks here ({describe(exc)}), so none can be planted either"
        )
    sides = [("path", a)] + ([("peer", ctx.b)] if ctx.b is not None else [])
    for label, directory in sides:
        try:
            fd = os.open(os.path.join(directory, "nf-link"), READ_FLAGS)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise CheckFailed(
                    f"open(symlink, O_NOFOLLOW) through {label} failed with {describe(exc)} "
                    "instead of ELOOP"
                ) from exc
        else:
            os.close(fd)
            raise CheckFailed(f"open(symlink, O_NOFOLLOW) through {label} followed the link")
    dangling = os.path.join(a, "nf-dangling")
    os.symlink("nf-absent", dangling)
    expect_eexist(
        lambda: write_new(dangling, b"through the link"),
        "O_CREAT|O_EXCL|O_NOFOLLOW on a dangling symlink",
    )
    if os.path.lexists(os.path.join(a, "nf-absent")):
        raise CheckFailed("O_CREAT|O_EXCL created the file a dangling symlink points to")
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


def check_flock(ctx: Context) -> tuple[Verdict, str]:
    lock_a = os.path.join(ctx.a, "flock")
    write_new(lock_a, b"")
    fds: list[int] = []
    try:
        fds.append(os.open(lock_a, os.O_RDWR | O_NOFOLLOW | O_CLOEXEC))
        try:
            if not _try_flock(fds[0]):
                return "warn", "the first flock on a fresh file was refused"
        except OSError as exc:
            return "warn", f"flock does not work here ({describe(exc)}); castore does not need it"
        fds.append(os.open(lock_a, os.O_RDWR | O_NOFOLLOW | O_CLOEXEC))
        same_path = not _try_flock(fds[1])
        across: bool | None = None
        if ctx.b is not None:
            fds.append(os.open(os.path.join(ctx.b, "flock"), os.O_RDWR | O_NOFOLLOW | O_CLOEXEC))
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
