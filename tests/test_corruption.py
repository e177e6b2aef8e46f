"""Damage on disk: resume refuses, names the damaged object, and changes nothing."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import flip_bit, rewrite, tree_snapshot

import castore

PLAN = castore.Plan.build("demo", "a", "b", "c", "d", "e", "f", "g")
TASK = "invoice/42"
HEAD_SEQ = 4
MIDDLE_SEQ = 2
DEADLINE = 10.0


@pytest.fixture
def chain(store: castore.Store) -> dict[int, str]:
    """A task with HEAD at sequence 4: seq -> snapshot id."""
    with store.start(TASK, PLAN) as run:
        ids = {0: run.head_id}
        for seq, step in enumerate("abcd", start=1):
            ids[seq] = run.commit_step(step, {"step": step})
    return ids


def object_path(store: castore.Store, object_id: str) -> Path:
    return Path(store.objects.path(object_id))


def slot_path(store: castore.Store, seq: int) -> Path:
    return Path(store.layout.slot_path(TASK, seq))


def call_with_deadline(
    function: Callable[[], object], unblock: Path | None = None
) -> BaseException:
    """Run `function` in a thread; fail if it blocks past the deadline; return what it raised."""
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            function()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome["raised"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    blocked = thread.is_alive()
    if blocked and unblock is not None:
        # Free the thread blocked opening the FIFO: a writer showing up ends its open().
        with contextlib.suppress(OSError):
            os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked, f"call still blocked after {DEADLINE}s"
    assert "raised" in outcome, "the call returned instead of raising"
    return outcome["raised"]


def refuse_resume(store: castore.Store, unblock: Path | None = None) -> castore.ChainError:
    """Resume (and verify, and history) must raise ChainError and leave the store as it was."""
    before = tree_snapshot(store.root)
    for attempt in (
        lambda: store.resume(TASK, PLAN),
        lambda: store.verify(TASK),
        lambda: store.history(TASK),
        lambda: store.open_task(TASK, PLAN),
    ):
        raised = call_with_deadline(attempt, unblock)
        assert isinstance(raised, castore.ChainError), repr(raised)
    assert before == tree_snapshot(store.root)
    assert isinstance(raised, castore.ResumeRefusedError)
    assert isinstance(raised, castore.IntegrityError)
    return raised


def names(error: castore.ChainError, object_id: str) -> bool:
    """True if the error names `object_id` (as its field or in its message)."""
    return error.object_id == object_id or object_id in str(error)


# -- damaged middle snapshot objects -------------------------------------------------------------


@pytest.mark.parametrize("where", ["header", "first-body-byte", "middle", "last-byte"])
def test_a_flipped_bit_in_a_middle_snapshot_is_named(
    store: castore.Store, chain: dict[int, str], where: str
) -> None:
    """One flipped bit anywhere in a middle snapshot object: ChainError naming its id."""
    victim = chain[MIDDLE_SEQ]
    path = object_path(store, victim)
    data = path.read_bytes()
    index = {
        "header": 3,
        "first-body-byte": data.index(b"\n") + 1,
        "middle": len(data) // 2,
        "last-byte": len(data) - 1,
    }[where]
    rewrite(path, lambda raw: flip_bit(raw, index))
    error = refuse_resume(store)
    assert victim == error.object_id
    assert victim in str(error)


@pytest.mark.parametrize("keep", [0, 1, -1], ids=["to-0-bytes", "to-1-byte", "to-N-1-bytes"])
def test_a_truncated_middle_snapshot_is_named(
    store: castore.Store, chain: dict[int, str], keep: int
) -> None:
    """A middle snapshot truncated to 0, 1 or N-1 bytes: ChainError naming its id."""
    victim = chain[MIDDLE_SEQ]
    rewrite(object_path(store, victim), lambda raw: raw[:keep] if keep >= 0 else raw[:-1])
    error = refuse_resume(store)
    assert victim == error.object_id


def test_a_deleted_middle_snapshot_is_named(store: castore.Store, chain: dict[int, str]) -> None:
    """A middle snapshot deleted from objects/, its slot holding other bytes: ChainError
    naming it. (Its slot intact, it is a lost name, read from the slot: test_lost_names.py.)"""
    victim = chain[MIDDLE_SEQ]
    object_path(store, victim).unlink()
    rewrite(slot_path(store, MIDDLE_SEQ), flip_bit)
    error = refuse_resume(store)
    assert victim == error.object_id
    assert victim in str(error)


def test_slots_at_every_power_of_two_are_refused_without_counting_to_them(
    store: castore.Store, chain: dict[int, str]
) -> None:
    """Copies of HEAD at 8, 16, … 2**50: the HEAD search lands on 2**50, and resume refuses
    the gaps at once (it used to build the set of every number below HEAD, and never
    finished)."""
    for power in range(3, 51):
        os.link(slot_path(store, HEAD_SEQ), slot_path(store, 2**power))
    error = refuse_resume(store)
    assert "not contiguous" in str(error)
    assert "missing [5, 6, 7, 9, 10]..." in str(error)


def test_another_valid_object_under_a_middle_name_is_named(
    store: castore.Store, chain: dict[int, str]
) -> None:
    """A valid object's bytes under the wrong name are refused: the name is the hash."""
    victim = chain[MIDDLE_SEQ]
    other = object_path(store, chain[MIDDLE_SEQ - 1]).read_bytes()
    rewrite(object_path(store, victim), lambda _: other)
    error = refuse_resume(store)
    assert victim == error.object_id


