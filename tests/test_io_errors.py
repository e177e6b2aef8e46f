"""Every OSError becomes one castore error naming the path and the system's reason.

In-process: a store path that is a regular file, a planted lock symlink, an OSError raised
where no castore code translates it (the library boundary, the CLI's last net), and the
messages themselves (permissions are not free space; a commit that may survive says so).
The same faults from the real system calls, under strace: tests/test_syscall_faults.py.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, flip_bit, rewrite

import castore
from castore.errors import CommitUncertainError, DurabilityError, StoreIOError
from castore.medium import fsio

PLAN = castore.Plan.build("io", "a", "b")
TASK = "io/1"


class OsWith:
    """The `os` module, with some functions replaced: set as one castore module's `os`."""

    def __init__(self, **replaced: Callable[..., Any]) -> None:
        self._replaced = replaced

    def __getattr__(self, name: str) -> Any:
        return self._replaced.get(name) or getattr(os, name)


def denied(path: str) -> list[str]:
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)


def close_then_eio(fd: int) -> None:
    os.close(fd)
    raise OSError(errno.EIO, os.strerror(errno.EIO))


def assert_one_error_line(err: str) -> None:
    """Exactly one line on stderr, starting with 'castore: error:' (never a traceback)."""
    assert 1 == len(err.splitlines()), err
    assert err.startswith("castore: error: "), err


VERBS_ON_A_STORE = [
    ["status"],
    ["log", TASK],
    ["show", "0" * 64],
    ["resolve", TASK, "a", "--not-done", "--reason", "r"],
    ["fsck"],
    ["gc"],
    ["watch"],
]


@pytest.mark.parametrize("verb", VERBS_ON_A_STORE, ids=lambda verb: verb[0])
def test_a_store_path_that_is_a_file_is_not_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: list[str]
) -> None:
    """Every verb given a regular file as its store exits 2 (not a store) with one line
    that says it is not a directory; the file is untouched."""
    path = tmp_path / "afile"
    path.write_bytes(b"not a store\n")
    code, out, err = cli(capsys, "--store", str(path), *verb)
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert "it is a file, not a directory" in err
    assert b"not a store\n" == path.read_bytes()


def test_demo_on_a_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`castore demo FILE` exits 2 with one line: a file cannot hold the demo's store."""
    path = tmp_path / "afile"
    path.write_bytes(b"x")
    code, _out, err = cli(capsys, "demo", str(path))
    assert 2 == code
    assert_one_error_line(err)


def test_library_open_of_a_file_is_store_not_found(tmp_path: Path) -> None:
    """Store.open of a regular file raises StoreNotFoundError, not NotADirectoryError."""
    path = tmp_path / "afile"
    path.write_bytes(b"x")
    with pytest.raises(castore.StoreNotFoundError, match="it is a file, not a directory"):
        castore.Store.open(path)


def test_a_planted_lock_symlink_is_refused_as_unsafe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A symlink planted as a task's lock file: resume raises UnsafeFileError naming it,
    `castore resolve` exits 3 with one line, and the link's target is never created."""
    store = castore.Store.init(tmp_path / "store")
    store.start(TASK, PLAN).close()
    lock = Path(store.layout.lock_path(TASK))
    lock.unlink()
    target = tmp_path / "elsewhere"
    lock.symlink_to(target)
    with pytest.raises(castore.UnsafeFileError) as caught:
        store.resume(TASK, PLAN)
    assert str(lock) == caught.value.path
    code, _out, err = cli(
        capsys, "--store", store.root, "resolve", TASK, "a", "--not-done", "--reason", "r"
    )
    assert 3 == code
    assert_one_error_line(err)
    assert False is os.path.lexists(target)


def test_the_public_api_leaks_no_oserror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError raised by a call no castore code translates (here a medium's listing in
    Store.tasks) leaves the public API as a StoreIOError with its errno and path."""
    store = castore.Store.init(tmp_path / "store")
    monkeypatch.setattr(store.medium, "names", lambda key: denied(store.medium.where(key)))
    with pytest.raises(StoreIOError) as caught:
        store.tasks()
    assert (errno.EACCES, store.layout.tasks) == (caught.value.errno, caught.value.path)
    assert "check the permissions" in str(caught.value)


def test_the_cli_turns_a_stray_oserror_into_one_line_exit_7(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's last net: an OSError that reaches it untranslated exits 7 with one line
    naming the path and the reason, never exit 1 with a traceback."""
    store = castore.Store.init(tmp_path / "store")

    def broken(_self: castore.Store) -> list[str]:
        raise OSError(errno.EIO, os.strerror(errno.EIO), "/some/where")

    monkeypatch.setattr(castore.Store, "tasks", broken)  # replaces the translating wrapper
    code, out, err = cli(capsys, "--store", store.root, "status")
    assert (7, "") == (code, out)
    assert_one_error_line(err)
    assert "/some/where" in err
    assert "Input/output error" in err


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_a_permission_error_is_not_reported_as_free_space(code: int) -> None:
    """A DurabilityError caused by EACCES/EPERM tells the user to check permissions, not
    free space; one caused by ENOSPC still speaks of space."""
    denied = DurabilityError("/s/objects/ab/x.tmp", "creating a temp file", OSError(code, "x"))
    full = DurabilityError(
        "/s/objects/ab/x.tmp", "creating a temp file", OSError(errno.ENOSPC, "x")
    )
    assert "permissions" in str(denied)
    assert "free space" not in str(denied)
    assert "free some space" in str(full).lower()
    assert "nothing was published" in str(denied)


