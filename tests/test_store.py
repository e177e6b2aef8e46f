"""The store on a real filesystem, one process: init/open, start/commit/resume, the gate."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from helpers import tree_snapshot

import castore
from castore.format.layout import encode_task_id

PLAN = castore.Plan.build("demo", "fetch", "summarize", "publish")
TASK = "invoice/42"


def long_plan(steps: int) -> castore.Plan:
    return castore.Plan.build("long", *[f"s{i}" for i in range(steps)])


def chain_dir(store: castore.Store, task_id: str) -> Path:
    return Path(store.layout.chain_dir(task_id))


def slot_count(store: castore.Store, task_id: str) -> int:
    return len(os.listdir(chain_dir(store, task_id)))


# -- init and open --------------------------------------------------------------------------------


def test_init_creates_marker_objects_and_tasks(tmp_path: Path) -> None:
    """init makes the marker, an empty objects/ (a fan-out directory is made by the first put
    of an id it holds) and tasks/; open then works."""
    root = tmp_path / "store"
    castore.Store.init(root)
    assert ["castore.json", "objects", "tasks"] == sorted(os.listdir(root))
    assert [] == os.listdir(root / "objects")
    assert [] == os.listdir(root / "tasks")
    assert {"format": "castore", "version": 2} == json.loads((root / "castore.json").read_bytes())
    assert str(root) == castore.Store.open(root).root


def test_init_accepts_an_empty_directory(tmp_path: Path) -> None:
    """init into an existing empty directory creates a store there."""
    castore.Store.init(tmp_path)
    assert (tmp_path / "castore.json").is_file()


@pytest.mark.parametrize("content", ["file", "store", "symlink"])
def test_init_refuses_a_non_empty_directory_or_other_things(tmp_path: Path, content: str) -> None:
    """init raises StoreExistsError for a non-empty dir, an existing store, a file or a link."""
    root = tmp_path / "root"
    root.mkdir()
    if content == "file":
        (root / "notes.txt").write_text("keep me")
    elif content == "store":
        castore.Store.init(root)
    else:
        root.rmdir()
        other = tmp_path / "elsewhere"
        other.mkdir()
        root.symlink_to(other)
    before = tree_snapshot(tmp_path)
    with pytest.raises(castore.StoreExistsError):
        castore.Store.init(root)
    assert before == tree_snapshot(tmp_path)


def test_init_refuses_a_regular_file(tmp_path: Path) -> None:
    """init on a path that is a regular file raises StoreExistsError (a FileExistsError)."""
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(FileExistsError):
        castore.Store.init(target)


@pytest.mark.parametrize("what", ["missing", "empty-dir", "garbage-marker", "foreign-marker"])
def test_open_of_a_non_store_raises_store_not_found(tmp_path: Path, what: str) -> None:
    """open of a missing path, an empty dir or a dir with a foreign marker: StoreNotFoundError."""
    root = tmp_path / "root"
    if what != "missing":
        root.mkdir()
    if what == "garbage-marker":
        (root / "castore.json").write_bytes(b"\x00not json")
    elif what == "foreign-marker":
        (root / "castore.json").write_text('{"format": "other", "version": 1}')
    with pytest.raises(castore.StoreNotFoundError) as caught:
        castore.Store.open(root)
    assert isinstance(caught.value, FileNotFoundError)
    assert str(root) in str(caught.value)


@pytest.mark.parametrize("version", [99, 0, 3, "1", None, True, 2.0])
def test_open_refuses_an_unknown_format_version(store: castore.Store, version: object) -> None:
    """A marker of a format version this castore does not know raises FormatVersionError."""
    marker = Path(store.layout.marker)
    marker.unlink()
    marker.write_text(json.dumps({"format": "castore", "version": version}))
    with pytest.raises(castore.FormatVersionError) as caught:
        castore.Store.open(store.root)
    assert version == caught.value.found


def test_open_with_create_initialises_once(tmp_path: Path) -> None:
    """open(create=True) creates a missing store and opens an existing one unchanged."""
    root = tmp_path / "store"
    castore.Store.open(root, create=True).start(TASK, PLAN).close()
    before = tree_snapshot(root)
    castore.Store.open(root, create=True)
    assert before == tree_snapshot(root)


# -- start, commit, resume ---------------------------------------------------------------------


def test_start_commit_resume_round_trip_with_inline_and_blob_results(store: castore.Store) -> None:
    """Results committed inline and as BlobRefs read back the same after a resume."""
    big = {"rows": [{"n": i, "text": "x" * 50} for i in range(200)]}
    with store.start(TASK, PLAN) as run:
        assert (0, "fetch") == (run.head.seq, run.next_step)
        run.commit_step("fetch", {"n": 1, "items": ["a", "b"]})
        ref = store.put_blob(big)
        run.commit_step("summarize", ref)
        assert big == run.result("summarize")
    with store.resume(TASK, PLAN) as run:
        assert (2, "publish") == (run.head.seq, run.next_step)
        assert {"n": 1, "items": ["a", "b"]} == run.result("fetch")
        assert big == run.result("summarize")
        assert ref.blob == run.outcome("summarize").result_ref
        assert big == store.get_blob(ref)
        run.commit_step("publish")
        assert run.finished
    with store.resume(TASK, PLAN) as run:
        assert (3, None, True) == (run.head.seq, run.next_step, run.finished)
        assert None is run.result("publish")


def test_pending_yields_each_step_once_in_plan_order(store: castore.Store) -> None:
    """run.pending() yields the plan's steps in order, each after the previous was committed."""
    seen = []
    with store.start(TASK, PLAN) as run:
        for step in run.pending():
            seen.append(step)
            run.commit_step(step, {"step": step})
    assert ["fetch", "summarize", "publish"] == seen


