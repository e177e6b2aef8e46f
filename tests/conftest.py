"""Shared fixtures: `sshfs_pair`, two sshfs clients of one export (see tests/sshfs.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sshfs import SshfsPair, SshfsUnavailable, mount_sshfs_pair


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def sshfs_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshfsPair]:
    """sshd on 127.0.0.1 plus two sshfs mounts of one export, shared by the whole session.

    Skips when the host has no FUSE, sshfs or sshd, except under CI (CI=true), where that is
    a failure: CI installs them (.ci/install-sshfs.sh) and must not skip these tests silently.
    Use `sshfs_pair.new_dir(prefix)` for a fresh directory per test.
    """
    reason = ""
    try:
        with mount_sshfs_pair(tmp_path_factory.mktemp("sshfs")) as pair:
            yield pair
    except SshfsUnavailable as exc:  # raised while mounting, never by a test
        reason = str(exc)
    if reason and _in_ci():
        pytest.fail(f"sshfs tests must run in CI (CI is set), but: {reason}", pytrace=False)
    if reason:
        pytest.skip(f"sshfs unavailable: {reason}")
