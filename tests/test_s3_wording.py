"""Errors of a store on S3 speak of keys, requests and the endpoint, not of fsync, temp files
or directories (issue 40, item 4): a commit whose every PUT failed, and an init where the
prefix already holds keys, on each engine (moto, RGW); and their POSIX wording is unchanged."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3proxy import Fault, FaultProxy
from s3servers import S3Endpoint

import castore
from castore.errors import CommitUncertainError, DurabilityError, StoreExistsError
from castore.medium import s3client

POSIX_WORDS = ("fsync", "temp file", "directory", "owner, group, mode")
PLAN = castore.Plan.build("wording", "a", "b")


@pytest.fixture
def proxy(s3: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(s3.url) as running:
        yield running


def test_a_commit_no_put_reached_says_what_s3_did(
    s3: S3Endpoint, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every PUT of the slot answered 500: the key was read back and is absent. The error says
    so, and that a retry creates it at most once; no fsync, no temp file."""
    monkeypatch.setattr(s3client, "ATTEMPTS", 3)
    url = s3.new_bucket()
    castore.Store.init(url).start("t", PLAN, lock_timeout=None).close()
    store = castore.Store.open(url, **s3.options(proxy.url))
    proxy.arm(Fault("status", path=r"/chain/0000000000000001$", times=3, status=500))
    with store.resume("t", PLAN, lock_timeout=None) as run:
        with pytest.raises(DurabilityError) as failed:
            run.commit_step("a", 1)
        run.commit_step("a", 1)  # the fault is over
    message = str(failed.value)
    assert not isinstance(failed.value, CommitUncertainError)
    assert f"creating (S3 PUT If-None-Match) failed for {url}/tasks/t/chain/" in message
    assert "the S3 endpoint answered 500" in message  # the endpoint's words, not the errno's
    assert "read back and is absent" in message
    assert "conditional PUT creates it at most once" in message
    assert [] == [word for word in POSIX_WORDS if word in message]


def test_init_where_the_prefix_holds_keys_says_keys(s3: S3Endpoint) -> None:
    """A prefix with a key in it is not a new store's place: said as keys of a prefix."""
    url = s3.new_bucket()
    castore.Store.init(url)
    with pytest.raises(StoreExistsError) as exists:
        castore.Store.init(url)
    message = str(exists.value)
    assert "its prefix holds keys already" in message
    assert "directory" not in message


def test_the_same_errors_on_a_directory_keep_their_words(tmp_path: Path) -> None:
    """On POSIX the advice is still the file system's (fsync, temp file, directory)."""
    failed = DurabilityError(
        str(tmp_path / "x"), "writing and syncing a temp file", OSError(errno.EIO, "I/O")
    )
    assert "never retry an fsync" in str(failed)
    castore.Store.init(tmp_path / "s")
    with pytest.raises(StoreExistsError, match="is not an empty directory"):
        castore.Store.init(tmp_path / "s")
