"""A second copy of a task held by a live run says it is waiting for the task's lock, and how
long, as the wait begins; the CLI then ends with one line and exit 4, no traceback."""

from __future__ import annotations

import logging

import pytest
from helpers import cli

import castore
import castore.store

PLAN = castore.Plan.build("p", "a", "b")


def test_a_wait_for_a_held_lock_is_told_as_it_begins(
    store: castore.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The library logs one warning on logger castore.lock naming the task and the wait, then
    raises TaskBusyError; a lock that is free, or a wait of 0, tells nothing."""
    with caplog.at_level(logging.WARNING, logger="castore.lock"):
        with store.open_task("job-1", PLAN):
            with pytest.raises(castore.TaskBusyError):
                store.open_task("job-1", PLAN, lock_timeout=0.05)
            with pytest.raises(castore.TaskBusyError):
                store.open_task("job-1", PLAN, lock_timeout=0)
        store.open_task("job-1", PLAN, lock_timeout=0.05).close()
    assert [
        ("castore.lock", "task 'job-1' is held by another worker on this host; waiting up to "
         "0.05s for its lock"),
    ] == [(record.name, record.getMessage()) for record in caplog.records]  # fmt: skip


def test_the_cli_says_it_waits_then_one_error_line_and_exit_4(
    store: castore.Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`castore resolve` on a task another worker holds prints a note as its wait begins,
    then one error line saying to let that worker finish, and exits 4."""
    monkeypatch.setattr(castore.store, "DEFAULT_LOCK_TIMEOUT", 0.05)
    with store.open_task("job-1", PLAN):
        code, out, err = cli(
            capsys, "--store", str(store.root), "resolve", "job-1", "a", "--confirmed", "r"
        )
    assert (4, "") == (code, out)
    assert [
        "castore: note: task 'job-1' is held by another worker on this host; waiting up to "
        "0.05s for its lock",
        "castore: error: task 'job-1' is held by another worker on this host (waited 0.05s "
        "for its lock); let that worker finish, then run the command again",
    ] == err.splitlines()
