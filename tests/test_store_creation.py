"""Creating a store: a kill anywhere in init leaves what the next init completes, any number of
processes may create one store at once, a directory with anything else in it is never adopted,
and a store whose marker is gone says what happened and what to do (so does fsck)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, read_line, tree_snapshot

import castore
from castore import crashpoints
from castore.maintenance.fsck import Severity, check_store

DEADLINE = 60.0
KILLS = int(os.environ.get("CASTORE_INIT_KILLS", "25"))
SEED = int(os.environ.get("CASTORE_INIT_SEED", "20261201"))
PLAN = castore.Plan.build("init", "a")

# The child: open (and so create) the store at argv[1] once told to on stdin.
# `castore.Store` is looked up before "ready": `import castore` loads nothing until a name is
# used, and the kill must land in init, not in the imports init would otherwise start with.
CREATOR = """
import sys
import castore
Store = castore.Store
print("ready", flush=True)
sys.stdin.readline()
Store.open(sys.argv[1], create=True)
print("created", flush=True)
"""


def creator(
    children: list[subprocess.Popen[str]], root: Path, crash_at: str | None = None
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != crashpoints.ENV_VAR}
    if crash_at is not None:
        env[crashpoints.ENV_VAR] = crash_at
    proc = subprocess.Popen(
        [sys.executable, "-c", CREATOR, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    children.append(proc)
    assert "ready\n" == read_line(proc, DEADLINE)
    return proc


def go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def errors_of(root: Path) -> list[str]:
    return [
        f"{f.code} {f.path}: {f.message}"
        for f in check_store(root, jobs=1)
        if f.severity is Severity.ERROR
    ]


def assert_whole(root: Path) -> None:
    """The store opens, fsck finds no error, and a task can be started and resumed."""
    store = castore.Store.open(root)
    assert [] == errors_of(root)
    with store.open_task("t/1", PLAN) as run:
        run.commit_step("a", 1)
    assert 1 == store.verify("t/1").head.seq
    assert [] == errors_of(root)


INIT_POINTS = [
    ("init.root", 1, False),
    ("init.tasks", 1, False),
    ("object.temp_created", 1, False),
    ("object.mid_write", 1, False),
    ("object.temp_synced", 1, False),
    ("object.linked", 1, True),
    ("object.published", 1, True),
]


@pytest.mark.parametrize(("point", "nth", "marked"), INIT_POINTS)
def test_a_kill_at_each_init_point_is_completed_by_the_next_open(  # noqa: PLR0917
    tmp_path: Path,
    children: list[subprocess.Popen[str]],
    capsys: pytest.CaptureFixture[str],
    point: str,
    nth: int,
    marked: bool,
) -> None:
    """SIGKILL at each named point of init: without a marker, open says "interrupted init",
    fsck says so too (a warning, exit 0); then open(create=True) completes a whole store."""
    root = tmp_path / "store"
    proc = creator(children, root, f"{point}:{nth}")
    go(proc)
    proc.communicate(timeout=DEADLINE)
    assert -signal.SIGKILL == proc.returncode
    assert marked == (root / "castore.json").exists()
    if not marked:
        with pytest.raises(castore.StoreNotFoundError) as caught:
            castore.Store.open(root)
        assert f"`castore init {root}`" in str(caught.value)
        code, out, _ = cli(capsys, "fsck", str(root))
        if any(root.iterdir()):
            assert "interrupted `castore init`" in str(caught.value)
            assert 0 == code
            assert out.startswith("warning: interrupted-init: castore.json: ")
        else:  # killed right after its mkdir: an empty directory, simply no store yet
            assert (2, "") == (code, out)
    castore.Store.open(root, create=True)
    assert_whole(root)


def test_castore_init_completes_an_interrupted_init(
    tmp_path: Path, children: list[subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """What the error message says to run, `castore init PATH`, completes the store."""
    root = tmp_path / "store"
    proc = creator(children, root, "init.tasks:1")
    go(proc)
    proc.communicate(timeout=DEADLINE)
    code, out, err = cli(capsys, "init", str(root))
    assert (0, "") == (code, err), out
    assert_whole(root)


def test_random_kills_during_the_first_open_never_break_the_store(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """SIGKILL 0-10 ms into a process's first Store.open(create=True), many times: the next
    open(create=True) always succeeds and the store is whole. Init takes a few ms, so some
    kills come before or after it: trials go on (up to 8 times as many) until 5 landed in it."""
    rng = random.Random(SEED)
    interrupted = 0
    for trial in range(KILLS * 8):
        if trial >= KILLS and interrupted >= 5:
            break
        root = tmp_path / f"store-{trial}"
        proc = creator(children, root)
        go(proc)
        # A random moment to kill at, not a wait for anything: the point of the test.
        time.sleep(rng.uniform(0.0, 0.010))
        proc.kill()
        proc.communicate(timeout=DEADLINE)
        if root.exists() and not (root / "castore.json").exists():
            interrupted += 1
        castore.Store.open(root, create=True)
        assert [] == errors_of(root), f"trial {trial}"
    assert interrupted >= 5, "too few kills landed inside init to mean anything"
    assert_whole(tmp_path / "store-0")


# -- what is never adopted -----------------------------------------------------------------------


def _plant(root: Path, what: str) -> None:
    root.mkdir()
    (root / "objects").mkdir()
    (root / "objects" / "00").mkdir()
    (root / "tasks").mkdir()
    if what == "user-file":
        (root / "notes.txt").write_text("keep me")
    elif what == "file-in-fanout":
        (root / "objects" / "00" / "data.bin").write_bytes(b"x")
    elif what == "object":
        (root / "objects" / "00" / ("00" * 32)).write_bytes(b"x")
    elif what == "task":
        (root / "tasks" / "job").mkdir()
    elif what == "quarantine":
        (root / "quarantine").mkdir()
    elif what == "big-temp":
        (root / ".tmp-host-1-0123456789ab").write_bytes(b"x" * 34)
    elif what == "odd-fanout":
        (root / "objects" / "zz").mkdir()
    elif what == "fanout-symlink":
        (root / "objects" / "01").symlink_to(root / "tasks")


ALIEN = [
    "user-file",
    "file-in-fanout",
    "object",
    "task",
    "quarantine",
    "big-temp",
    "odd-fanout",
    "fanout-symlink",
]


@pytest.mark.parametrize("what", ALIEN)
def test_a_directory_with_anything_else_is_never_adopted(tmp_path: Path, what: str) -> None:
    """init and open(create=True) refuse a directory holding anything an interrupted init
    does not leave, and change nothing in it."""
    root = tmp_path / "dir"
    _plant(root, what)
    before = tree_snapshot(tmp_path)
    with pytest.raises(castore.StoreExistsError):
        castore.Store.init(root)
    with pytest.raises(castore.StoreNotFoundError):
        castore.Store.open(root, create=True)
    assert before == tree_snapshot(tmp_path)


def test_init_leftovers_with_a_marker_temp_file_are_adopted(tmp_path: Path) -> None:
    """The exact leftovers of an interrupted init (some fan-out directories, an empty tasks/,
    a partial temp file of the marker) are completed."""
    root = tmp_path / "dir"
    _plant(root, "nothing else")
    (root / ".tmp-host-1-0123456789ab").write_bytes(b'{"format":"cas')
    castore.Store.init(root)
    assert_whole(root)


# -- a store that lost its marker ----------------------------------------------------------------


@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_a_store_without_its_marker_says_what_happened_and_fsck_checks_it(
    store: castore.Store, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """A store with tasks whose castore.json was deleted or emptied: open says the marker is
    gone and to restore it (not "create one with init", which refuses); fsck reports
    missing-marker and still checks the objects and tasks; init refuses."""
    with store.start("t/1", PLAN) as run:
        run.commit_step("a", 1)
    marker = Path(store.layout.marker)
    marker.unlink()
    if damage == "emptied":
        marker.write_bytes(b"")
    with pytest.raises(castore.StoreNotFoundError) as caught:
        castore.Store.open(store.root)
    message = str(caught.value)
    assert ("is empty" if damage == "emptied" else "is missing") in message
    assert "restore castore.json from a backup" in message
    assert "create one with" not in message
    with pytest.raises(castore.StoreExistsError):
        castore.Store.init(store.root)
    code, out, _ = cli(capsys, "fsck", store.root)
    lines = out.splitlines()
    assert 1 == code
    assert lines[0].startswith("error: missing-marker: castore.json: ")
    assert lines[-1].startswith("checked 3 objects and 1 task in ")
    marker.unlink(missing_ok=True)
    marker.write_bytes(b'{"format":"castore","version":1}\n')
    assert [] == errors_of(Path(store.root))


def test_an_empty_marker_alone_says_to_remove_it(tmp_path: Path) -> None:
    """An empty castore.json beside init's empty directories: remove it, init completes."""
    root = tmp_path / "dir"
    _plant(root, "nothing else")
    (root / "castore.json").write_bytes(b"")
    with pytest.raises(castore.StoreNotFoundError) as caught:
        castore.Store.open(root)
    assert f"remove {root / 'castore.json'}, then `castore init {root}`" in str(caught.value)
    (root / "castore.json").unlink()
    castore.Store.init(root)
    assert_whole(root)


