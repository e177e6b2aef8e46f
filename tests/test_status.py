"""`castore status` reads HEAD alone; `status --verify` (and fsck, and resume) check the chain.

Reads are counted by wrapping ObjectStore.read and TaskSlots.read, never timed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import cli, flip_bit, rewrite

import castore
from castore.chain.objects import ObjectStore
from castore.chain.refs import TaskSlots
from castore.chain.verify import extend_head, verified_head
from castore.errors import ChainError

PLAN = castore.Plan.build("plain", *(f"s{i}" for i in range(8)))
TASK = "long-1"


def make_task(store: castore.Store, task: str = TASK, steps: int = 6) -> list[str]:
    """A task with `steps` committed steps; its snapshot ids, oldest first."""
    with store.open_task(task, PLAN) as run:
        for step in run.pending():
            run.commit_step(step, {"step": step, "task": task})
            if run.head.seq == steps:
                break
    return [snapshot_id for snapshot_id, _ in reversed(store.history(task))]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every object id ObjectStore.read is asked for and every slot TaskSlots.read reads
    (as 'slot N'), in order."""
    seen: list[str] = []
    object_read, slot_read = ObjectStore.read, TaskSlots.read

    def read_object(self: ObjectStore, object_id: str) -> bytes:
        seen.append(object_id)
        return object_read(self, object_id)

    def read_slot(self: TaskSlots, seq: int) -> bytes:
        seen.append(f"slot {seq}")
        return slot_read(self, seq)

    monkeypatch.setattr(ObjectStore, "read", read_object)
    monkeypatch.setattr(TaskSlots, "read", read_slot)
    return seen


def test_plain_status_reads_the_head_slot_only(store: castore.Store, reads: list[str]) -> None:
    """status of a 7-snapshot chain reads slot 6, nothing below: the slot is a name of HEAD's
    object and its bytes are HEAD's id, so reading the object again would add nothing."""
    ids = make_task(store)
    reads.clear()
    status = store.status(TASK)
    assert (6, ids[-1], None) == (status.seq, status.head, status.error)
    assert ["slot 6"] == reads


def test_plain_status_trusts_the_chain_below_head_and_verify_does_not(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """With slot 0's object damaged, plain status still reports HEAD (exit 0), while
    status --verify reports the task broken (exit 3), naming the damaged snapshot."""
    ids = make_task(store)
    rewrite(Path(store.objects.path(ids[0])), flip_bit)
    plain = store.status(TASK)
    assert (6, ids[-1], "s6", None) == (plain.seq, plain.head, plain.step, plain.error)
    checked = store.status(TASK, verify=True)
    assert checked.error is not None
    assert ids[0] in checked.error
    assert (0, "") == cli(capsys, "--store", store.root, "status")[::2]
    code, out, _ = cli(capsys, "--store", store.root, "status", "--verify")
    assert (3, True) == (code, f"{TASK}  BROKEN: " in out)


def _truncate(path: Path) -> None:
    rewrite(path, lambda data: data[: len(data) // 2])


def _flip(path: Path) -> None:
    rewrite(path, flip_bit)


def _plain_file(path: Path) -> None:
    """The slot replaced by a file of its own bytes that is no published object."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data + b" ")


@pytest.mark.parametrize(
    "damage", [_flip, _truncate, _plain_file], ids=["bit-flip", "truncated", "not-an-object"]
)
def test_a_damaged_head_is_reported_broken_by_plain_status(
    store: castore.Store, capsys: pytest.CaptureFixture[str], damage: Callable[[Path], None]
) -> None:
    """A HEAD slot whose bytes are not the published object they hash to makes plain status
    report the task broken, pointing at fsck, and the CLI exit 3."""
    make_task(store)
    damage(Path(store.layout.slot_path(TASK, 6)))
    status = store.status(TASK)
    assert (None, "fsck") == (status.seq, status.next_action)
    assert "castore fsck" in str(status.error)
    code, out, _ = cli(capsys, "--store", store.root, "status")
    assert (3, True) == (code, f"{TASK}  BROKEN: " in out)


def test_a_head_from_another_task_or_sequence_is_reported_broken(store: castore.Store) -> None:
    """A HEAD slot hard-linked to another task's snapshot, or to this task's snapshot of
    another sequence (each a valid published object), is reported broken, naming why."""
    ids = make_task(store)
    other = make_task(store, "other-1")
    head = store.layout.slot_path(TASK, 6)
    os.unlink(head)
    os.link(store.objects.path(other[6]), head)
    assert "belongs to task 'other-1'" in str(store.status(TASK).error)
    os.unlink(head)
    os.link(store.objects.path(ids[5]), head)
    assert "has sequence 5, expected 6" in str(store.status(TASK).error)


def test_extending_a_verified_head_agrees_with_the_full_walk_across_an_override(
    store: castore.Store, reads: list[str]
) -> None:
    """extend_head after commits and a plan override gives the HEAD the full walk gives,
    reading the new snapshots and the new plan, and nothing older than the remembered HEAD."""
    ids = make_task(store, steps=3)
    slots = store._slots(TASK)
    known = verified_head(store.verify(TASK))
    renamed = castore.Plan.build("plain", *(f"s{i}" for i in range(4)), "t4", "t5")
    override_id = store.override(TASK, who="ops", why="steps renamed", plan=renamed)
    reads.clear()
    extended = extend_head(store.objects, slots, known)
    extension_reads = list(reads)
    assert verified_head(store.verify(TASK)) == extended
    assert (override_id, castore.plan_id(renamed)) == (extended.head_id, extended.head.plan)
    assert set() == set(ids[:3]) & set(extension_reads)
    assert castore.plan_id(renamed) in extension_reads


def test_a_foreign_new_slot_makes_the_extension_defer_to_the_full_walk(
    store: castore.Store,
) -> None:
    """A slot after the remembered HEAD that holds another task's snapshot is not accepted:
    the full walk decides, and raises ChainError naming the other task."""
    make_task(store, steps=3)
    other = make_task(store, "other-1", steps=4)
    known = verified_head(store.verify(TASK))
    os.link(store.objects.path(other[4]), store.layout.slot_path(TASK, 4))
    with pytest.raises(ChainError, match="other-1"):
        extend_head(store.objects, store._slots(TASK), known)


def test_status_to_json_is_text_and_to_dict_its_fields(store: castore.Store) -> None:
    """`TaskStatus.to_json()` is one line of JSON text, `to_dict()` the dict it encodes."""
    make_task(store, steps=2)
    status = store.status(TASK)
    data = status.to_dict()
    assert (TASK, 2, "s2") == (data["task"], data["seq"], data["step"])
    text = status.to_json()
    assert (str, data, 0) == (type(text), json.loads(text), text.count("\n"))
