"""Which filesystem holds a path (from /proc/self/mountinfo), and what is known about it."""

from __future__ import annotations

import os
import re

from castore.doctor.report import Check

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


def check_filesystem(path: str, peer: str | None) -> Check:
    warn_a, text_a = _describe_fs("path", path)
    parts, warn = [text_a], warn_a
    if peer is not None:
        warn_b, text_b = _describe_fs("peer", peer)
        parts.append(text_b)
        warn = warn or warn_b
    return Check("filesystem", "warn" if warn else "ok", "; ".join(parts), required=False)