def test_commit_returns_the_id_history_records(store: castore.Store) -> None:
    """The id commit_step returns is HEAD's id in history, and history is newest first."""
    with store.start(TASK, PLAN) as run:
        first = run.head_id
        second = run.commit_step("fetch", 1)
    history = store.history(TASK)
    assert [second, first] == [object_id for object_id, _ in history]
    assert [1, 0] == [snapshot.seq for _, snapshot in history]
    assert first == history[0][1].parent


def test_start_twice_raises_task_exists(store: castore.Store) -> None:
    """Starting an existing task raises TaskExistsError and leaves its chain as it was."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("fetch", 1)
    before = tree_snapshot(chain_dir(store, TASK))
    with pytest.raises(castore.TaskExistsError):
        store.start(TASK, PLAN)
    assert before == tree_snapshot(chain_dir(store, TASK))
    with store.resume(TASK, PLAN) as run:
        assert 1 == run.head.seq


def test_open_task_starts_then_resumes(store: castore.Store) -> None:
    """open_task creates a missing task and resumes an existing one."""
    with store.open_task(TASK, PLAN) as run:
        run.commit_step("fetch", 1)
    with store.open_task(TASK, PLAN) as run:
        assert (1, 1) == (run.head.seq, run.result("fetch"))


def test_resume_of_an_unknown_task_raises_task_not_found(store: castore.Store) -> None:
    """Resuming (or verifying) a task that was never started raises TaskNotFoundError."""
    before = tree_snapshot(store.root)
    with pytest.raises(castore.TaskNotFoundError):
        store.resume("nobody", PLAN)
    with pytest.raises(KeyError):
        store.verify("nobody")
    assert before == tree_snapshot(store.root)


@pytest.mark.parametrize("step", ["summarize", "publish", "nope", "fetch "])
def test_commit_of_a_step_that_is_not_next_raises_usage_error(
    store: castore.Store, step: str
) -> None:
    """Committing any step but the next one raises UsageError and writes no slot."""
    with store.start(TASK, PLAN) as run:
        with pytest.raises(castore.UsageError):
            run.commit_step(step, 1)
        assert 1 == slot_count(store, TASK)
        run.commit_step("fetch", 1)
        with pytest.raises(castore.UsageError):
            run.commit_step("fetch", 1)  # already done
        assert 2 == slot_count(store, TASK)


def test_commit_after_the_last_step_raises_usage_error(store: castore.Store) -> None:
    """Once every step is done, any commit_step raises UsageError."""
    with store.start(TASK, PLAN) as run:
        for step in run.pending():
            run.commit_step(step)
        with pytest.raises(castore.UsageError):
            run.commit_step("publish")


def test_a_closed_run_cannot_commit(store: castore.Store) -> None:
    """After run.close() a commit raises UsageError and writes nothing."""
    run = store.start(TASK, PLAN)
    run.close()
    with pytest.raises(castore.UsageError):
        run.commit_step("fetch", 1)
    assert 1 == slot_count(store, TASK)


# -- the stale run -------------------------------------------------------------------------------


def test_a_stale_run_gets_conflict_and_writes_no_slot(store: castore.Store) -> None:
    """When another run advanced first, commit raises ConflictError naming both HEADs."""
    stale = store.start(TASK, PLAN, lock_timeout=None)
    fresh = store.resume(TASK, PLAN, lock_timeout=None)
    parent = stale.head_id
    winner = fresh.commit_step("fetch", {"by": "fresh"})
    slots_before = sorted(os.listdir(chain_dir(store, TASK)))
    with pytest.raises(castore.ConflictError) as caught:
        stale.commit_step("fetch", {"by": "stale"})
    error = caught.value
    assert (TASK, parent, winner, 1) == (error.task, error.expected, error.actual, error.seq)
    assert parent[:16] in str(error)
    assert winner[:16] in str(error)
    assert slots_before == sorted(os.listdir(chain_dir(store, TASK)))
    assert stale.stale
    with pytest.raises(castore.ConflictError):
        stale.commit_step("fetch", {"by": "stale, again"})
    assert slots_before == sorted(os.listdir(chain_dir(store, TASK)))
    fresh.commit_step("summarize", 2)
    with pytest.raises(castore.CastoreError):
        stale.commit_step("fetch", {"by": "stale, later"})
    history = store.history(TASK)
    assert [2, 1, 0] == [snapshot.seq for _, snapshot in history]
    assert {"by": "fresh"} == history[1][1].transition.result
    stale.close()
    fresh.close()


def test_after_a_conflict_a_fresh_resume_continues(store: castore.Store) -> None:
    """The loser of a conflict resumes from the new HEAD and commits the next step."""
    stale = store.start(TASK, PLAN, lock_timeout=None)
    with store.resume(TASK, PLAN, lock_timeout=None) as fresh:
        fresh.commit_step("fetch", 1)
    with pytest.raises(castore.ConflictError):
        stale.commit_step("fetch", 2)
    stale.close()
    with store.resume(TASK, PLAN) as run:
        assert (1, 1) == (run.head.seq, run.result("fetch"))
        run.commit_step("summarize", 3)
    assert 3 == store.verify(TASK).length


# -- hostile task ids ----------------------------------------------------------------------------

REFUSED_IDS = [
    pytest.param("", id="empty"),
    pytest.param("a\x00b", id="NUL"),
    pytest.param("../\n", id="newline"),
    pytest.param("x" * 201, id="201-bytes"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param(None, id="None"),
    pytest.param(b"../../etc", id="bytes"),
]


def _call(store: castore.Store, operation: str, task_id: object) -> object:
    if operation == "start":
        return store.start(task_id, PLAN)  # type: ignore[arg-type]
    if operation == "resume":
        return store.resume(task_id, PLAN)  # type: ignore[arg-type]
    if operation == "open_task":
        return store.open_task(task_id, PLAN)  # type: ignore[arg-type]
    if operation == "history":
        return store.history(task_id)  # type: ignore[arg-type]
    return store.verify(task_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("operation", ["start", "resume", "open_task", "verify", "history"])
@pytest.mark.parametrize("task_id", REFUSED_IDS)
def test_refused_task_ids_leave_the_tree_byte_identical(
    store: castore.Store, tmp_path: Path, operation: str, task_id: object
) -> None:
    """An invalid task id raises InvalidTaskIdError before any file (or mtime) changes."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("fetch", 1)
    before = tree_snapshot(tmp_path)
    with pytest.raises(castore.InvalidTaskIdError):
        _call(store, operation, task_id)
    assert before == tree_snapshot(tmp_path)


