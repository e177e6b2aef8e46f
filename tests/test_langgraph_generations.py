"""A LangGraph thread's live generation is decided by its commit points alone: a reader never
writes, and a rewrite (prune, delete_for_runs) that is cut short or beaten never becomes live,
neither then nor after a later delete_thread, prune or put. Stores of the old rule still read."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint

from castore import Store
from castore.errors import ConflictError
from castore.langgraph import CastoreSaver, generations, names
from castore.langgraph.names import task_base
from tests.helpers import spawn_child, tree_snapshot

BASE = task_base("p", "")


def config(thread: str = "p") -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def put(saver: CastoreSaver, n: int, parent: Any = None, thread: str = "p") -> Any:
    """Checkpoint `n` of `thread` (channel n = `n`); checkpoint 0 is of run r0, the rest r1."""
    checkpoint = empty_checkpoint()
    versions = {"n": saver.get_next_version(None, None)}
    checkpoint["channel_values"] = {"n": n}
    checkpoint["channel_versions"] = versions
    metadata = {"source": "loop", "step": n, "parents": {}, "run_id": "r0" if n == 0 else "r1"}
    return saver.put(parent or config(thread), checkpoint, metadata, versions)  # type: ignore[arg-type]


def build(root: Path, thread: str = "p") -> None:
    """Checkpoints 0, 1, 2 of `thread`, and a pending write (99) of checkpoint 2."""
    with CastoreSaver(root) as saver:
        parent = None
        for n in range(3):
            parent = put(saver, n, parent, thread)
        saver.put_writes(parent, [("n", 99)], "task")


def values(saver: CastoreSaver, thread: str = "p") -> list[int]:
    """The thread's checkpoints, newest first, by their value of n."""
    return [t.checkpoint["channel_values"]["n"] for t in saver.list(config(thread))]


def latest_writes(saver: CastoreSaver) -> list[Any]:
    found = saver.get_tuple(config())
    return found.pending_writes if found is not None else []


def live_tasks(root: Path, base: str = BASE) -> list[str]:
    """The tasks of a namespace that are not forgotten: its live generation, and any copy
    that was never made live (nor forgotten)."""
    store = Store.open(root)
    return [
        task
        for task in store.tasks()
        if names.base_of(task) == base and not store.status(task).forgotten
    ]


def live_generation(root: Path, base: str = BASE) -> str:
    live = generations.find_live(Store.open(root), base)
    if live.log is not None:
        live.log.close()
    return live.task


REWRITES: dict[str, tuple[Callable[[CastoreSaver], None], list[int]]] = {
    "prune": (lambda saver: saver.prune(["p"]), [2]),
    "delete_for_runs": (lambda saver: saver.delete_for_runs(["r0"]), [2, 1]),
}


class Paused:
    """Holds a saver at the `nth` call of one of its store's methods until `go` is set
    (`forget` 1: a rewrite's switch, the commit after its copy; `put_tree` 1: a rewrite about
    to commit its intent, 3: its copy holding its meta event only); `reached` is set there."""

    def __init__(
        self,
        saver: CastoreSaver,
        monkeypatch: pytest.MonkeyPatch,
        method: str = "forget",
        nth: int = 1,
    ) -> None:
        self.reached, self.go = threading.Event(), threading.Event()
        original = getattr(saver.store, method)
        calls = []

        def paused(*args: Any, **kwargs: Any) -> Any:
            calls.append(method)
            if len(calls) == nth:
                self.reached.set()
                if not self.go.wait(60):
                    raise AssertionError("the test never let the saver go on")
            return original(*args, **kwargs)

        monkeypatch.setattr(saver.store, method, paused)


