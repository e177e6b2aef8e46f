"""A hostile-input table: files planted in a store where castore expects its own.

Each row plants one thing (a FIFO, a symlink, a huge sparse file, a forged deeply nested
object) and runs the read and write verbs on the store in a child process with a deadline
(a FIFO must never block a reader). Every verb ends with its documented exit status, at most
one line on stderr and never a traceback; nothing outside the store is created or changed
through a planted link. (Damage to the bytes of objects: test_corruption.py, test_fsck.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from helpers import tree_snapshot

import castore
from castore.format import codec
from castore.format.digest import hash_bytes

PLAN = castore.Plan.build("hostile", "a", "b", castore.effect("charge", "b"), "c")
TASK, OPEN = "t", "u"  # TASK at seq 1; OPEN with its charge SUBMITTED
HUGE = 8 << 30

# The verbs, in this order (resolve last: it commits); the child prints one JSON line per
# verb: [exit status, stderr].
VERBS = {
    "status": ["status"],
    "log": ["log", TASK],
    "show": ["show", f"{TASK}@1"],
    "fsck": ["fsck", "--jobs", "1"],
    "gc": ["gc"],
    "resolve": [
        "resolve",
        OPEN,
        "charge",
        "--not-done",
        "--reason",
        "refused",
        "--submitter-ended",
    ],
}
CHILD = """
import contextlib, io, json, sys
from castore.cli import main
root, verbs = sys.argv[1], json.loads(sys.argv[2])
for name, argv in verbs.items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["--store", root, *argv])
    print(json.dumps([name, code, err.getvalue()]), flush=True)
"""


def make_store(root: Path) -> castore.Store:
    store = castore.Store.init(root)
    with store.start(TASK, PLAN) as run:
        run.commit_step("a", 1)
    payments = castore.Service("payments", idempotent=True, retention=86400)
    with store.start(OPEN, PLAN) as run:
        run.commit_step("a", 1)
        run.commit_step("b", 2)
        with pytest.raises(ConnectionError), run.effect("charge", payments):
            raise ConnectionError("the answer was lost")
    return store


def replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def replace_with_link(path: Path, outside: Path) -> None:
    """`path` becomes a symlink to a copy of itself under `outside`."""
    target = outside / path.name
    subprocess.run(["cp", "-a", str(path), str(target)], check=True)
    subprocess.run(["rm", "-rf", str(path)], check=True)
    path.symlink_to(target)


def replace_with_huge(path: Path) -> None:
    path.unlink()
    with open(path, "wb") as handle:
        handle.truncate(HUGE)


def head_slot(store: castore.Store) -> Path:
    return Path(store.layout.slot_path(TASK, 1))


def plan_object(store: castore.Store) -> Path:
    return Path(store.objects.path(store.verify(TASK).plan_id))


def plant_deep_blob(store: castore.Store) -> None:
    data = codec.frame("blob", b"[" * 200 + b"]" * 200)
    path = Path(store.objects.path(hash_bytes(data)))
    path.parent.mkdir(exist_ok=True)  # fan-out directories are made on first use
    path.write_bytes(data)
    path.chmod(0o444)


@attrs.frozen
class Row:
    """What is planted, and the exit status of each verb afterwards."""

    name: str
    plant: Callable[[castore.Store, Path], None]
    exits: dict[str, int]


BROKEN_TASK = {"status": 3, "log": 3, "show": 3, "fsck": 1, "gc": 2, "resolve": 0}
NOT_A_STORE = dict.fromkeys(VERBS, 2)
UNSAFE_STORE = dict.fromkeys(VERBS, 3)
ROWS = [
    Row("marker-fifo", lambda s, o: replace_with_fifo(Path(s.layout.marker)), NOT_A_STORE),
    Row("marker-link", lambda s, o: replace_with_link(Path(s.layout.marker), o), NOT_A_STORE),
    Row("tasks-link", lambda s, o: replace_with_link(Path(s.layout.tasks), o), UNSAFE_STORE),
    Row("objects-link", lambda s, o: replace_with_link(Path(s.layout.objects), o), UNSAFE_STORE),
    Row(
        "chain-link",
        lambda s, o: replace_with_link(Path(s.layout.chain_dir(TASK)), o),
        BROKEN_TASK,
    ),
    Row(
        "lock-link",
        lambda s, o: replace_with_link(Path(s.layout.lock_path(OPEN)), o),
        {"status": 0, "log": 0, "show": 0, "fsck": 1, "gc": 0, "resolve": 3},
    ),
    Row("head-slot-fifo", lambda s, o: replace_with_fifo(head_slot(s)), BROKEN_TASK),
    Row("head-slot-huge", lambda s, o: replace_with_huge(head_slot(s)), BROKEN_TASK),
    Row(
        "plan-object-fifo",
        lambda s, o: replace_with_fifo(plan_object(s)),
        {"status": 0, "log": 3, "show": 0, "fsck": 1, "gc": 0, "resolve": 3},
    ),
    Row(
        "plan-object-huge",
        lambda s, o: replace_with_huge(plan_object(s)),
        {"status": 0, "log": 3, "show": 0, "fsck": 1, "gc": 0, "resolve": 3},
    ),
    Row(
        "deep-blob",
        lambda s, o: plant_deep_blob(s),
        {"status": 0, "log": 0, "show": 0, "fsck": 1, "gc": 0, "resolve": 0},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_a_planted_file_gets_a_clear_answer_from_every_verb(tmp_path: Path, row: Row) -> None:
    """After the planting, each verb exits as the row says, with at most one line on
    stderr and no traceback, within the deadline; what a planted link points to is left
    exactly as it was."""
    store = make_store(tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    row.plant(store, outside)
    before = tree_snapshot(outside)
    result = subprocess.run(
        [sys.executable, "-c", CHILD, store.root, json.dumps(VERBS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (0, "") == (result.returncode, result.stderr)
    outcomes = {
        name: (code, err) for name, code, err in map(json.loads, result.stdout.splitlines())
    }
    assert row.exits == {name: code for name, (code, _err) in outcomes.items()}, outcomes
    for name, (_code, err) in outcomes.items():
        assert "Traceback" not in err, (name, err)
        assert len(err.splitlines()) <= 1, (name, err)
    assert before == tree_snapshot(outside)
