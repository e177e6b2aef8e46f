"""flushpolicy.decide: which filesystems let one syncfs stand for many commits' flushes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from castore.errors import UsageError
from castore.medium import flushpolicy, fsio, mountinfo
from castore.medium.flushpolicy import FlushPolicy, decide, kernel_version


def _uname(release: str) -> os.uname_result:
    return os.uname_result(("Linux", "host", release, "#1 SMP", "x86_64"))


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A Linux 6.1 host whose libc has syncfs, CASTORE_FLUSH unset, the store on ext4."""
    monkeypatch.setenv(flushpolicy.ENV, "syncfs")
    monkeypatch.setattr(os, "uname", lambda: _uname("6.1.0-18-amd64"))
    monkeypatch.setattr(fsio, "syncfs_available", lambda: True)
    on("ext4", monkeypatch)
    return monkeypatch


def on(fstype: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    found = None if fstype is None else (fstype, "/dev/x", "/")
    monkeypatch.setattr(mountinfo, "mount_of", lambda path: found)


@pytest.mark.parametrize("fstype", ["ext4", "xfs", "btrfs"])
def test_local_disk_filesystems_share_one_syncfs(fstype: str, machine: pytest.MonkeyPatch) -> None:
    """ext4, xfs and btrfs on a 5.8+ kernel with libc syncfs: commits share one syncfs."""
    on(fstype, machine)
    expected = FlushPolicy(
        True, fstype, f"{fstype} on a local disk: concurrent commits share one syncfs"
    )
    assert expected == decide("/store")


@pytest.mark.parametrize("fstype", ["tmpfs", "ramfs"])
def test_in_memory_filesystems_share_and_say_nothing_survives(
    fstype: str, machine: pytest.MonkeyPatch
) -> None:
    """tmpfs and ramfs share (nothing is durable there anyway), and the reason says so."""
    on(fstype, machine)
    policy = decide("/store")
    assert (True, fstype) == (policy.shared, policy.fstype)
    assert "nothing survives a reboot" in policy.reason


@pytest.mark.parametrize(
    ("fstype", "why"),
    [
        ("fuse.sshfs", "a FUSE server may ignore syncfs"),
        ("fuse.glusterfs", "a FUSE server may ignore syncfs"),
        ("fuse.ceph-fuse", "a FUSE server may ignore syncfs"),
        ("fuse", "a FUSE server may ignore syncfs"),
        ("virtiofs", "a FUSE server may ignore syncfs"),
        ("nfs4", "a network client's syncfs need not reach the server"),
        ("ceph", "a network client's syncfs need not reach the server"),
        ("cifs", "a network client's syncfs need not reach the server"),
        ("overlay", "castore has not checked what syncfs does on it"),
        ("zfs", "castore has not checked what syncfs does on it"),
    ],
)
def test_fuse_network_and_unchecked_filesystems_flush_file_by_file(
    fstype: str, why: str, machine: pytest.MonkeyPatch
) -> None:
    """FUSE, network and unchecked filesystems never share, whatever kernel and libc."""
    on(fstype, machine)
    expected = FlushPolicy(False, fstype, f"{fstype}: {why}, so every commit flushes its own files")
    assert expected == decide("/store")


def test_unknown_filesystem_flushes_file_by_file(machine: pytest.MonkeyPatch) -> None:
    """A path in no mount of /proc/self/mountinfo (or no /proc at all) is not shared."""
    on(None, machine)
    policy = decide("/somewhere")
    assert (False, None) == (policy.shared, policy.fstype)
    assert "/somewhere is unknown" in policy.reason


@pytest.mark.parametrize(
    ("release", "shared"),
    [
        ("5.7.19-generic", False),
        ("4.19.0+", False),
        ("5.8.0", True),
        ("5.10", True),
        ("6.18.44-fc-v857", True),
        ("10.0.0-rc1", True),
    ],
)
def test_kernels_before_5_8_do_not_share(
    release: str, shared: bool, machine: pytest.MonkeyPatch
) -> None:
    """syncfs reports write-back errors from Linux 5.8 on: older kernels flush file by file."""
    machine.setattr(os, "uname", lambda: _uname(release))
    policy = decide("/store")
    assert shared == policy.shared
    if not shared:
        assert f"ext4 on Linux {release}: syncfs reports write-back errors only" in policy.reason


def test_kernel_release_that_cannot_be_read_does_not_share(machine: pytest.MonkeyPatch) -> None:
    """A release string without a leading major.minor is not guessed at."""
    machine.setattr(os, "uname", lambda: _uname("custom-kernel"))
    policy = decide("/store")
    assert False is policy.shared
    assert "'custom-kernel', a version castore cannot read" in policy.reason


@pytest.mark.parametrize(
    ("release", "expected"),
    [("6.1.0-18-amd64", (6, 1)), ("5.8", (5, 8)), ("5.15.0+", (5, 15)), ("v6.1", None), ("", None)],
)
def test_kernel_version_reads_major_and_minor(
    release: str, expected: tuple[int, int] | None
) -> None:
    """kernel_version takes the leading major.minor and ignores any suffix."""
    assert expected == kernel_version(release)


def test_libc_without_syncfs_does_not_share(machine: pytest.MonkeyPatch) -> None:
    """No syncfs in the C library: every commit flushes its own files."""
    machine.setattr(fsio, "syncfs_available", lambda: False)
    expected = FlushPolicy(
        False, "ext4", "ext4: this C library has no syncfs, so every commit flushes its own files"
    )
    assert expected == decide("/store")


@pytest.mark.parametrize("value", ["", "auto"])
def test_castore_flush_auto_or_empty_flushes_file_by_file(
    value: str, machine: pytest.MonkeyPatch
) -> None:
    """CASTORE_FLUSH empty or 'auto' (the default): no shared syncfs even where it would be
    allowed; the reason says the journal groups concurrent fsyncs, and how to opt in."""
    machine.setenv(flushpolicy.ENV, value)
    policy = decide("/store")
    assert (False, "ext4") == (policy.shared, policy.fstype)
    assert "journal groups concurrent commits' fsyncs" in policy.reason
    assert "CASTORE_FLUSH=syncfs" in policy.reason


def test_castore_flush_fsync_never_shares(machine: pytest.MonkeyPatch) -> None:
    """CASTORE_FLUSH=fsync turns sharing off even where it would be allowed."""
    machine.setenv(flushpolicy.ENV, "fsync")
    expected = FlushPolicy(False, "ext4", "CASTORE_FLUSH=fsync: every commit flushes its own files")
    assert expected == decide("/store")


@pytest.mark.parametrize("value", ["SYNCFS", "FSYNC", "fsync "])
@pytest.mark.parametrize("fstype", ["ext4", "fuse.sshfs"])
def test_unknown_castore_flush_is_a_usage_error(
    value: str, fstype: str, machine: pytest.MonkeyPatch
) -> None:
    """Any other CASTORE_FLUSH is refused on every filesystem, naming the allowed values."""
    on(fstype, machine)
    machine.setenv(flushpolicy.ENV, value)
    with pytest.raises(UsageError) as raised:
        decide("/store")
    message = str(raised.value)
    assert f"CASTORE_FLUSH={value!r} is not a flush mode" in message
    assert "'auto'" in message
    assert "'fsync'" in message
    assert "'syncfs'" in message


def test_decide_names_the_real_filesystem_of_a_directory(tmp_path: Path) -> None:
    """Unpatched, decide reports the type mount_of finds for the directory."""
    found = mountinfo.mount_of(str(tmp_path))
    assert (None if found is None else found[0]) == decide(str(tmp_path)).fstype


def test_syncfs_of_a_directory_succeeds(tmp_path: Path) -> None:
    """fsio.syncfs on a directory's descriptor returns without error where libc has syncfs."""
    if not fsio.syncfs_available():
        pytest.skip("this C library has no syncfs")
    (tmp_path / "dirty").write_bytes(b"x" * 4096)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsio.syncfs(fd)
    finally:
        os.close(fd)


def test_syncfs_failure_raises_oserror_with_its_errno() -> None:
    """syncfs(-1) fails with EBADF, raised as OSError carrying that errno."""
    if not fsio.syncfs_available():
        pytest.skip("this C library has no syncfs")
    with pytest.raises(OSError, match="Bad file descriptor") as raised:
        fsio.syncfs(-1)
    assert errno.EBADF == raised.value.errno


def test_syncfs_without_libc_support_raises_enosys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where libc lacks syncfs, syncfs_available says so and syncfs raises ENOSYS."""
    monkeypatch.setattr(fsio, "_libc_syncfs", lambda: None)
    assert False is fsio.syncfs_available()
    with pytest.raises(OSError, match="no syncfs") as raised:
        fsio.syncfs(0)
    assert errno.ENOSYS == raised.value.errno
