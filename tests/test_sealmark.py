"""The sealed mark: HEAD lookup above it, pruning below it, and the post-link check that keeps
the commit point once pruned slot names are free again (docs/FORMAT.md §9.5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_stopped

import castore
from castore.chain.refs import TaskSlots
from castore.chain.sealmark import Mark
from castore.cli.history import read_slots
from castore.errors import ChainError, ConflictError
from castore.format.layout import LEGACY_MARK_NAME, slot_name
from castore.medium import posix

TASK = "long"
FAKE_PACK = "ab" * 32  # the mark is only read here; no pack is verified
STEPS = 60
PLAN = castore.Plan.build("p", *[f"s{i}" for i in range(STEPS)])


def store_with(tmp_path: Path, commits: int) -> castore.Store:
    store = castore.Store.init(tmp_path / "s")
    with store.start(TASK, PLAN) as run:
        for _ in range(commits):
            run.commit_step(run.next_step, {"n": run.head.seq})
    return store


def slots_of(store: castore.Store) -> TaskSlots:
    return TaskSlots(store.medium, store.objects, TASK)


def mark_and_prune(store: castore.Store, through: int) -> int:
    slots = slots_of(store)
    slots.marks.advance(Mark(FAKE_PACK, through))
    return slots.prune(through)


def test_mark_round_trips_in_canonical_form(tmp_path: Path) -> None:
    """A written mark reads back as itself, as one canonical JSON line."""
    store = store_with(tmp_path, 3)
    slots = slots_of(store)
    slots.marks.advance(Mark(FAKE_PACK, 1))
    assert Mark(FAKE_PACK, 1) == slots.mark()
    raw = Path(slots.marks.path(0)).read_bytes()
    assert b'{"pack":"' + FAKE_PACK.encode() + b'","through":1}\n' == raw


@pytest.fixture(params=["generation", "legacy"])
def mark_file(request: pytest.FixtureRequest) -> str:
    """Where a mark is read from: its first generation, or the file stores written before
    format 2's revision hold (FORMAT.md 9.7)."""
    return str(request.param)


def mark_path(store: castore.Store, where: str) -> Path:
    """The path of a task's first mark generation (its directory made) or legacy mark."""
    if where == "legacy":
        return Path(store.layout.task_dir(TASK), LEGACY_MARK_NAME)
    directory = Path(store.layout.marks_dir(TASK))
    directory.mkdir(exist_ok=True)
    return directory / slot_name(0)


@pytest.fixture(params=["listing", "lookup"])
def head_method(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """HEAD found by one listing of the chain directory, or by the lstat lookup (FORMAT.md
    9.4): the chain directory's size chooses, so each test runs with both forced."""
    monkeypatch.setattr(posix, "LIST_BELOW", 1 << 40 if request.param == "listing" else -1)
    return str(request.param)


def test_both_head_methods_agree_on_every_chain_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search in a listing and by lstat give the same HEAD at every length from none to
    37, with a stray file and a temp name beside the slots, with slots pruned below a mark,
    and with a gap below HEAD (a damaged chain: one answer whichever way it is searched)."""
    store = castore.Store.init(tmp_path / "s")
    slots = slots_of(store)
    found: dict[str, list[int | None]] = {"listing": [], "lookup": []}

    def both() -> None:
        for method, limit in (("listing", 1 << 40), ("lookup", -1)):
            monkeypatch.setattr(posix, "LIST_BELOW", limit)
            found[method].append(slots.head_seq())

    both()
    with store.start(TASK, PLAN) as run:
        Path(slots.directory, ".tmp-stray").write_bytes(b"x")
        Path(slots.directory, "zzzz").write_bytes(b"x")
        both()
        for _ in range(36):
            run.commit_step(run.next_step, {"n": run.head.seq})
            both()
    mark_and_prune(store, 20)
    both()
    os.unlink(slots.path(33))
    both()
    assert found["listing"] == found["lookup"]
    assert [None, *range(37), 36, 32] == found["lookup"]


def test_a_small_chain_directory_is_listed_and_a_large_one_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under posix.LIST_BELOW bytes HEAD costs one listing and no lstat of a slot; above it,
    O(log n) lstat calls and no listing."""
    store = store_with(tmp_path, 40)
    slots = slots_of(store)
    probes: list[int] = []
    listings: list[str] = []
    exists, list_names = TaskSlots.exists, posix.fsread.list_names

    def counted_exists(self: TaskSlots, seq: int) -> bool:
        probes.append(seq)
        return exists(self, seq)

    def counted_list(directory: str) -> list[str]:
        listings.append(directory)
        return list_names(directory)

    monkeypatch.setattr(TaskSlots, "exists", counted_exists)
    monkeypatch.setattr(posix.fsread, "list_names", counted_list)
    assert os.lstat(slots.directory).st_size <= posix.LIST_BELOW
    assert (40, [], [slots.directory]) == (slots.head_seq(), probes, listings)
    listings.clear()
    monkeypatch.setattr(posix, "LIST_BELOW", os.lstat(slots.directory).st_size - 1)
    assert (40, []) == (slots.head_seq(), listings)
    assert 5 < len(probes) <= 14


@pytest.mark.usefixtures("head_method")
def test_head_lookup_starts_above_the_mark_after_pruning(tmp_path: Path) -> None:
    """Pruned slots below the mark leave HEAD where it was, and HEAD alone still verifies."""
    store = store_with(tmp_path, 40)
    assert 11 == mark_and_prune(store, 10)
    slots = slots_of(store)
    assert [] == [seq for seq in slots.present() if seq <= 10]
    assert 40 == slots.head_seq()
    assert slots.started()
    assert [TASK] == store.tasks()
    status = store.status(TASK)
    assert (40, None) == (status.seq, status.error)
    assert 40 == castore.chain.verify.verify_head(slots).head.seq


@pytest.mark.parametrize("marked_before", [None, 10])
def test_a_reader_whose_floor_is_pruned_during_its_search_finds_head_above_the_new_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marked_before: int | None
) -> None:
    """A sealer marks and prunes between a reader's mark read and its search (the named
    point: the reader's listing of the chain directory). The reader searches again above the
    mark it reads then; before, it called the task absent (no mark) or broken (an older one)."""
    store = store_with(tmp_path, 40)
    if marked_before is not None:
        mark_and_prune(store, marked_before)
    listing = type(store.medium).names_if_small
    interleaved: list[int] = []

    def sealer_runs_first(medium: posix.PosixMedium, key: str) -> list[str] | None:
        if not interleaved:
            interleaved.append(mark_and_prune(store, 20))
        return listing(medium, key)

    monkeypatch.setattr(type(store.medium), "names_if_small", sealer_runs_first)
    status = store.status(TASK)
    assert (40, None) == (status.seq, status.error)
    assert [21 if marked_before is None else 10] == interleaved  # slots it pruned: real ones
    assert 40 == slots_of(store).head_seq()


