"""forget: a tombstone committed through the commit point ends a task for good (issue 13
item 4): start, resume and open_task refuse it, nothing follows it, a racing writer loses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from helpers import cli
from test_gc_handshake import finish, spawn, wait_stopped

import castore
from castore.errors import (
    ForgetRefusedError,
    IllegalHistoryError,
    TaskForgottenError,
)
from castore.format.history import illegal_changes
from castore.format.records import Transition, TransitionKind
from castore.run import forget as forgetting
from castore.run.settings import RunSettings, encode_snapshot

PLAN = castore.Plan.build("job", "a", castore.effect("pay", "a"), "b")
SERVICE = castore.Service("payments")


class Outage(Exception):
    """The service call failed: the effect stays SUBMITTED."""


def started(store: castore.Store, task: str = "t") -> None:
    with store.start(task, PLAN) as run:
        run.commit_step("a", {"n": 1})


def submitted(store: castore.Store, task: str = "t") -> None:
    """A task whose effect `pay` is SUBMITTED (its call failed before a receipt)."""
    started(store, task)
    with store.resume(task, PLAN) as run, pytest.raises(Outage), run.effect("pay", SERVICE):
        raise Outage


def test_forget_commits_a_tombstone_at_head_plus_one(store: castore.Store) -> None:
    """The tombstone is the next snapshot: kind forget, who and why, HEAD's frontier kept."""
    started(store)
    done = store.forget("t", who="ana", why="customer left")
    (tombstone_id, tombstone), (parent_id, parent) = store.history("t")[:2]
    assert (2, tombstone_id, False) == (done.seq, done.id, done.already)
    assert TransitionKind.FORGET == tombstone.transition.kind
    assert ("ana", "customer left") == (tombstone.transition.who, tombstone.transition.why)
    header = Path(store.objects.path(tombstone_id)).read_bytes().split(b"\n", 1)[0]
    assert b"castore 2 snapshot" == header.rsplit(b" ", 1)[0]  # a v1 reader refuses it
    assert (parent_id, parent.frontier, parent.effects) == (
        tombstone.parent,
        tombstone.frontier,
        tombstone.effects,
    )


def test_start_resume_and_open_task_refuse_a_forgotten_task(store: castore.Store) -> None:
    """After the tombstone every way back into the task says when, who, and to use a new id."""
    started(store)
    store.forget("t", who="ana", why="done with it")
    for attempt in (
        lambda: store.resume("t", PLAN),
        lambda: store.start("t", PLAN),
        lambda: store.open_task("t", PLAN),
        lambda: store.resolve("t", "pay", receipt="r-1", who="ana"),
    ):
        with pytest.raises(TaskForgottenError) as caught:
            attempt()
        assert "t" == caught.value.task
        assert "by ana" in str(caught.value)
        assert "use a new task id" in str(caught.value)


def test_forgetting_twice_changes_nothing(store: castore.Store) -> None:
    """A second forget finds the tombstone and commits nothing."""
    started(store)
    first = store.forget("t", who="ana", why="one")
    again = store.forget("t", who="bo", why="two")
    assert (first.id, first.seq, "ana", True) == (again.id, again.seq, again.who, again.already)
    assert 3 == len(store.history("t"))


def test_forget_refuses_an_effect_in_flight_unless_forced(store: castore.Store) -> None:
    """A SUBMITTED effect's outcome would be lost: refused, the message says how to settle it
    or how to force; forced, the tombstone keeps the record as it was."""
    submitted(store)
    with pytest.raises(ForgetRefusedError) as caught:
        store.forget("t", who="ana", why="stop")
    assert ("pay", "SUBMITTED") == (caught.value.step, caught.value.state)
    assert "castore resolve t pay" in str(caught.value)
    assert "--force-in-flight" in str(caught.value)
    assert TransitionKind.EFFECT == store.history("t")[0][1].transition.kind
    store.forget("t", who="ana", why="stop", force_in_flight=True)
    head = store.history("t")[0][1]
    assert (TransitionKind.FORGET, "SUBMITTED") == (head.transition.kind, head.effects[0].state)


def test_forget_needs_who_and_why(store: castore.Store) -> None:
    """An audit entry without a name or a reason is refused before anything is written."""
    started(store)
    with pytest.raises(castore.UsageError, match="forget needs why"):
        store.forget("t", who="ana", why=" ")
    assert 2 == len(store.history("t"))


