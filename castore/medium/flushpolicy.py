"""Whether one syncfs may stand for many concurrent commits' flushes on a store's filesystem."""

from __future__ import annotations

import os
import re

from castore.errors import UsageError
from castore.format.model import attrs
from castore.medium import fsio, mountinfo

ENV = "CASTORE_FLUSH"
"""Environment variable: unset, empty, "auto" or "fsync": every commit flushes its own files
(the filesystem's journal groups concurrent fsyncs); "syncfs": concurrent commits share one
syncfs where the filesystem allows it (FORMAT.md 9.8). Measured on this project's ext4 the
journal groups as well as shared rounds do, and a syncfs also waits for every other program's
dirty data on the filesystem: sharing is the user's choice, not the default."""

MODES = ("auto", "fsync", "syncfs")

MIN_KERNEL = (5, 8)
"""Before Linux 5.8 syncfs returned 0 even when writing a file back failed (no per-superblock
write-back error tracking), so a shared flush could report a lost commit as durable."""

# Kernel filesystems whose syncfs writes back every dirty inode and then flushes the device,
# as fsync does for one file: one call covers every commit in flight.
_SYNCFS_COVERS = frozenset({"ext4", "xfs", "btrfs"})
# Nothing here survives a reboot anyway: sharing cannot lose what fsync would have kept.
_IN_MEMORY = frozenset({"tmpfs", "ramfs"})
# Clients of a server: what syncfs sends to the server (if anything) is the client's choice.
_NETWORK = frozenset({"nfs", "nfs4", "ceph", "cifs", "smb3", "9p", "afs", "lustre", "gfs2"})


@attrs.frozen
class FlushPolicy:
    """How commits on one filesystem are made durable, and why, in one sentence."""

    shared: bool
    """True: one syncfs of the filesystem may stand for the flushes of many concurrent commits.
    False: every commit fsyncs its own file and directory."""
    fstype: str | None
    """The filesystem type from /proc/self/mountinfo, None when it is unknown."""
    reason: str
    """One sentence for a user (doctor, status): the filesystem and what follows from it."""


def decide(root: str) -> FlushPolicy:
    """The flush policy for a store at `root`; UsageError for an unknown CASTORE_FLUSH."""
    mode = _mode()
    found = mountinfo.mount_of(root)
    fstype = None if found is None else found[0]
    if mode == "fsync":
        return FlushPolicy(False, fstype, f"{ENV}=fsync: every commit flushes its own files")
    if fstype is None:
        return FlushPolicy(
            False,
            None,
            f"the filesystem holding {root} is unknown (not in /proc/self/mountinfo), {_FOLLOWS}",
        )
    refused = _not_shared(fstype)
    if refused is not None:
        return FlushPolicy(False, fstype, refused)
    if mode != "syncfs":
        return FlushPolicy(
            False,
            fstype,
            f"{fstype}: every commit flushes its own files and the filesystem's journal groups "
            f"concurrent commits' fsyncs ({ENV}=syncfs would let them share one syncfs)",
        )
    if fstype in _IN_MEMORY:
        return FlushPolicy(
            True,
            fstype,
            f"{fstype} lives in memory (nothing survives a reboot): concurrent commits share "
            "one syncfs, which costs nothing here",
        )
    return FlushPolicy(
        True, fstype, f"{fstype} on a local disk: concurrent commits share one syncfs"
    )


def _mode() -> str:
    value = os.environ.get(ENV, "")
    if value in ("", *MODES):
        return value or "auto"
    raise UsageError(
        f"{ENV}={value!r} is not a flush mode: unset it, or set it to 'auto' or 'fsync' (every "
        "commit flushes its own files) or 'syncfs' (concurrent commits share one syncfs where "
        "the filesystem allows it)"
    )


_FOLLOWS = "so every commit flushes its own files"


def _not_shared(fstype: str) -> str | None:
    """Why commits on `fstype` here must flush one by one, or None if they may share."""
    return _filesystem_refuses(fstype) or _host_refuses(fstype)


def _filesystem_refuses(fstype: str) -> str | None:
    if fstype.startswith("fuse") or fstype == "virtiofs":
        return f"{fstype}: a FUSE server may ignore syncfs, {_FOLLOWS}"
    if fstype in _NETWORK:
        return f"{fstype}: a network client's syncfs need not reach the server, {_FOLLOWS}"
    if fstype not in _SYNCFS_COVERS and fstype not in _IN_MEMORY:
        return f"{fstype}: castore has not checked what syncfs does on it, {_FOLLOWS}"
    return None


def _host_refuses(fstype: str) -> str | None:
    release = os.uname().release
    version = kernel_version(release)
    if version is None:
        return f"{fstype} on kernel {release!r}, a version castore cannot read, {_FOLLOWS}"
    if version < MIN_KERNEL:
        return (
            f"{fstype} on Linux {release}: syncfs reports write-back errors only from Linux "
            f"5.8 on, {_FOLLOWS}"
        )
    if not fsio.syncfs_available():
        return f"{fstype}: this C library has no syncfs, {_FOLLOWS}"
    return None


def kernel_version(release: str) -> tuple[int, int] | None:
    """(major, minor) of a kernel release string such as '6.1.0-18-amd64' or '5.8.0+', None
    when it does not start with two numbers."""
    matched = re.match(r"(\d+)\.(\d+)", release)
    if matched is None:
        return None
    return int(matched.group(1)), int(matched.group(2))
