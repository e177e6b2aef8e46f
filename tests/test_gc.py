"""`castore gc`: what it removes (old unreachable objects, old temp files), what it never
touches (young files, slots, lock files, strangers), and that a writer racing it never loses
an object it commits. Also short checks of `castore log` and `castore show` on a clean store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import read_line, tree_snapshot

import castore
import castore.maintenance.gc
from castore.cli import main
from castore.maintenance.fsck import Severity, check_store
from castore.maintenance.gc import DEFAULT_GRACE_S, collect

PLAN = castore.Plan.build("gc", "a", "b", "c")
DAY = 86400.0
DEADLINE = 60.0


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def age(path: Path, days: float) -> None:
    """Set a file's mtime (and atime) `days` into the past."""
    then = time.time() - days * DAY
    os.utime(path, (then, then), follow_symlinks=False)


def rel(store: castore.Store, path: str | os.PathLike[str]) -> str:
    return Path(path).relative_to(store.root).as_posix()


def obj(store: castore.Store, object_id: str) -> Path:
    return Path(store.objects.path(object_id))


def findings(store: castore.Store) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in check_store(store.root, jobs=1)]


def assert_intact(store: castore.Store) -> None:
    """Every task verifies, every blob a step names reads back, fsck finds no error."""
    for task in store.tasks():
        chain = store.verify(task)
        for outcome in chain.outcomes.values():
            if outcome.result_ref is not None:
                store.get_blob(outcome.result_ref)
    errors = [f for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]
    assert [] == errors


@pytest.fixture
def populated(store: castore.Store) -> dict[str, Any]:
    """A task with a blob result; leftovers of crashed writers: an unreachable blob, a temp
    file in a fan-out directory and one in a chain directory; and strangers gc must keep."""
    with store.start("t/1", PLAN) as run:
        run.commit_step("a", store.put_blob({"kept": True}))
        run.commit_step("b", 2)
    orphan = store.put_blob({"orphan": True}).blob
    temp_object = Path(store.root, "objects", "ab", ".tmp-crashed-4242-0123456789ab")
    temp_object.parent.mkdir(exist_ok=True)
    temp_object.write_bytes(b"half an object")
    temp_slot = Path(store.layout.chain_dir("t/1"), ".tmp-crashed-4242-0123456789ac")
    temp_slot.write_bytes(b"")
    strangers = [
        Path(store.root, "objects", "ab", "notes.txt"),
        Path(store.layout.chain_dir("t/1"), "backup"),
        Path(store.layout.task_dir("t/1"), "notes"),
    ]
    for path in strangers:
        path.write_text("not castore's")
    return {
        "orphan": orphan,
        "leftovers": {
            rel(store, obj(store, orphan)),
            rel(store, temp_object),
            rel(store, temp_slot),
        },
        "strangers": strangers,
    }


def test_gc_keeps_everything_younger_than_the_grace_period(
    store: castore.Store, populated: dict[str, Any]
) -> None:
    """Right after a crash, every leftover is young: gc removes nothing and says it kept them."""
    before = tree_snapshot(store.root)
    report = collect(store.root)
    assert ([], 0) == (report.removed, report.bytes_freed)
    assert report.kept_young >= len(populated["leftovers"])
    assert before == tree_snapshot(store.root)


def test_gc_removes_old_leftovers_and_nothing_else(
    store: castore.Store, populated: dict[str, Any]
) -> None:
    """Once the grace period has passed, gc removes the unreachable blob and the temp files,
    and only those: objects chains name, slots, lock files and strangers stay."""
    before = tree_snapshot(store.root)
    report = collect(store.root, now=time.time() + DEFAULT_GRACE_S + DAY)
    assert populated["leftovers"] == set(report.removed)
    assert len(report.removed) == len(set(report.removed))
    sizes = sum(before[path][1] for path in populated["leftovers"])
    assert sizes == report.bytes_freed
    after = tree_snapshot(store.root)
    assert set(before) - populated["leftovers"] == set(after)
    parents = {os.path.dirname(path) for path in populated["leftovers"]}  # their mtimes change
    assert {k: v for k, v in before.items() if k in after and k not in parents} == {
        k: v for k, v in after.items() if k not in parents
    }
    for path in populated["strangers"]:
        assert path.exists()
    assert Path(store.layout.lock_path("t/1")).exists()
    assert_intact(store)
    codes = {code for code, _ in findings(store)}
    assert {"stray-file", "unknown-file"} == codes  # the strangers, and nothing else