PATHLIKE_IDS = ["../../etc", "..", ".", "/", "a/../../b", ".snap", "CON", "~", "-rf", "tasks"]


@pytest.mark.parametrize("task_id", PATHLIKE_IDS)
def test_path_like_task_ids_stay_inside_the_store(
    store: castore.Store, tmp_path: Path, task_id: str
) -> None:
    """Path-like ids work as plain names: all they create is tasks/<escaped>/ and objects."""
    outside = {k: v for k, v in tree_snapshot(tmp_path).items() if not k.startswith("store")}
    with store.start(task_id, PLAN) as run:
        run.commit_step("fetch", {"id": task_id})
    after = tree_snapshot(tmp_path)
    assert outside == {k: v for k, v in after.items() if not k.startswith("store")}
    assert [encode_task_id(task_id)] == os.listdir(store.layout.tasks)
    assert [task_id] == store.tasks()
    with store.resume(task_id, PLAN) as run:
        assert {"id": task_id} == run.result("fetch")


@pytest.mark.parametrize(
    "task_id",
    [
        pytest.param("." * 200, id="200-dots"),
        pytest.param("/" * 200, id="200-slashes"),
        pytest.param("\u00e9" * 100, id="100-e-acute"),
    ],
)
def test_long_escaped_ids_work_or_are_refused_cleanly(
    store: castore.Store, tmp_path: Path, task_id: str
) -> None:
    """An id within 200 bytes whose escaped name is long either works or is refused untouched."""
    before = tree_snapshot(tmp_path)
    try:
        run = store.start(task_id, PLAN)
    except castore.InvalidTaskIdError:
        assert before == tree_snapshot(tmp_path)
        return
    with run:
        run.commit_step("fetch", 1)
    assert [task_id] == store.tasks()