def test_a_store_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    """open of a regular file: StoreNotFoundError saying it is a file, not a raw OSError."""
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(castore.StoreNotFoundError) as caught:
        castore.Store.open(path)
    assert "it is a file, not a directory" in str(caught.value)


# -- concurrent creation -------------------------------------------------------------------------

CTX = multiprocessing.get_context("fork")
CREATORS = 6
ROUNDS = int(os.environ.get("CASTORE_CREATE_ROUNDS", "15"))


def _create_in_rounds(base: str, barrier: Any, out: Any) -> None:
    failures = []
    for number in range(ROUNDS):
        barrier.wait(DEADLINE)
        try:
            castore.Store.open(os.path.join(base, f"s{number}", "store"), create=True)
        except Exception as exc:  # noqa: BLE001 - every failure is reported by the test
            failures.append(f"round {number}: {type(exc).__name__}: {exc}")
    out.put(failures)


def test_many_processes_creating_one_store_at_once_all_succeed(tmp_path: Path) -> None:
    """Six processes call Store.open(path, create=True) on one new path at once, round after
    round (parents missing too): every call succeeds and every store is whole."""
    barrier = CTX.Barrier(CREATORS)
    results = CTX.Queue()
    procs: list[BaseProcess] = [
        CTX.Process(target=_create_in_rounds, args=(str(tmp_path), barrier, results))
        for _ in range(CREATORS)
    ]
    for proc in procs:
        proc.start()
    try:
        failures = [results.get(timeout=DEADLINE * 2) for _ in procs]
    finally:
        for proc in procs:
            proc.join(DEADLINE)
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGKILL)
    assert [[]] * CREATORS == failures
    for number in range(ROUNDS):
        root = tmp_path / f"s{number}" / "store"
        assert [] == errors_of(root)
        assert [] == [f for f in check_store(root, jobs=1) if f.code != "temp-file"]


def test_an_os_error_while_creating_is_a_castore_error_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EACCES on the mkdir of tasks/: StoreIOError naming that directory and the cause, saying
    init completes the store once fixed; and it does."""
    root = tmp_path / "store"
    real_mkdir = os.mkdir

    def mkdir(path: str, *args: Any, **kwargs: Any) -> None:
        if path.endswith(os.sep + "tasks"):
            raise PermissionError(13, "Permission denied", path)
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(castore.errors.StoreIOError) as caught:
        castore.Store.open(root, create=True)
    monkeypatch.undo()
    assert str(root / "tasks") == caught.value.path
    assert "Permission denied" in str(caught.value)
    assert f"`castore init {root}` completes it" in str(caught.value)
    castore.Store.open(root, create=True)
    assert_whole(root)
