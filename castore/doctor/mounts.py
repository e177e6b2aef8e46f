"""Which filesystem holds a path (from /proc/self/mountinfo), and what is known about it."""

from __future__ import annotations

from castore.doctor.report import Check
from castore.medium.mountinfo import LOCAL_FILESYSTEMS as _LOCAL_FILESYSTEMS
from castore.medium.mountinfo import mount_of as _mount_of

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