def test_look_alike_ids_are_different_tasks(store: castore.Store) -> None:
    """'invoice' and its Cyrillic look-alike, or 'A' and 'a', are separate tasks."""
    ids = ["invoice", "\u0456nvoice", "A", "a", "%41", "\u00e9", "\ufb01", "fi"]
    for number, task_id in enumerate(ids):
        with store.start(task_id, PLAN) as run:
            run.commit_step("fetch", number)
    assert sorted(ids) == store.tasks()
    results = []
    for task_id in ids:
        with store.resume(task_id, PLAN) as run:
            results.append(run.result("fetch"))
    assert list(range(len(ids))) == results


# -- files on disk -------------------------------------------------------------------------------


def test_objects_are_read_only_and_slots_are_the_same_inodes(store: castore.Store) -> None:
    """Every object file is mode 0444; each slot is a hard link to its snapshot object."""
    with store.start(TASK, PLAN) as run:
        run.commit_step("fetch", 1)
        run.commit_step("summarize", store.put_blob([1, 2, 3]))
    modes = set()
    for fanout in Path(store.layout.objects).iterdir():
        for item in fanout.iterdir():
            modes.add(stat.S_IMODE(item.lstat().st_mode))
            assert stat.S_ISREG(item.lstat().st_mode)
    assert {0o444} == modes
    for object_id, snapshot in store.history(TASK):
        slot = os.lstat(store.layout.slot_path(TASK, snapshot.seq))
        obj = os.lstat(store.objects.path(object_id))
        assert (obj.st_dev, obj.st_ino, 2) == (slot.st_dev, slot.st_ino, slot.st_nlink)


def test_no_temp_files_are_left_after_commits(store: castore.Store) -> None:
    """After successful commits nothing but objects, slots and the lock is in the store."""
    with store.start(TASK, PLAN) as run:
        for step in run.pending():
            run.commit_step(step, step)
    names = [name for _, _, files in os.walk(store.root) for name in files]
    assert [] == [name for name in names if name.startswith(".tmp-")]


@pytest.mark.parametrize("commits", [0, 1, 2, 3, 7, 8, 100])
def test_resume_finds_head_after_n_commits(store: castore.Store, commits: int) -> None:
    """After N commits, resume and verify find HEAD at sequence N."""
    plan = long_plan(101)
    with store.start(TASK, plan) as run:
        for index in range(commits):
            run.commit_step(f"s{index}", index)
    with store.resume(TASK, plan) as run:
        assert (commits, f"s{commits}") == (run.head.seq, run.next_step)
        assert [run.result(f"s{i}") for i in range(commits)] == list(range(commits))
    assert commits + 1 == store.verify(TASK).length
    assert list(range(commits, -1, -1)) == [s.seq for _, s in store.history(TASK)]


# -- the gate ------------------------------------------------------------------------------------


def test_plan_drift_is_refused_with_a_diff_naming_the_step(store: castore.Store) -> None:
    """Resuming with a changed plan raises PlanDriftError whose diff names the changed step."""
    store.start(TASK, PLAN).close()
    changed = castore.Plan.build("demo", "fetch", "summarise", "publish")
    with pytest.raises(castore.PlanDriftError) as caught:
        store.resume(TASK, changed)
    error = caught.value
    assert (castore.plan_id(PLAN), castore.plan_id(changed)) == (error.expected, error.actual)
    assert "summarize" in error.diff
    assert "summarise" in error.diff
    with store.resume(TASK, PLAN) as run:  # the refusal released the lock
        assert 0 == run.head.seq