def test_gc_by_file_age(store: castore.Store) -> None:
    """An unreachable blob 30 days old goes with a 14-day grace period; one 13 days old stays."""
    old = store.put_blob("old").blob
    recent = store.put_blob("recent").blob
    age(obj(store, old), 30)
    age(obj(store, recent), 13)
    report = collect(store.root, grace_s=14 * DAY)
    assert [rel(store, obj(store, old))] == report.removed
    assert (False, True) == (obj(store, old).exists(), obj(store, recent).exists())
    assert 1 == report.kept_young


def test_gc_never_removes_slots_or_lock_files(store: castore.Store) -> None:
    """However old, chain slots and lock files stay (also of a task whose chain is broken)."""
    with store.start("t/1", PLAN) as run:
        run.commit_step("a", 1)
    with store.start("t/2", PLAN):
        pass
    Path(store.layout.slot_path("t/2", 0)).unlink()  # a task without slot 0
    tasks_dir = Path(store.layout.tasks)
    for path in tasks_dir.rglob("*"):
        age(path, 400)
    before = {k: v for k, v in tree_snapshot(tasks_dir).items() if k != "."}
    collect(store.root, grace_s=0, now=time.time() + 400 * DAY)
    assert before == {k: v for k, v in tree_snapshot(tasks_dir).items() if k != "."}


def test_dry_run_removes_nothing(store: castore.Store, populated: dict[str, Any]) -> None:
    """--dry-run reports what gc would remove and removes nothing."""
    before = tree_snapshot(store.root)
    report = collect(store.root, now=time.time() + 30 * DAY, dry_run=True)
    assert populated["leftovers"] == set(report.removed)
    assert before == tree_snapshot(store.root)


def test_unreadable_chain_keeps_every_object(store: castore.Store) -> None:
    """If any chain cannot be read, gc keeps every object (that chain might name it) but still
    removes old temp files, and names the task."""
    with store.start("t/1", PLAN) as run:
        run.commit_step("a", 1)
    orphan = store.put_blob("orphan").blob
    head = Path(store.layout.slot_path("t/1", 1))
    head.unlink()
    head.write_bytes(b"garbage")
    temp = Path(store.root, "objects", "cd", ".tmp-crashed-1-0123456789ab")
    temp.parent.mkdir(exist_ok=True)
    temp.write_bytes(b"")
    report = collect(store.root, now=time.time() + 30 * DAY)
    assert ["t%2F1"] == report.unreadable_tasks
    assert [rel(store, temp)] == report.removed
    assert obj(store, orphan).exists()


def test_negative_grace_is_refused(store: castore.Store) -> None:
    """A negative grace period is a usage error."""
    with pytest.raises(castore.UsageError):
        collect(store.root, grace_s=-1)