@pytest.mark.parametrize("rewrite", sorted(REWRITES))
def test_a_reader_during_a_rewrite_commits_nothing_and_then_sees_what_it_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rewrite: str
) -> None:
    """A second saver's get_tuple and list while a rewrite waits between copy and switch
    change no file of the store; after the switch every kept checkpoint (and write) reads."""
    build(tmp_path)
    do, kept = REWRITES[rewrite]
    with CastoreSaver(tmp_path) as rewriter, CastoreSaver(tmp_path) as reader:
        paused = Paused(rewriter, monkeypatch)
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(do, rewriter)
            assert paused.reached.wait(60)
            before = tree_snapshot(tmp_path)
            during = (values(reader), latest_writes(reader))
            after = tree_snapshot(tmp_path)
            paused.go.set()
            done.result(timeout=60)
        settled = tree_snapshot(tmp_path)
        followed = (values(reader), latest_writes(reader))
        assert settled == tree_snapshot(tmp_path)
    with CastoreSaver(tmp_path) as fresh:
        fresh_view = (values(fresh), latest_writes(fresh))
    assert before == after
    assert ([2, 1, 0], [("task", "n", 99)]) == during
    assert (kept, [("task", "n", 99)]) == followed
    assert (kept, [("task", "n", 99)]) == fresh_view
    assert settled == tree_snapshot(tmp_path)
    assert [live_generation(tmp_path)] == live_tasks(tmp_path)


@pytest.mark.parametrize(("method", "nth"), [("forget", 1), ("put_tree", 3)])
def test_a_delete_during_a_paused_prune_wins_and_the_copy_never_becomes_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, nth: int
) -> None:
    """delete_thread (by a saver that read the thread before the prune began) committed while
    the prune waits at its switch or in the middle of its copy: the prune gets ConflictError
    and the thread stays deleted, also after a later put and prune."""
    build(tmp_path)
    with CastoreSaver(tmp_path) as pruner, CastoreSaver(tmp_path) as deleter:
        assert [2, 1, 0] == values(deleter)
        paused = Paused(pruner, monkeypatch, method, nth)
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(pruner.prune, ["p"])
            assert paused.reached.wait(60)
            deleter.delete_thread("p")
            paused.go.set()
            with pytest.raises(ConflictError):
                done.result(timeout=60)
        deleted = values(pruner)
    with CastoreSaver(tmp_path) as fresh:
        after_delete = values(fresh)
        put(fresh, 7)
        after_put = values(fresh)
        fresh.prune(["p"])
        after_prune = values(fresh)
    assert ([], [], [7], [7]) == (deleted, after_delete, after_put, after_prune)
    assert [live_generation(tmp_path)] == live_tasks(tmp_path)


def test_a_prune_that_read_the_thread_before_another_prune_committed_loses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two prunes that read the same thread: the second to commit its intent gets
    ConflictError before it copies anything; the thread holds the latest checkpoint and its
    writes, in one live task."""
    build(tmp_path)
    with CastoreSaver(tmp_path) as first, CastoreSaver(tmp_path) as second:
        paused = Paused(second, monkeypatch, "put_tree")
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(second.prune, ["p"])
            assert paused.reached.wait(60)
            first.prune(["p"])
            tasks = live_tasks(tmp_path)
            paused.go.set()
            with pytest.raises(ConflictError):
                done.result(timeout=60)
        found = (values(second), latest_writes(second))
    assert tasks == live_tasks(tmp_path)
    assert ([2], [("task", "n", 99)]) == found
    assert [live_generation(tmp_path)] == live_tasks(tmp_path)


def test_a_prune_while_another_waits_at_its_switch_wins_and_the_other_copy_is_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second prune, reading the thread while the first waits at its switch, commits
    after the first's intent and switches; the first gets ConflictError; the thread holds the
    latest checkpoint and its writes, and the first's copy is forgotten, never live."""
    build(tmp_path)
    with CastoreSaver(tmp_path) as first, CastoreSaver(tmp_path) as second:
        paused = Paused(first, monkeypatch)
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(first.prune, ["p"])
            assert paused.reached.wait(60)
            copies = [t for t in live_tasks(tmp_path) if names.is_successor(BASE, t)]
            second.prune(["p"])
            paused.go.set()
            with pytest.raises(ConflictError):
                done.result(timeout=60)
    with CastoreSaver(tmp_path) as fresh:
        found = (values(fresh), latest_writes(fresh))
    assert ([2], [("task", "n", 99)]) == found
    assert 1 == len(copies)
    assert copies[0] != live_generation(tmp_path)
    assert [live_generation(tmp_path)] == live_tasks(tmp_path)