def test_plan_drift_in_an_added_step_is_named(store: castore.Store) -> None:
    """A step added at the end shows up in PlanDriftError.diff."""
    store.start(TASK, PLAN).close()
    with pytest.raises(castore.PlanDriftError) as caught:
        store.resume(TASK, castore.Plan.build("demo", "fetch", "summarize", "publish", "archive"))
    assert "archive" in caught.value.diff


def test_environment_drift_is_refused(store: castore.Store) -> None:
    """Resuming with a different environment digest raises EnvironmentDriftError."""
    with store.start(TASK, PLAN, env="a") as run:
        run.commit_step("fetch", 1)
    with pytest.raises(castore.EnvironmentDriftError) as caught:
        store.resume(TASK, PLAN, env="b")
    assert ("a", "b") == (caught.value.expected, caught.value.actual)
    with pytest.raises(castore.EnvironmentDriftError):
        store.resume(TASK, PLAN)  # no environment at all is a difference too
    with store.resume(TASK, PLAN, env=lambda: "a") as run:
        assert 1 == run.head.seq
        run.commit_step("summarize", 2)
    with store.resume(TASK, PLAN, env="a") as run:
        assert 2 == run.head.seq


def test_refused_resumes_change_nothing(store: castore.Store, tmp_path: Path) -> None:
    """A resume refused for plan or environment drift leaves the store byte-identical."""
    with store.start(TASK, PLAN, env="a") as run:
        run.commit_step("fetch", 1)
    before = tree_snapshot(tmp_path)
    with pytest.raises(castore.PlanDriftError):
        store.resume(TASK, castore.Plan.build("demo", "x"), env="a")
    with pytest.raises(castore.EnvironmentDriftError):
        store.resume(TASK, PLAN, env="b")
    assert before == tree_snapshot(tmp_path)


def test_resume_errors_are_resume_refused(store: castore.Store) -> None:
    """PlanDriftError and EnvironmentDriftError are both ResumeRefusedError."""
    store.start(TASK, PLAN, env="a").close()
    for plan, env in ((castore.Plan.build("other", "x"), "a"), (PLAN, "b")):
        with pytest.raises(castore.ResumeRefusedError):
            store.resume(TASK, plan, env=env)


def test_two_runs_committing_identical_bytes_still_have_one_winner(tmp_path: Path) -> None:
    """Two runs in one process, same clock tick, same result: one commit wins, one conflicts."""
    store = castore.Store.init(tmp_path / "store", clock=lambda: 1_000)
    first = store.start(TASK, PLAN, lock_timeout=None)
    second = store.resume(TASK, PLAN, lock_timeout=None)
    second.commit_step("fetch", {"same": True})
    with pytest.raises(castore.ConflictError):
        first.commit_step("fetch", {"same": True})
    assert (True, False) == (first.stale, second.stale)
    first.close()
    second.close()


def test_a_v1_store_opens_as_format_1_and_a_new_store_is_format_2(tmp_path: Path) -> None:
    """A v1 marker still opens (castore reads and writes it as v1); init writes format 2."""
    store = castore.Store.init(tmp_path / "new")
    assert 2 == store.format_version
    marker = Path(store.layout.marker)
    marker.unlink()
    marker.write_bytes(b'{"format":"castore","version":1}\n')
    assert 1 == castore.Store.open(store.root).format_version


def test_pending_needs_each_step_committed_before_the_next(store: castore.Store) -> None:
    """`list(run.pending())` raises the UsageError the tutorial documents, committing nothing;
    the steps left are read from the plan and the frontier, as the tutorial says."""
    with store.start(TASK, PLAN) as run:
        seq = run.head.seq
        with pytest.raises(castore.UsageError, match="was yielded but not committed"):
            list(run.pending())
        assert seq == run.head.seq
        left = [step.id for step in run.plan.steps[run.head.frontier.index :]]
        assert [step.id for step in PLAN.steps] == left
    tutorial = Path(__file__).resolve().parent.parent / "docs" / "tutorial" / "first-task.md"
    assert "`list(run.pending())` raises `UsageError`" in tutorial.read_text()
