"""Which filesystem holds a path (from /proc/self/mountinfo), and whether its names can lie."""

from __future__ import annotations

import os
import re

# Kernel filesystems of this host: a lookup is the truth, no other client caches a name.
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs"})
_IN_MEMORY = frozenset({"tmpfs", "ramfs", "overlay"})


def mount_of(path: str) -> tuple[str, str, str] | None:
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


def names_are_coherent(path: str) -> bool:
    """True when a lookup under `path` always answers what the directory holds now: a local
    kernel filesystem. False for FUSE and network filesystems (and when unknown), whose client
    may keep a name another client removed for a while (GlusterFS' default entry-timeout)."""
    found = mount_of(path)
    return found is not None and (found[0] in LOCAL_FILESYSTEMS or found[0] in _IN_MEMORY)