def test_the_commit_uncertain_message_does_not_contradict_itself() -> None:
    """CommitUncertainError (raised with the DurabilityError of the directory fsync) says
    the slot exists and may not survive, and never 'nothing was published'."""
    failed = DurabilityError("/s/tasks/t/chain", "syncing a directory", OSError(errno.EIO, "x"))
    error = CommitUncertainError("/s/tasks/t/chain/3", failed)
    text = str(error)
    assert "nothing was published" not in text
    assert "Input/output error" in text
    assert "may still undo it" in text
    assert errno.EIO == error.errno


def test_fsync_dir_reports_an_error_of_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close() error after a directory fsync (NFS reports deferred errors there) is a
    DurabilityError naming the directory, not a raw OSError."""
    monkeypatch.setattr(fsio, "os", OsWith(close=close_then_eio))  # castore.medium.fsio's only
    with pytest.raises(DurabilityError) as caught:
        fsio.fsync_dir(str(tmp_path))
    assert (str(tmp_path), errno.EIO) == (caught.value.path, caught.value.errno)


# -- messages that say what happened ------------------------------------------------------------


def test_show_of_an_id_the_store_lacks_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show` of a well-formed id that no object has exits 2 saying there is no such
    object, not "restore from a backup" (nothing is damaged: the id is wrong)."""
    store = castore.Store.init(tmp_path / "store")
    code, out, err = cli(capsys, "--store", store.root, "show", "0" * 64)
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert f"no object {'0' * 64}" in err
    assert "backup" not in err


def test_a_truncated_head_slot_is_reported_truncated(tmp_path: Path) -> None:
    """A HEAD slot cut short: status and resume say it is truncated (as fsck does), at
    which slot, not that an object is missing."""
    store = castore.Store.init(tmp_path / "store")
    with store.start(TASK, PLAN) as run:
        run.commit_step("a", {"n": 1})
    rewrite(Path(store.layout.slot_path(TASK, 1)), lambda data: data[:-5])
    error = store.status(TASK).error
    assert error is not None
    assert "HEAD slot 1 is damaged: body truncated" in error
    assert "missing" not in error
    with pytest.raises(castore.ChainError, match="body truncated") as caught:
        store.resume(TASK, PLAN)
    assert 1 == caught.value.seq


def test_log_of_a_broken_chain_names_the_slot_and_fsck(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`log` of a chain with a corrupt snapshot says the chain is broken at that slot and
    to run fsck; it does not speak of resuming, which log does not do."""
    store = castore.Store.init(tmp_path / "store")
    with store.start(TASK, PLAN) as run:
        run.commit_step("a", 1)
        run.commit_step("b", 2)
    rewrite(Path(store.layout.slot_path(TASK, 1)), flip_bit)
    code, out, err = cli(capsys, "--store", store.root, "log", TASK)
    # log shows the intact slots and names the bad one in its place (issue 12, item 16).
    assert 3 == code
    assert ["2", "0"] == [line.split()[0] for line in out.splitlines() if line[:1] != "s"]
    assert "slot 1: " in out
    assert_one_error_line(err)
    assert "sequence 1" in err
    assert f"castore fsck --task {TASK}" in err
    assert "refusing to resume" not in err


def test_doctor_given_a_file_refuses_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`doctor FILE` exits 2 saying the file is not a directory, instead of silently
    checking the directory that holds it; a path that does not exist yet is still checked
    where it would live."""
    path = tmp_path / "afile"
    path.write_bytes(b"x")
    code, out, err = cli(capsys, "doctor", str(path))
    assert (2, "") == (code, out)
    assert_one_error_line(err)
    assert f"{path} is not a directory" in err
    code, out, _err = cli(capsys, "doctor", "--json", str(tmp_path / "not-yet"))
    assert str(tmp_path) == json.loads(out)["path"]
