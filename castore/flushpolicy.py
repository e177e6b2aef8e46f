"""Placeholder: the doctor helper writes the real module (decide)."""

from __future__ import annotations

import os

import attrs

from castore import fsio
from castore.mountinfo import mount_of

_SHARED = frozenset({"ext4", "xfs", "btrfs", "tmpfs", "ramfs"})


@attrs.frozen
class FlushPolicy:
    shared: bool
    fstype: str | None
    reason: str


def decide(root: str) -> FlushPolicy:
    found = mount_of(root)
    fstype = None if found is None else found[0]
    shared = (
        fstype in _SHARED
        and fsio.syncfs_available()
        and os.environ.get("CASTORE_FLUSH", "auto") != "fsync"
    )
    return FlushPolicy(shared, fstype, f"{fstype}: shared={shared}")