def test_nothing_follows_a_tombstone(store: castore.Store) -> None:
    """A snapshot linked after the tombstone (a forged or stale commit) is an illegal history."""
    started(store)
    store.forget("t", who="ana", why="end")
    tombstone_id, tombstone = store.history("t")[0]
    child = attrs.evolve(
        tombstone,
        seq=tombstone.seq + 1,
        parent=tombstone_id,
        transition=Transition(TransitionKind.STEP, step="pay", result=1),
    )
    assert ["sequence 3 follows the tombstone at 2: nothing follows it"] == illegal_changes(
        tombstone, child
    )
    slots = store._slots("t")
    slots.commit(encode_snapshot(child, RunSettings()), child.seq, tombstone_id)
    with pytest.raises(IllegalHistoryError, match="follows the tombstone"):
        store.verify("t")


def test_a_tombstone_naming_a_step_is_illegal(store: castore.Store) -> None:
    """A tombstone ends the task as HEAD left it: one that records a step is refused."""
    started(store)
    store.forget("t", who="ana", why="end")
    tombstone = store.history("t")[0][1]
    parent = store.history("t")[1][1]
    forged = attrs.evolve(
        tombstone, transition=attrs.evolve(tombstone.transition, step="pay", result=1)
    )
    assert ["a forget transition records step, result"] == illegal_changes(parent, forged)


def test_status_shows_a_forgotten_task(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """status (plain and --verify) and the CLI say the task is forgotten, by whom and why."""
    started(store)
    store.forget("t", who="ana", why="customer left")
    for verify in (False, True):
        status = store.status("t", verify=verify)
        assert (True, None, "done") == (status.forgotten, status.error, status.next_action)
        assert "by ana: customer left" in status.reason
    code, out, _ = cli(capsys, "--store", str(store.root), "status")
    assert 0 == code
    assert "t  seq 2  forgotten at " in out
    assert "by ana: customer left" in out


def test_cli_forget_json_and_exit_codes(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore forget --json` prints the tombstone; a refused forget exits 5, naming the
    effect; resuming the forgotten task through the CLI's error path exits 5 too."""
    submitted(store)
    root = str(store.root)
    code, _, err = cli(capsys, "--store", root, "forget", "t", "--who", "ana", "--why", "x")
    assert 5 == code
    assert "effect 'pay' is SUBMITTED" in err
    code, out, _ = cli(
        capsys, "--store", root, "forget", "t", "--why", "x", "--force-in-flight", "--json"
    )
    assert 0 == code
    printed = json.loads(out)
    assert (3, "x", False) == (printed["seq"], printed["why"], printed["already"])
    assert store.history("t")[0][0] == printed["snapshot"]


def test_a_writer_racing_forget_loses_at_the_link(
    store: castore.Store, children: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """Two real processes: a writer stopped just before linking its next commit, then
    `castore forget` in another process takes that slot; the writer's link fails and it
    gets ConflictError, and the tombstone stays HEAD."""
    started(store)
    writer = spawn(children, RACER, str(store.root), pause="commit.before_link")
    wait_stopped(writer)
    forgetter = subprocess.run(
        [*CASTORE, "--store", str(store.root), "forget", "t", "--who", "ana", "--why", "race"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == forgetter.returncode, forgetter.stderr
    out = finish(writer)
    assert "conflict at 2" == out.strip()
    head = store.history("t")[0][1]
    assert (2, TransitionKind.FORGET) == (head.seq, head.transition.kind)
    with pytest.raises(TaskForgottenError):
        store.resume("t", PLAN)


def test_forget_loses_to_a_writer_and_forgets_the_new_head(store: castore.Store) -> None:
    """A writer that linked first wins; forget judges the new HEAD and commits after it."""
    started(store)
    slots = store._slots("t")
    real_commit = slots.commit
    raced = []

    def racing_commit(data: bytes, seq: int, parent: str, relies_on: object = ()) -> str:
        if not raced:  # another writer takes this slot just before forget links it
            raced.append(seq)
            with store.resume("t", PLAN, lock_timeout=None) as run, run.effect("pay", SERVICE) as c:
                c.confirm("r-1")
        return real_commit(data, seq, parent)

    slots.commit = racing_commit  # type: ignore[method-assign]
    done = forgetting.forget(store.objects, slots, RunSettings(), who="ana", why="race")
    assert ([2], 4) == (raced, done.seq)  # SUBMITTED at 2, CONFIRMED at 3, tombstone at 4


# The racing writer: resume the task (its lock skipped: the other process holds none), then
# try to commit step "pay"'s effect submission; report the conflict.
RACER = """
import sys
import castore
from castore.errors import ConflictError
plan = castore.Plan.build("job", "a", castore.effect("pay", "a"), "b")
store = castore.Store.open(sys.argv[1])
run = store.resume("t", plan)
try:
    with run.effect("pay", castore.Service("payments")) as call:
        call.confirm("r-1")
except ConflictError as exc:
    print("conflict at", exc.seq, flush=True)
"""
CASTORE = [sys.executable, "-m", "castore"]