def test_pruning_removes_the_snapshot_objects_too(tmp_path: Path) -> None:
    """A pruned slot's snapshot object goes with it: a sealed task costs no inode per step."""
    store = store_with(tmp_path, 12)
    slots = slots_of(store)
    ids = [castore.format.digest.hash_bytes(slots.read(seq)) for seq in range(6)]
    mark_and_prune(store, 5)
    assert [False] * 6 == [store.objects.exists(object_id) for object_id in ids]
    assert store.objects.exists(castore.format.digest.hash_bytes(slots.read(6)))


def test_pruning_refuses_a_range_the_mark_does_not_cover(tmp_path: Path) -> None:
    """prune() without a mark that covers the range would free names a stale writer could take."""
    store = store_with(tmp_path, 5)
    with pytest.raises(ValueError, match="not marked sealed"):
        slots_of(store).prune(2)
    assert [0, 1, 2, 3, 4, 5] == slots_of(store).present()


def test_a_commit_that_links_into_a_pruned_range_loses(tmp_path: Path) -> None:
    """A stale writer's link into a freed slot name succeeds, but the post-link mark check
    takes the slot back and raises ConflictError: no acknowledged commit outside the chain."""
    store = store_with(tmp_path, 20)
    slots = slots_of(store)
    stale_parent = castore.format.digest.hash_bytes(slots.read(6))
    stale_bytes = slots.read(7)  # any snapshot bytes: the link itself is what is judged
    mark_and_prune(store, 9)
    with pytest.raises(ConflictError, match="sequence 7"):
        slots.commit(stale_bytes, 7, stale_parent)
    assert not slots.exists(7)
    assert 20 == slots.head_seq()


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b'{"pack":null,"through":3}', id="no-newline"),
        pytest.param(b'{"through":3,"pack":null}\n', id="not-canonical"),
        pytest.param(b'{"pack":null,"through":-1}\n', id="negative"),
        pytest.param(b'{"pack":null,"through":true}\n', id="bool"),
        pytest.param(b'{"pack":"xyz","through":3}\n', id="bad-pack-id"),
        pytest.param(b'{"pack":null}\n', id="missing-field"),
        pytest.param(b"x" * 300, id="too-large"),
    ],
)
@pytest.mark.usefixtures("head_method")
def test_a_damaged_mark_fails_closed(tmp_path: Path, content: bytes, mark_file: str) -> None:
    """A mark castore did not write (a generation, or the legacy file) is a broken chain,
    never "no mark": that would hide it."""
    store = store_with(tmp_path, 3)
    mark_path(store, mark_file).write_bytes(content)
    with pytest.raises(ChainError, match=r"sealed mark .* is damaged"):
        slots_of(store).head_seq()