def test_gc_of_a_non_store_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """gc of a directory that is not a store removes nothing and exits 2."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / ".tmp-host-1-0123456789ab").write_bytes(b"")
    before = tree_snapshot(tmp_path)
    code, out, err = cli(capsys, "gc", str(tmp_path / "x"))
    assert (2, "") == (code, out)
    assert err.startswith("castore: error: ")
    assert before == tree_snapshot(tmp_path)


# --------------------------------------------------------------------------- racing a writer


def test_refreshed_old_blob_survives_gc(store: castore.Store) -> None:
    """An unreachable blob 30 days old, stored again by a writer (the dedup path refreshes its
    mtime), survives a 14-day gc, and the commit naming it verifies."""
    ref = store.put_blob({"value": 42})
    age(obj(store, ref.blob), 30)
    with store.start("t/1", PLAN) as run:
        again = store.put_blob({"value": 42})
        assert ref == again
        assert obj(store, ref.blob).stat().st_mtime > time.time() - 60
        report = collect(store.root, grace_s=14 * DAY)
        assert [] == report.removed
        run.commit_step("a", again)
    assert obj(store, ref.blob).exists()
    assert {"value": 42} == store.get_blob(ref)
    assert_intact(store)


@pytest.mark.parametrize("moment", ["before-set-aside", "after-set-aside"])
def test_blob_refreshed_while_gc_decides_survives(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """A writer's refresh and commit land right before or right after gc sets an old
    unreachable blob aside: the blob, now named by a commit, survives either way."""
    ref = store.put_blob({"value": 7})
    age(obj(store, ref.blob), 30)
    run = store.start("t/1", PLAN)
    real_link = os.link
    real_remove = castore.medium.fsio.remove_if_present

    def writer_before_the_set_aside(source: str, target: str, **kwargs: Any) -> None:
        if source == str(obj(store, ref.blob)) and moment == "before-set-aside":
            run.commit_step("a", store.put_blob({"value": 7}))  # refresh, then commit
        real_link(source, target, **kwargs)

    def writer_after_the_set_aside(path: str) -> None:
        real_remove(path)
        if path == str(obj(store, ref.blob)) and moment == "after-set-aside":
            run.commit_step("a", store.put_blob({"value": 7}))  # publishes it anew

    monkeypatch.setattr(os, "link", writer_before_the_set_aside)  # the POSIX medium's link
    monkeypatch.setattr(castore.medium.fsio, "remove_if_present", writer_after_the_set_aside)
    try:
        collect(store.root, grace_s=14 * DAY)
    finally:
        run.close()
    monkeypatch.undo()
    assert run.done("a")
    assert obj(store, ref.blob).exists(), "gc removed a blob a commit names"
    assert {"value": 7} == store.get_blob(ref)
    assert_intact(store)


def test_put_of_an_object_whose_read_fails_enoent_after_open_publishes_it_anew(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On GlusterFS the dedup path's read of an existing object can fail with ENOENT *after*
    its open succeeded (another client's gc removed it in between): the put treats it as
    gone and publishes it again, instead of failing with an I/O error (CI, stop 19)."""
    ref = store.put_blob({"value": 9})
    path = str(obj(store, ref.blob))
    real_read, real_open = os.read, os.open
    opened: dict[int, str] = {}
    failed: list[str] = []

    def open_remembering(name: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(name, flags, *args, **kwargs)
        opened[fd] = os.fsdecode(name)
        return fd

    def read_failing_once(fd: int, size: int) -> bytes:
        if opened.get(fd) == path and not failed:
            failed.append(path)
            os.unlink(path)  # gc on the other client
            raise FileNotFoundError(2, "No such file or directory")
        return real_read(fd, size)

    monkeypatch.setattr(castore.medium.fsio.os, "open", open_remembering)
    monkeypatch.setattr(castore.medium.fsio.os, "read", read_failing_once)
    again = store.put_blob({"value": 9})
    monkeypatch.undo()
    assert [path] == failed
    assert ref == again
    assert {"value": 9} == store.get_blob(ref)
    assert_intact(store)


def test_gc_survives_files_vanishing_as_it_lists_them(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's temp file (or an object a second gc removed) that vanishes between gc's
    directory listing and its look at the file is skipped, not a crash."""
    orphan = store.put_blob("orphan").blob
    age(obj(store, orphan), 30)
    real_walk = os.walk
    ghost = ".tmp-writer-4242-0123456789ab"

    def walk_with_a_ghost(top: str, *args: Any, **kwargs: Any) -> Any:
        for directory, dirnames, filenames in real_walk(top, *args, **kwargs):
            listed = [*filenames, ghost, "ab" * 32] if directory.endswith("ab") else filenames
            yield directory, dirnames, listed  # the two extra names: listed, then gone

    monkeypatch.setattr(os, "walk", walk_with_a_ghost)
    report = collect(store.root, grace_s=14 * DAY)
    assert [rel(store, obj(store, orphan))] == report.removed


def test_a_temp_file_its_writer_publishes_while_gc_looks_at_it_is_skipped(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old temp file that is a whole object without its name (gc would give it the name)
    whose writer links it and removes it between gc's read of it and gc's sync of it: gc goes
    on, neither removes nor restores it, and the object is there under its name."""
    blob = store.put_blob({"late": True}).blob
    own = obj(store, blob)
    temp = own.with_name(".tmp-writer-4242-0123456789ab")
    os.link(own, temp)  # the writer's temp file, synced, its link not made yet
    os.unlink(own)
    age(temp, 30)
    real_open = castore.medium.fsread.open_regular

    def writer_publishes_first(path: str, *args: Any, **kwargs: Any) -> int:
        if path == str(temp) and temp.exists():
            os.link(temp, own)  # the writer's link, then the removal of its temp file
            temp.unlink()
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(castore.medium.fsread, "open_regular", writer_publishes_first)
    report = collect(store.root, grace_s=14 * DAY)
    assert ([], []) == (report.removed, report.restored)
    assert {"late": True} == store.get_blob(blob)


WRITER = """
import sys
import castore
store = castore.Store.open(sys.argv[1])
count = int(sys.argv[2])
plan = castore.Plan.build("race", *[f"s{i}" for i in range(count)])
print("ready", flush=True)
with store.start("race/1", plan) as run:
    for i in range(count):
        ref = store.put_blob({"i": i, "pad": "x" * 64})
        run.commit_step(f"s{i}", ref)
print("done", flush=True)
"""
RACE_STEPS = 120
# Longer than any pause between a put and its commit on a loaded test machine; the writer
# commits within milliseconds, gc passes run back to back meanwhile.
RACE_GRACE_S = 2.0


def race_gc_against_writer(
    store: castore.Store,
    *,
    writer_root: str,
    gc_root: str,
    steps: int,
    garbage: int,
    grace_s: float,
    timeout: float = DEADLINE,
) -> list[str]:
    """Seed `store` with old blobs (every other one the writer will put again: the dedup
    path) and `garbage` unreachable ones, run WRITER on `writer_root` for `steps` steps while
    gc loops on `gc_root`; check the writer finished, every committed blob reads back, the
    store is intact and gc never failed. Returns what gc removed."""
    for i in range(0, steps, 2):
        age(obj(store, store.put_blob({"i": i, "pad": "x" * 64}).blob), 30)
    for i in range(garbage):  # garbage gc really removes while the writer runs
        age(obj(store, store.put_blob({"garbage": i}).blob), 30)
    command = [sys.executable, "-c", WRITER, writer_root, str(steps)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    removed: list[str] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def gc_loop() -> None:
        while not stop.is_set():
            try:
                removed.extend(collect(gc_root, grace_s=grace_s).removed)
            except Exception as exc:  # noqa: BLE001 - reported by the test, after the chain
                errors.append(exc)

    thread = threading.Thread(target=gc_loop, daemon=True)
    try:
        assert "ready" == read_line(proc, DEADLINE).strip()
        thread.start()
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    thread.join(DEADLINE)
    assert (0, "done") == (proc.returncode, out.strip()), err
    chain = store.verify("race/1")
    assert steps == len(chain.outcomes)
    for step, outcome in chain.outcomes.items():
        assert outcome.result_ref is not None
        assert int(step[1:]) == store.get_blob(outcome.result_ref)["i"]
    assert_intact(store)
    # gc itself must survive the race too (a writer's temp file vanishes as gc lists it)
    assert [] == [f"{type(exc).__name__}: {exc}" for exc in errors]
    return removed


def test_gc_racing_a_writer_never_removes_what_it_commits(store: castore.Store) -> None:
    """A writer puts blobs (half of them already stored, unreachable and 30 days old: the
    dedup path) and commits a step naming each, while gc runs in a loop with a short grace
    period: the chain verifies and every blob it names is readable."""
    removed = race_gc_against_writer(
        store,
        writer_root=store.root,
        gc_root=store.root,
        steps=RACE_STEPS,
        garbage=40,
        grace_s=RACE_GRACE_S,
    )
    assert len(removed) >= 40  # gc did run against the writer


# --------------------------------------------------------------------------- CLI


def test_cli_gc_lists_what_it_removes(
    store: castore.Store, populated: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore gc --dry-run` says what it would remove and removes nothing; `castore gc`
    removes it, one line per file and a summary; all exit 0; `--grace` is honoured (also 0)."""
    for path in populated["leftovers"]:
        age(Path(store.root, path), 30)
    before = tree_snapshot(store.root)
    code, out, err = cli(capsys, "gc", store.root, "--dry-run")
    assert (0, "") == (code, err)
    lines = out.splitlines()
    assert {f"would remove {path}" for path in populated["leftovers"]} == set(lines[:-1])
    assert lines[-1].startswith(f"would remove {len(populated['leftovers'])} file(s), ")
    assert before == tree_snapshot(store.root)

    code, out, err = cli(capsys, "gc", store.root, "--grace", "31d")
    assert (0, "", 0) == (code, err, len(out.splitlines()) - 1)
    assert out.startswith("removed 0 file(s), 0 bytes; kept ")

    code, out, err = cli(capsys, "gc", store.root)
    assert (0, "") == (code, err)
    lines = out.splitlines()
    assert {f"removed {path}" for path in populated["leftovers"]} == set(lines[:-1])
    assert lines[-1].startswith(f"removed {len(populated['leftovers'])} file(s), ")
    assert lines[-1].endswith(" younger than the grace period")
    for path in populated["leftovers"]:
        assert not Path(store.root, path).exists()
    assert_intact(store)

    orphan = obj(store, store.put_blob("written a moment ago").blob)
    age(orphan, 10 / DAY)
    code, out, err = cli(capsys, "gc", store.root, "--grace", "0")
    assert (0, "", f"removed {rel(store, orphan)}") == (code, err, out.splitlines()[0])


def test_cli_gc_with_an_unreadable_chain(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore gc` keeps every object when a chain cannot be read, says so on stderr and
    exits 2."""
    with store.start("t/1", PLAN) as run:
        run.commit_step("a", 1)
    orphan = store.put_blob("orphan").blob
    age(obj(store, orphan), 30)
    head = Path(store.layout.slot_path("t/1", 1))
    head.unlink()
    head.write_bytes(b"")
    code, _, err = cli(capsys, "gc", store.root)
    assert 2 == code
    assert "kept every object" in err
    assert "castore fsck" in err
    assert obj(store, orphan).exists()


def test_cli_log_and_show_of_a_blob_result(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore log` shows a blob result by its short id; `castore show` decodes the blob."""
    with store.start("t/1", PLAN) as run:
        ref = store.put_blob({"rows": [1, 2, 3]})
        run.commit_step("a", ref)
        run.commit_step("b", "inline")
    code, out, err = cli(capsys, "--store", store.root, "log", "t/1")
    assert (0, "") == (code, err)
    lines = out.splitlines()
    assert [2, 1, 0] == [int(line.split()[0]) for line in lines]
    assert lines[1].endswith(f"step a result=blob:{ref.blob[:12]}")
    assert lines[0].endswith("step b")
    code, out, err = cli(capsys, "--store", store.root, "show", ref.blob)
    assert (0, "") == (code, err)
    first, _, body = out.partition("\n")
    assert f"blob {ref.blob} ({obj(store, ref.blob).stat().st_size} bytes)" == first
    assert '"rows": [\n    1,' in body


def test_a_put_that_finds_its_object_set_aside_publishes_it_again(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc sets an object aside between a writer's "already exists" and its refresh: the
    writer notices the object vanished and publishes it anew instead of trusting the name."""
    ref = store.put_blob({"value": 9})
    path = obj(store, ref.blob)
    real_read = castore.chain.objects.ObjectStore.read
    moved: list[str] = []

    def read_after_gc_moved_it(self: castore.chain.objects.ObjectStore, object_id: str) -> bytes:
        if object_id == ref.blob and not moved:
            aside = path.with_name(".tmp-gc-1-0123456789ab")
            os.rename(path, aside)  # what gc does, at the worst moment
            os.unlink(aside)
            moved.append(object_id)
        return real_read(self, object_id)

    monkeypatch.setattr(castore.chain.objects.ObjectStore, "read", read_after_gc_moved_it)
    again = store.put_blob({"value": 9})
    monkeypatch.undo()
    assert ([ref.blob], ref) == (moved, again)
    assert {"value": 9} == store.get_blob(again)


def test_a_commit_whose_blob_gc_removes_after_a_stale_lookup_stores_it_again(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client's gc removes a blob between the commit's look for it (answered from a
    client cache: still there) and the read of its kind: the commit stores it again from
    the bytes this process put, instead of calling it not in this store (CI, CephFS)."""
    run = store.start("t", castore.Plan.build("p", "a"))
    ref = store.put_blob({"value": 10})
    os.unlink(obj(store, ref.blob))  # gc on the other client
    monkeypatch.setattr(store.objects, "still_named", lambda object_id: True)  # a stale cache
    run.commit_step("a", ref)
    monkeypatch.undo()
    assert {"value": 10} == store.get_blob(ref)
    assert_intact(store)
