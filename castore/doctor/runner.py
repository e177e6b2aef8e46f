"""run_doctor: a scratch directory, the peer check, then every probe in its own subdirectory."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable

from castore.doctor import settings
from castore.doctor.files import (
    check_directory_fsync,
    check_file_fsync,
    check_flock,
    check_o_nofollow,
)
from castore.doctor.flush import check_flush_path
from castore.doctor.mounts import check_filesystem
from castore.doctor.names import (
    check_exclusive_create,
    check_link_exclusive,
    check_rename_over,
    check_unlink_visible,
)
from castore.doctor.primitives import (
    CheckFailed,
    Context,
    describe,
    ms,
    reads,
    wait_for,
    write_new,
)
from castore.doctor.races import check_create_race, check_link_race, check_rename_no_gap
from castore.doctor.report import Check, DoctorReport, Verdict
from castore.errors import UsageError

_CHECKS: list[tuple[str, bool, Callable[[Context], tuple[Verdict, str]]]] = [
    ("exclusive-create", True, check_exclusive_create),
    ("link-exclusive", True, check_link_exclusive),
    ("rename-over", True, check_rename_over),
    ("directory-fsync", True, check_directory_fsync),
    ("file-fsync", True, check_file_fsync),
    ("o-nofollow", True, check_o_nofollow),
    ("exclusive-create-race", True, check_create_race),
    ("link-race", True, check_link_race),
    ("flock-coherent", False, check_flock),
    ("unlink-visible", False, check_unlink_visible),
    ("rename-no-gap", False, check_rename_no_gap),
    ("flush-path", False, check_flush_path),
]


def _subcontext(ctx: Context, name: str) -> Context:
    """A fresh directory of the check's own, so that checks cannot disturb each other."""
    sub = os.path.join(ctx.a, name)
    os.mkdir(sub, 0o700)
    if ctx.b is None:
        return Context(sub, None, ctx.peer_given)
    sub_b = os.path.join(ctx.b, name)
    if wait_for(lambda: os.path.isdir(sub_b)) is None:
        raise CheckFailed("peer does not see the check's own directory")
    return Context(sub, sub_b, ctx.peer_given)


def _run_one(
    name: str, required: bool, fn: Callable[[Context], tuple[Verdict, str]], ctx: Context
) -> Check:
    try:
        verdict, detail = fn(_subcontext(ctx, name))
    except CheckFailed as exc:
        return Check(name, "fail", str(exc), required)
    except OSError as exc:
        return Check(name, "fail", f"unexpected error: {describe(exc)}", required)
    except (subprocess.SubprocessError, ValueError, KeyError) as exc:
        return Check(name, "fail", f"unexpected error: {type(exc).__name__}: {exc}", required)
    return Check(name, verdict, detail, required)


def _check_peer(scratch: str, peer_scratch: str) -> Check:
    name = "peer-same-directory"
    took = wait_for(lambda: os.path.isdir(peer_scratch))
    if took is None:
        return Check(
            name,
            "fail",
            (
                f"{peer_scratch} does not exist {settings.VISIBILITY_TIMEOUT:g}s after {scratch} "
                "was created: peer is not a second view of the same directory as path (check the "
                "mount source and sub-path), so nothing about cross-client behaviour could be "
                "tested"
            ),
            True,
        )
    token = secrets.token_hex(16).encode()
    try:
        write_new(os.path.join(scratch, "peer-marker"), token, sync=True)
        took2 = wait_for(reads(os.path.join(peer_scratch, "peer-marker"), token))
    except OSError as exc:
        return Check(name, "fail", f"could not compare through peer: {describe(exc)}", True)
    if took2 is None:
        return Check(
            name,
            "fail",
            (
                f"peer sees a directory named like the scratch directory, but not the file written "
                f"into it through path within {settings.VISIBILITY_TIMEOUT:g}s"
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
            f"peer sees the scratch directory (after {ms(took)}) and a file written through path "
            f"(after {ms(took2)})"
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
    return describe(last) if last is not None else None


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
    checks = [check_filesystem(where, other)]
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
                    f"cannot create a scratch directory in {where}: {describe(exc)}; castore "
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
        ctx = Context(scratch, scratch_b, other is not None)
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