def test_a_symlink_in_place_of_a_middle_object_is_not_followed(
    store: castore.Store, chain: dict[int, str], tmp_path: Path
) -> None:
    """A symlink to an identical copy in place of an object is refused, never followed."""
    victim = chain[MIDDLE_SEQ]
    path = object_path(store, victim)
    copy = tmp_path / "copy"
    shutil.copyfile(path, copy)
    path.unlink()
    path.symlink_to(copy)
    error = refuse_resume(store)
    assert names(error, victim)
    assert isinstance(error.__cause__, castore.UnsafeFileError)


def test_a_fifo_in_place_of_a_middle_object_does_not_block(
    store: castore.Store, chain: dict[int, str]
) -> None:
    """A FIFO in place of an object is refused at once (no blocking open or read)."""
    victim = chain[MIDDLE_SEQ]
    path = object_path(store, victim)
    path.unlink()
    os.mkfifo(path)
    error = refuse_resume(store, unblock=path)
    assert names(error, victim)


def test_a_directory_in_place_of_a_middle_object_is_named(
    store: castore.Store, chain: dict[int, str]
) -> None:
    """A directory in place of an object is refused, naming the object."""
    victim = chain[MIDDLE_SEQ]
    path = object_path(store, victim)
    path.unlink()
    path.mkdir()
    error = refuse_resume(store)
    assert names(error, victim)


def test_the_root_snapshot_damaged_is_named(store: castore.Store, chain: dict[int, str]) -> None:
    """The start snapshot (sequence 0) with a flipped bit: ChainError naming it."""
    victim = chain[0]
    rewrite(object_path(store, victim), flip_bit)
    assert victim == refuse_resume(store).object_id


# -- damaged plan object -----------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "empty", "symlink"])
def test_a_damaged_plan_object_is_named(
    store: castore.Store, chain: dict[int, str], damage: str
) -> None:
    """A corrupt, truncated, empty or missing plan object, or a symlink to a good copy of it:
    ChainError naming the plan id (the caller's plan has its digest, and still the stored
    bytes are checked)."""
    plan_id = castore.plan_id(PLAN)
    path = object_path(store, plan_id)
    if damage == "symlink":
        copy = path.with_name("copy")
        copy.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(copy)
    elif damage == "flip":
        rewrite(path, flip_bit)
    elif damage == "truncate":
        rewrite(path, lambda raw: raw[:-1])
    elif damage == "empty":
        rewrite(path, lambda _: b"")
    else:
        path.unlink()
    error = refuse_resume(store)
    assert plan_id == error.object_id
    assert plan_id in str(error)


# -- damaged HEAD ------------------------------------------------------------------------------


def test_a_symlink_as_head_slot_is_not_followed(
    store: castore.Store, chain: dict[int, str]
) -> None:
    """HEAD's slot replaced by a symlink to the valid HEAD object is refused, never followed."""
    slot = slot_path(store, HEAD_SEQ)
    slot.unlink()
    slot.symlink_to(object_path(store, chain[HEAD_SEQ]))
    error = refuse_resume(store)
    assert str(slot) == error.path or str(slot) in str(error)
    assert isinstance(error.__cause__, castore.UnsafeFileError)


def test_a_fifo_as_head_slot_does_not_block(store: castore.Store, chain: dict[int, str]) -> None:
    """HEAD's slot replaced by a FIFO is refused at once, naming the slot."""
    slot = slot_path(store, HEAD_SEQ)
    slot.unlink()
    os.mkfifo(slot)
    error = refuse_resume(store, unblock=slot)
    assert str(slot) == error.path or str(slot) in str(error)


def test_a_directory_as_head_slot_is_refused(store: castore.Store, chain: dict[int, str]) -> None:
    """HEAD's slot replaced by a directory is refused, naming the slot."""
    slot = slot_path(store, HEAD_SEQ)
    slot.unlink()
    slot.mkdir()
    error = refuse_resume(store)
    assert str(slot) == error.path or str(slot) in str(error)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_head_is_refused_and_located(
    store: castore.Store, chain: dict[int, str], damage: str
) -> None:
    """HEAD's snapshot damaged (slot and object are one inode): refused, naming its sequence."""
    path = object_path(store, chain[HEAD_SEQ])
    transform = {"flip": flip_bit, "truncate": lambda raw: raw[:-1], "empty": lambda _: b""}
    rewrite(path, transform[damage])
    error = refuse_resume(store)
    slot = str(slot_path(store, HEAD_SEQ))
    # Its bytes name no object: HEAD is judged by its frame and decoding (FORMAT.md 11.2).
    located = (f"sequence {HEAD_SEQ}", f"at slot {HEAD_SEQ}", slot)
    assert slot == error.path or any(where in str(error) for where in located)


def test_a_head_slot_that_is_a_separate_copy_still_verifies_by_content(
    store: castore.Store, chain: dict[int, str]
) -> None:
    """A slot that is a copy (not a hard link) with the right bytes still resumes at HEAD."""
    slot = slot_path(store, HEAD_SEQ)
    data = slot.read_bytes()
    slot.unlink()
    slot.write_bytes(data)
    with store.resume(TASK, PLAN) as run:
        assert (HEAD_SEQ, chain[HEAD_SEQ]) == (run.head.seq, run.head_id)


# -- damaged chain slots -----------------------------------------------------------------------


def test_a_missing_middle_slot_never_rolls_head_back(
    store: castore.Store, chain: dict[int, str]
) -> None:
    """With a middle slot deleted, resume refuses or finds the true HEAD; it never forks."""
    slot_path(store, MIDDLE_SEQ).unlink()
    try:
        run = store.resume(TASK, PLAN)
    except castore.ResumeRefusedError:
        return
    with run:
        assert HEAD_SEQ == run.head.seq, "resume went back to an older HEAD"
        acknowledged = run.commit_step(run.next_step or "", {"after": "damage"})
    assert acknowledged == store.history(TASK)[0][0]