def test_a_put_while_a_prune_waits_at_its_switch_wins_and_a_reader_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A saver that reads the thread while a prune waits at its switch (changing no file)
    and puts a checkpoint: the put lands, the prune gets ConflictError, and a third saver
    reading the thread then sees every checkpoint and changes no file."""
    build(tmp_path)
    with CastoreSaver(tmp_path) as pruner, CastoreSaver(tmp_path) as writer:
        paused = Paused(pruner, monkeypatch)
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(pruner.prune, ["p"])
            assert paused.reached.wait(60)
            before_read = tree_snapshot(tmp_path)
            latest = writer.get_tuple(config())
            after_read = tree_snapshot(tmp_path)
            put(writer, 3, latest.config)
            paused.go.set()
            with pytest.raises(ConflictError):
                done.result(timeout=60)
    before = tree_snapshot(tmp_path)
    with CastoreSaver(tmp_path) as reader:
        found = values(reader)
    after = tree_snapshot(tmp_path)
    assert before_read == after_read
    assert [3, 2, 1, 0] == found
    assert before == after
    assert [names.generation(BASE, 0)] == live_tasks(tmp_path)


def test_a_put_by_a_saver_that_read_before_a_prune_is_refused_then_lands_after_it(
    tmp_path: Path,
) -> None:
    """A saver that read the thread before another pruned it gets ConflictError on its put;
    read again, it puts on the pruned thread."""
    build(tmp_path)
    with CastoreSaver(tmp_path) as writer, CastoreSaver(tmp_path) as pruner:
        stale = writer.get_tuple(config())
        pruner.prune(["p"])
        with pytest.raises(ConflictError):
            put(writer, 3, stale.config)
        fresh = writer.get_tuple(config())
        put(writer, 3, fresh.config)
        found = values(pruner)
    assert 2 == fresh.checkpoint["channel_values"]["n"]
    assert [3, 2] == found


def test_a_prune_that_fails_mid_copy_leaves_the_saver_writing_to_the_live_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError in the middle of a prune's copy reaches the caller; the same saver's next
    put lands in the live generation and reads back from a new saver."""
    build(tmp_path)
    with CastoreSaver(tmp_path) as saver:
        calls = []
        put_tree = saver.store.put_tree

        def failing(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == 3:
                raise OSError(28, "No space left on device")
            return put_tree(*args, **kwargs)

        monkeypatch.setattr(saver.store, "put_tree", failing)
        with pytest.raises(OSError, match="No space"):
            saver.prune(["p"])
        monkeypatch.undo()
        put(saver, 3, saver.get_tuple(config()).config)
    with CastoreSaver(tmp_path) as fresh:
        found = values(fresh)
    assert [3, 2, 1, 0] == found


def test_a_prune_whose_intent_the_log_seals_right_after_switches_to_its_copy(
    tmp_path: Path,
) -> None:
    """A prune whose intent is the log's 64th commit (the log then commits a seal): the
    switch names the seal snapshot, the copy becomes live, and nothing else is left live."""
    with CastoreSaver(tmp_path) as saver:
        parent = None
        for n in range(62):  # slot 0, the meta event and 62 puts: seq 0 .. 63
            parent = put(saver, n, parent)
        saver.prune(["p"])
        found = values(saver)
    assert [61] == found
    assert [live_generation(tmp_path)] == live_tasks(tmp_path)
    assert names.is_successor(BASE, live_generation(tmp_path))


PRUNER = """
import sys
from castore.langgraph import CastoreSaver
with CastoreSaver(sys.argv[1]) as saver:
    saver.prune(["p"])
print("pruned", flush=True)
"""

# The prune of `build`'s thread commits: 1 its intent, 2 the copy's slot 0, 3 its meta event,
# 4 the kept checkpoint, 5 its write, 6 the switch.
KILLS = [
    ("lgprune.intent", False),
    ("commit.linked:2", False),
    ("lgprune.copy_started", False),
    ("lgprune.copied", False),
    ("commit.before_link:6", False),
    ("commit.linked:6", True),
    ("lgprune.switched", True),
]
FOLLOW_UPS = ("delete_thread", "prune", "put")


def copy_store(source: Path, target: Path) -> None:
    """A copy of a store that keeps its hard links (a chain slot is a link to its snapshot)."""
    seen: dict[tuple[int, int], str] = {}
    for directory, _, files in os.walk(source):
        into = target / Path(directory).relative_to(source)
        into.mkdir(parents=True)
        for name in files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            key = (info.st_dev, info.st_ino)
            if key in seen:
                os.link(seen[key], into / name)
            else:
                shutil.copy2(path, into / name)
                seen[key] = str(into / name)


@pytest.mark.parametrize(("point", "pruned"), KILLS)
def test_a_prune_killed_at_each_step_leaves_the_thread_as_before_or_pruned(
    tmp_path: Path, children: list[subprocess.Popen[str]], point: str, pruned: bool
) -> None:
    """A pruner SIGKILLed at each step of its rewrite: the thread reads whole before the
    switch and pruned after it, reading writes nothing, and a later delete_thread, prune or
    put never makes the abandoned copy live (delete and prune forget it)."""
    build(tmp_path / "store")
    child = spawn_child(children, PRUNER, str(tmp_path / "store"), crash=point)
    child.communicate(timeout=60)
    assert -signal.SIGKILL == child.returncode
    copies = [t for t in live_tasks(tmp_path / "store") if names.is_successor(BASE, t)]
    before = tree_snapshot(tmp_path / "store")
    with CastoreSaver(tmp_path / "store") as reader:
        found = (values(reader), latest_writes(reader))
    assert before == tree_snapshot(tmp_path / "store")
    assert ([2] if pruned else [2, 1, 0], [("task", "n", 99)]) == found
    seen = {}
    for follow_up in FOLLOW_UPS:
        root = tmp_path / follow_up
        copy_store(tmp_path / "store", root)
        with CastoreSaver(root) as saver:
            if follow_up == "delete_thread":
                saver.delete_thread("p")
                seen[follow_up] = values(saver)
                put(saver, 7)
            elif follow_up == "prune":
                saver.prune(["p"])
            else:
                put(saver, 3, saver.get_tuple(config()).config)
            seen[follow_up + " then"] = values(saver)
        with CastoreSaver(root) as fresh:
            assert seen[follow_up + " then"] == values(fresh)
        live = live_generation(root)
        # A later delete or prune forgets the abandoned copy; a put leaves it, never live.
        kept = copies if follow_up == "put" and not pruned else [live]
        assert sorted({*kept, live}) == sorted(live_tasks(root))
    assert {
        "delete_thread": [],
        "delete_thread then": [7],
        "prune then": [2],
        "put then": [3, 2] if pruned else [3, 2, 1, 0],
    } == seen


def test_the_longest_thread_and_namespace_ids_still_fit_after_a_prune(tmp_path: Path) -> None:
    """A successor's task id stays within castore's 200 bytes for the longest encoded ids."""
    thread, ns = "a" * 100, "b" * 60
    target = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
    with CastoreSaver(tmp_path) as saver:
        parent = None
        for n in range(2):
            checkpoint = empty_checkpoint()
            versions = {"n": saver.get_next_version(None, None)}
            checkpoint["channel_values"] = {"n": n}
            checkpoint["channel_versions"] = versions
            metadata = {"source": "loop", "step": n, "parents": {}}
            parent = saver.put(parent or target, checkpoint, metadata, versions)  # type: ignore[arg-type]
        saver.prune([thread])
        kept = [t.checkpoint["channel_values"]["n"] for t in saver.list(target)]
    live = live_generation(tmp_path, task_base(thread, ns))
    assert [1] == kept
    assert 199 == len(live.encode())
    assert names.is_successor(task_base(thread, ns), live)


@pytest.mark.parametrize("ns", ["", "_s", "a_", "x" * 60, "_g1", "s" + "0" * 30])
def test_base_of_finds_the_namespace_of_every_generation(ns: str) -> None:
    """The base of `_g<n>` and `_s<id>` task ids is the namespace's, whatever the ids hold."""
    base = task_base("t_s" + "a" * 30, ns)
    tasks = [names.generation(base, 0), names.generation(base, 12), names.successor(base, "f" * 64)]
    assert [base, base, base] == [names.base_of(task) for task in tasks]
    assert [0, 12, None] == [names.number_of(base, task) for task in tasks]
    assert [False, False, True] == [names.is_successor(base, task) for task in tasks]
    assert names.base_of(base + "_s" + "f" * 29) is None


def legacy_prune(root: Path, *, switch: bool = True) -> None:
    """The saver's prune before the intent rule: the latest checkpoint copied into the next
    numbered generation, then this one forgotten by `LEGACY_WHO`; `switch` False: killed
    before that forget (the copy abandoned, this generation live)."""
    with CastoreSaver(root) as saver:
        state = saver._state("p", "", fresh=True)
        old, number = state.log, names.number_of(BASE, state.task)
        assert old is not None
        assert number is not None
        head = old.head_id
        events = state._full_events(state.saved[max(state.saved)])
        state._copy(names.generation(BASE, number + 1), events)
        if switch:
            why = "LangGraph prune or delete_for_runs"
            old.forget(who=generations.LEGACY_WHO, why=why, only_if_head=head)
        else:
            old.close()


def legacy_delete_then_put(root: Path, n: int) -> None:
    """The saver's delete_thread before the intent rule (its live generation forgotten by
    `LEGACY_WHO`), then its next put, which started the next numbered generation."""
    with CastoreSaver(root) as saver:
        state = saver._state("p", "", fresh=True)
        number = names.number_of(BASE, state.task)
        assert state.log is not None
        assert number is not None
        state.log.forget(who=generations.LEGACY_WHO, why="LangGraph delete_thread")
        state.log, state.task = None, names.generation(BASE, number + 1)
        state._reset()
        put(saver, n)


def test_a_store_of_the_old_numbered_rule_reads_as_it_did_and_goes_on(tmp_path: Path) -> None:
    """Generations `_g0`, `_g1`, `_g2` that the old saver switched and deleted read as the
    old saver read them, without a write; put, prune and delete_thread then go on from there."""
    build(tmp_path)
    legacy_prune(tmp_path)  # _g0 -> _g1: [2]
    with CastoreSaver(tmp_path) as saver:
        put(saver, 3, saver.get_tuple(config()).config)  # into _g1: [3, 2]
    legacy_delete_then_put(tmp_path, 5)  # _g1 deleted, _g2: [5]
    before = tree_snapshot(tmp_path)
    with CastoreSaver(tmp_path) as reader:
        read = values(reader)
    after = tree_snapshot(tmp_path)
    live = live_generation(tmp_path)
    with CastoreSaver(tmp_path) as saver:
        put(saver, 6, saver.get_tuple(config()).config)
        put_on = values(saver)
        saver.prune(["p"])
        pruned = values(saver)
        saver.delete_thread("p")
        deleted = values(saver)
        put(saver, 7)
        again = values(saver)
    assert before == after
    assert names.generation(BASE, 2) == live
    assert ([5], [6, 5], [6], [], [7]) == (read, put_on, pruned, deleted, again)
    assert [live_generation(tmp_path)] == live_tasks(tmp_path)


def test_an_abandoned_copy_of_the_old_rule_is_never_read_nor_made_live(tmp_path: Path) -> None:
    """A `_g1` copy the old saver abandoned (killed before its switch) beside a live `_g0`: a
    reader sees `_g0` and writes nothing; a later prune never makes `_g1` live and forgets
    it, and after a delete_thread the thread starts afresh."""
    build(tmp_path)
    legacy_prune(tmp_path, switch=False)
    before = tree_snapshot(tmp_path)
    with CastoreSaver(tmp_path) as reader:
        read = (values(reader), latest_writes(reader))
    after = tree_snapshot(tmp_path)
    with CastoreSaver(tmp_path) as saver:
        saver.prune(["p"])
        pruned = values(saver)
        pruned_in = live_generation(tmp_path)
        saver.delete_thread("p")
        put(saver, 7)
        again = values(saver)
    assert before == after
    assert ([2, 1, 0], [("task", "n", 99)]) == read
    assert ([2], [7]) == (pruned, again)
    assert names.is_successor(BASE, pruned_in)
    assert [live_generation(tmp_path)] == live_tasks(tmp_path)