@pytest.mark.usefixtures("head_method")
def test_a_symlinked_mark_is_refused(tmp_path: Path, mark_file: str) -> None:
    """The mark is never read through a symlink."""
    store = store_with(tmp_path, 3)
    target = tmp_path / "elsewhere"
    target.write_bytes(Mark(None, 1).encode())
    os.symlink(target, mark_path(store, mark_file))
    with pytest.raises(ChainError, match="symlink"):
        slots_of(store).head_seq()


@pytest.mark.usefixtures("head_method")
def test_a_mark_above_every_slot_is_a_broken_chain(tmp_path: Path) -> None:
    """HEAD is always above the mark: a mark at or beyond HEAD names damage."""
    store = store_with(tmp_path, 3)
    slots_of(store).marks.advance(Mark(FAKE_PACK, 3))
    with pytest.raises(ChainError, match=r"slot 4 .* is missing"):
        slots_of(store).head_seq()


# A writer that resumes the task, prints its HEAD, and commits one step: the test pauses it
# just before its link, advances, marks and prunes the task past it, then lets it go on.
STALE_WRITER = """
import sys
import castore
root, task, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = castore.Plan.build("p", *[f"s{i}" for i in range(steps)])
run = castore.Store.open(root).resume(task, plan, lock_timeout=None)
print("head", run.head.seq, flush=True)
try:
    run.commit_step(run.next_step, "stale")
except castore.ConflictError as exc:
    print("lost", exc.seq, flush=True)
else:
    print("acknowledged", run.head.seq, flush=True)
"""


def test_a_real_stale_writer_paused_before_its_link_loses_after_a_prune(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """SIGSTOP a real writer at commit.before_link, move the task on, mark and prune past the
    slot it will link, SIGCONT it: it is told it lost, and its slot is not left in the chain."""
    store = store_with(tmp_path, 5)
    env = {**os.environ, "CASTORE_PAUSE_AT": "commit.before_link"}
    proc = subprocess.Popen(
        [sys.executable, "-c", STALE_WRITER, store.root, TASK, str(STEPS)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    children.append(proc)
    assert proc.stdout is not None
    assert "head 5" == proc.stdout.readline().strip()
    wait_stopped(proc)
    with store.resume(TASK, PLAN, lock_timeout=None) as run:
        for _ in range(10):
            run.commit_step(run.next_step, "winner")
    mark_and_prune(store, 8)
    os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert "lost 6" == out.strip()
    slots = slots_of(store)
    assert not slots.exists(6)
    assert 15 == slots.head_seq()


def test_slot_by_slot_reading_starts_above_the_mark(tmp_path: Path) -> None:
    """`castore log`'s slot-by-slot view shows the kept slots, not pruned ones as missing."""
    store = store_with(tmp_path, 12)
    mark_and_prune(store, 5)
    shown = read_slots(store, TASK)
    assert list(range(12, 5, -1)) == [slot.seq for slot in shown]
    assert [None] * 7 == [slot.problem for slot in shown]


def test_the_legacy_mark_is_a_floor_never_written(tmp_path: Path) -> None:
    """A store written before format 2's revision holds the single `sealed` file: it is the
    mark until a generation passes it, moving the mark to what it already says writes
    nothing, and a generation past it becomes the mark (the legacy file is left as it was)."""
    store = store_with(tmp_path, 6)
    legacy = Path(store.layout.task_dir(TASK), LEGACY_MARK_NAME)
    legacy.write_bytes(Mark(FAKE_PACK, 2).encode())
    slots = slots_of(store)
    assert Mark(FAKE_PACK, 2) == slots.mark()
    assert Mark(FAKE_PACK, 2) == slots.marks.advance(Mark(FAKE_PACK, 1))
    assert not Path(store.layout.marks_dir(TASK)).exists()
    assert Mark(FAKE_PACK, 4) == slots.marks.advance(Mark(FAKE_PACK, 4))
    assert Mark(FAKE_PACK, 4) == slots_of(store).mark()
    assert Mark(FAKE_PACK, 2).encode() == legacy.read_bytes()


def test_a_stale_writer_of_the_mark_never_moves_it_back(tmp_path: Path) -> None:
    """Two writers of one task's mark: the one that read it first and wrote last finds its
    number taken, reads the newer mark and writes nothing (the generations only grow)."""
    store = store_with(tmp_path, 8)
    stale, fresh = slots_of(store).marks, slots_of(store).marks
    assert stale.current() is None  # read before the other moved it
    assert Mark(FAKE_PACK, 5) == fresh.advance(Mark(FAKE_PACK, 5))
    assert Mark(FAKE_PACK, 5) == stale.advance(Mark(FAKE_PACK, 3))
    assert [slot_name(0)] == sorted(os.listdir(store.layout.marks_dir(TASK)))
    assert Mark(FAKE_PACK, 7) == stale.advance(Mark(FAKE_PACK, 7))
    assert [slot_name(0), slot_name(1)] == sorted(os.listdir(store.layout.marks_dir(TASK)))
    assert Mark(FAKE_PACK, 7) == slots_of(store).mark()
