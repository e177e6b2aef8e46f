"""fork: a new task that starts from an earlier snapshot of another and shares its objects
(issue 13 item 4): carried outcomes come back on resume through a hash-checked tree; open
effects run again in the fork under new keys; an effect in flight refuses the fork."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import cli, flip_bit, rewrite

import castore
from castore.errors import ChainError, ForkError, TaskForgottenError
from castore.format.fastdecode import decode_canonical
from castore.format.records import EffectState, Snapshot

PLAN = castore.Plan.build("job", "a", castore.effect("pay", "a"), "b", "c")
PLAN_ID = castore.plan_id(PLAN)
SERVICE = castore.Service("payments")


class Outage(Exception):
    """The service call failed: the effect stays SUBMITTED."""


def source(store: castore.Store) -> None:
    """Task "src": a (blob result) at 1, pay SUBMITTED at 2 and CONFIRMED at 3, b at 4."""
    with store.start("src", PLAN) as run:
        run.commit_step("a", store.put_blob({"big": "x" * 50}))
        with run.effect("pay", SERVICE) as call:
            call.confirm("rcpt-1")
        run.commit_step("b", {"n": 2})


def test_resume_of_a_fork_returns_the_carried_outcomes(store: castore.Store) -> None:
    """A fork at seq 4 resumes at step c with a's blob result, pay's receipt and b's
    inline result, read through the outcomes tree; the source is untouched."""
    source(store)
    forked = store.fork("src@4", "copy")
    assert ("copy", "src", 4, 3) == (forked.task, forked.source, forked.seq, forked.carried)
    with store.resume("copy", PLAN) as run:
        assert (0, "c") == (run.head.seq, run.next_step)
        assert {"big": "x" * 50} == run.result("a")
        assert "rcpt-1" == run.receipt("pay")
        assert {"n": 2} == run.result("b")
        run.commit_step("c", 3)
    fork_field = store.history("copy")[-1][1].fork
    assert fork_field is not None
    assert ("src", 4, store.history("src")[0][0]) == (
        fork_field.task,
        fork_field.seq,
        fork_field.id,
    )
    assert 5 == len(store.history("src"))
    for object_id, kind in ((forked.snapshot, b"snapshot"), (forked.outcomes, b"tree")):
        header = Path(store.objects.path(object_id)).read_bytes().split(b"\n", 1)[0]
        assert b"castore 2 " + kind == header.rsplit(b" ", 1)[0]


def test_an_effect_after_the_fork_point_runs_again_under_a_new_key(store: castore.Store) -> None:
    """Forked at seq 1 (before pay), the fork's pay is PLANNED with a key derived from the
    new task id, and submitting it sends that key, not the source's."""
    source(store)
    store.fork(("src", 1), "again")
    with store.resume("again", PLAN) as run:
        record = run.head.effect("pay")
        assert record is not None
        assert (EffectState.PLANNED, castore.derive_key("again", PLAN_ID, "pay")) == (
            record.state,
            record.key,
        )
        assert castore.derive_key("src", PLAN_ID, "pay") != record.key
        with run.effect("pay", SERVICE) as call:
            assert castore.derive_key("again", PLAN_ID, "pay") == call.key
            call.confirm("rcpt-2")
        assert "rcpt-2" == run.receipt("pay")
    assert "rcpt-1" == store.resume("src", PLAN).receipt("pay")


@pytest.mark.parametrize("state", ["SUBMITTED", "UNRESOLVED"])
def test_a_snapshot_with_an_effect_in_flight_cannot_be_forked(
    store: castore.Store, state: str
) -> None:
    """Whether the effect happened is unknown there: ForkError says so and what to do."""
    with store.start("src", PLAN) as run:
        run.commit_step("a", 1)
        with pytest.raises(Outage), run.effect("pay", SERVICE):
            raise Outage
    if state == "UNRESOLVED":
        with store.resume("src", PLAN) as run:
            run.settle(SERVICE)  # no reconcile, not idempotent: marked UNRESOLVED
    seq = store.history("src")[0][1].seq
    with pytest.raises(ForkError) as caught:
        store.fork(f"src@{seq}", "copy")
    assert f"effect 'pay' is {state} there" in str(caught.value)
    assert "fork from a sequence before its submission" in str(caught.value)
    assert "copy" not in store.tasks()


def test_fork_refuses_an_existing_or_forgotten_id_and_bad_references(
    store: castore.Store,
) -> None:
    """The new id must be new (a forgotten one is never reused); TASK@SEQ must name a
    snapshot of the task."""
    source(store)
    with store.start("taken", PLAN) as run:
        run.commit_step("a", 1)
    store.forget("taken", who="ana", why="done")
    with pytest.raises(TaskForgottenError):
        store.fork("src@1", "taken")
    store.fork("src@1", "copy")
    with pytest.raises(castore.TaskExistsError):
        store.fork("src@1", "copy")
    with pytest.raises(ForkError, match="its HEAD is at sequence 4"):
        store.fork("src@9", "other")
    with pytest.raises(castore.UsageError, match="TASK@SEQ"):
        store.fork("src@x", "other")


def test_a_fork_of_a_fork_carries_the_first_sources_outcomes(store: castore.Store) -> None:
    """Outcomes carried into a fork are carried again when it is forked."""
    source(store)
    store.fork("src@4", "copy")
    with store.resume("copy", PLAN) as run:
        run.commit_step("c", 3)
    store.fork("copy@1", "copy2")
    with store.resume("copy2", PLAN) as run:
        assert run.finished
        assert ({"big": "x" * 50}, "rcpt-1", 3) == (
            run.result("a"),
            run.receipt("pay"),
            run.result("c"),
        )


def test_a_damaged_outcomes_tree_stops_the_forks_resume(store: castore.Store) -> None:
    """The tree is read by id, hash-checked: one flipped bit and resume refuses the fork."""
    source(store)
    forked = store.fork("src@4", "copy")
    rewrite(Path(store.objects.path(forked.outcomes)), lambda data: flip_bit(data, -3))
    with pytest.raises(ChainError, match="outcomes tree"):
        store.resume("copy", PLAN)


def test_cli_fork_json(store: castore.Store, capsys: pytest.CaptureFixture[str]) -> None:
    """`castore fork TASK@SEQ NEW --json` prints the new task's seq 0 and its tree."""
    source(store)
    code, out, err = cli(capsys, "--store", str(store.root), "fork", "src@1", "copy", "--json")
    assert (0, "") == (code, err)
    row = json.loads(out)
    head_id = store.history("copy")[0][0]
    assert {"task": "copy", "source": "src", "seq": 1, "snapshot": head_id} == {
        k: row[k] for k in ("task", "source", "seq", "snapshot")
    }
    code, _, err = cli(capsys, "--store", str(store.root), "fork", "src@3", "copy")
    assert 2 == code
    assert "task 'copy' already exists" in err


def test_a_snapshot_without_fork_keeps_its_v1_bytes_and_fast_path(store: castore.Store) -> None:
    """`fork` is left out when None: a plain snapshot's body has no such key and still
    decodes on the fast path; a fork's seq 0 has it and decodes to the same record."""
    source(store)
    forked = store.fork("src@1", "copy")
    for object_id, has_fork in ((store.history("src")[0][0], False), (forked.snapshot, True)):
        _, body = castore.format.codec.unframe(store.objects.read(object_id))
        assert has_fork == (b'"fork"' in body)
        fast = decode_canonical(body, Snapshot)
        assert fast is not None
        assert (
            castore.format.codec.from_builtins(castore.format.codec.decode_value(body), Snapshot)
            == fast
        )
