"""`castore status` reads a store of many tasks in forked processes too (issue 26): the
same lines in the same order and the same exit status as one process, and an error a worker
met is raised as one process raises it.

Each run is a fresh interpreter (one thread, so castore may fork: a pytest-xdist worker has
more), with units of work of two tasks, so that `--jobs 3` spreads a store of ten tasks over
three processes.
"""

from __future__ import annotations

import errno
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import flip_bit, rewrite
from test_cli import make_finished, make_open, make_unresolved

import castore
from castore.chain.status import TaskStatus
from castore.cli import build_parser, overview
from castore.errors import StoreIOError, TaskNotFoundError
from castore.maintenance import forked

RUN = """
import os, sys
import castore.cli.overview as overview
from castore.maintenance import forked
from castore.store import Store
overview._UNIT = 2
parent, used, plain_status = os.getpid(), [], Store.status
class Counted(forked.ForkedMap):
    def __init__(self, function, units, jobs):
        used.append(jobs)
        super().__init__(function, units, jobs)
def status(self, task, **options):
    {fault}
    return plain_status(self, task, **options)
forked.ForkedMap, Store.status = Counted, status
from castore.cli.main import main
code = main(sys.argv[1:])
print("forked:", used, file=sys.stderr)
sys.exit(code)
"""


def status(root: str, *argv: str, fault: str = "pass") -> tuple[int, str, str]:
    """`castore status` in a fresh interpreter: (exit status, stdout, stderr), an open
    effect's age (read at each run: its seconds may tick between two runs) masked."""
    done = subprocess.run(
        [sys.executable, "-c", RUN.format(fault=fault), "--store", root, "status", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = re.sub(r"(for |\"age_s\": )[0-9.]+[smhd]?", r"\1AGE", done.stdout)
    return done.returncode, out, done.stderr


@pytest.fixture
def many(store: castore.Store) -> castore.Store:
    """Ten tasks: finished, open, unresolved, and one whose HEAD slot is damaged."""
    for index in range(3):
        make_finished(store, f"done-{index}")
        make_open(store, f"open-{index}")
        make_unresolved(store, f"unresolved-{index}")
    make_finished(store, "hurt")
    rewrite(Path(store.layout.slot_path("hurt", 2)), flip_bit)
    return store


@pytest.mark.parametrize("argv", [(), ("--json",), ("--open",), ("--verify", "--json")])
def test_three_processes_print_what_one_prints(many: castore.Store, argv: tuple[str, ...]) -> None:
    """`--jobs 3` (units of two tasks, shared by this process and two forked ones) prints
    the lines `--jobs 1` prints, in the same order, and exits the same way (3: broken)."""
    alone = status(many.root, "--jobs", "1", *argv)
    shared = status(many.root, "--jobs", "3", *argv)
    assert (3, "forked: []\n") == (alone[0], alone[2])
    assert (3, "forked: [3]\n") == (shared[0], shared[2])
    assert alone[1] == shared[1]
    assert "hurt" in alone[1]


def test_by_default_a_few_tasks_are_read_here_alone(many: castore.Store) -> None:
    """Without --jobs, ten tasks are read in one process (a process must have hundreds)."""
    code, out, err = status(many.root, "--json")
    assert (3, 11, "forked: []\n") == (code, len(out.splitlines()), err)


def test_a_task_a_worker_could_not_read_is_read_again_here(many: castore.Store) -> None:
    """A forked worker that fails on a task (here: every read outside the first process
    fails) is no failure of status: this process reads every task again, and prints what one
    process prints."""
    fault = "if os.getpid() != parent: raise OSError('only the first process reads')"
    alone = status(many.root, "--jobs", "1")
    shared = status(many.root, "--jobs", "3", fault=fault)
    assert (alone[0], alone[1]) == (shared[0], shared[1])
    assert "forked: [3]\n" == shared[2]


def test_an_error_of_a_task_is_raised_with_its_own_exit_status(many: castore.Store) -> None:
    """A task that cannot be read wherever it is read (an I/O error) ends status with that
    error's exit status (7) and one error line, with --jobs 3 as with --jobs 1."""
    fault = (
        "if task == 'open-2':\n"
        "        from castore.errors import StoreIOError\n"
        "        raise StoreIOError(task, 'reading', OSError(5, 'Input/output error'))"
    )
    alone = status(many.root, "--jobs", "1", fault=fault)
    shared = status(many.root, "--jobs", "3", fault=fault)
    assert 7 == alone[0]
    assert "reading open-2 failed: Input/output error" in alone[2]
    assert (alone[0], alone[1], alone[2].replace("[]", "[3]")) == shared


def test_the_error_of_the_first_task_in_order_is_raised(
    many: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process may meet an error at a later task while a worker is still reading an
    earlier one that fails too (a race, so played here by a stand-in for the map): status
    raises the earlier task's error, as --jobs 1 does, not whichever came first."""

    class LaterTaskFailsFirst:
        def __init__(self, function: object, units: object, jobs: int) -> None:
            pass

        def __enter__(self) -> LaterTaskFailsFirst:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def __iter__(self) -> Iterator[list[overview.Shown]]:
            raise TaskNotFoundError("unresolved-2")

    plain_status = castore.Store.status

    def status_of(self: castore.Store, task: str, **options: Any) -> TaskStatus:
        if task == "done-1":
            raise StoreIOError(task, "reading", OSError(errno.EIO, "Input/output error"))
        return plain_status(self, task, **options)

    monkeypatch.setattr(forked, "ForkedMap", LaterTaskFailsFirst)
    monkeypatch.setattr(forked, "may_fork", lambda: True)
    monkeypatch.setattr(castore.Store, "status", status_of)
    args = build_parser().parse_args(["status", "--jobs", "3"])
    with pytest.raises(StoreIOError, match="reading done-1 failed"):
        overview._read_shown(many, many.tasks(), args)


@pytest.mark.parametrize("jobs", ["1", "3"])
def test_what_is_not_a_started_task_is_not_listed(
    many: castore.Store, jobs: str, tmp_path: Path
) -> None:
    """Under tasks/: a directory without slot 0 (a start interrupted before its commit point,
    FORMAT.md §10.2), a symlink and a regular file named like tasks are not tasks, as
    `store.tasks()` says: status lists the ten tasks alone (fsck reports the planted
    entries). Named alone, the interrupted start is no task (exit 2)."""
    Path(many.layout.slot_path("begun", 0)).parent.mkdir(parents=True)
    tasks = Path(many.root, "tasks")
    (tasks / "linked").symlink_to(tmp_path)
    (tasks / "planted").write_text("x")
    code, out, _ = status(many.root, "--jobs", jobs, "--json")
    assert (3, 11) == (code, len(out.splitlines()))
    listed = set(re.findall(r'"task": "([^"]*)"', out))  # its ages are masked: not JSON
    assert ("done-0" in listed, set()) == (True, {"begun", "linked", "planted"} & listed)
    code, out, err = status(many.root, "begun")
    assert (2, "") == (code, out)
    assert "begun" in err
