"""Power loss during gc, quarantine and store creation, with the crash model and checker of
tests/test_power_loss.py (read its docstring): each workload is recorded, every crash state it
allows is built and checked with castore, and every acknowledged commit must survive.

1. **gc**: a commit names a blob while gc runs (after gc's first read of the slots): gc sets
   it aside with the unnamed garbage, reads the slots again, puts it back, removes the garbage.
   A state in which a set-aside object has only its temp name (a power loss between the
   unlink of its own name and its put back) is whole once the next gc ran: that gc links the
   temp file back (FORMAT.md §17). Every other state must be whole as it is.
2. **quarantine**: a damaged object is moved to quarantine/ and an intact object fsck had
   flagged is looked at again, moved and left in place; nothing may be lost either way.
3. **store creation**: every state of an interrupted init (no marker) is completed by
   Store.open(create=True) into a whole store.

Self-tests: removing the fsync gc makes between the temp name and the unlink of an object's
own name, or the fsync of quarantine's second name before the first goes, must make the
checker fail.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import test_power_loss as pl
from test_power_loss import STORE, Exploration, Op, Recorder, Verdict, explore, scratch_dir

import castore
import castore.maintenance.fsck.quarantine as fsck_quarantine
import castore.maintenance.gc
import castore.medium.setaside as quarantine_module
from castore import crashpoints
from castore.format.layout import MARKER_NAME, object_relpath
from castore.maintenance.fsck import Finding, check_store
from castore.maintenance.fsck.quarantine import quarantine
from castore.maintenance.gc import collect
from castore.medium import fsio
from castore.medium.base import Entry, Judge

PLAN = castore.Plan.build("plgc", "a", "b", "c")


class FdRecorder(Recorder):
    """The recorder, also for calls relative to a directory descriptor (quarantine's)."""

    def rel(self, path: Any, dir_fd: int | None = None) -> str | None:
        if dir_fd is None or isinstance(path, int):
            return super().rel(path)
        name = os.fsdecode(os.fspath(path))
        entry = self.tracked(dir_fd)
        if os.path.isabs(name) or entry is None:
            return super().rel(name) if os.path.isabs(name) else None
        assert entry[0] == "dir"
        return name if entry[1] == "." else f"{entry[1]}/{name}"


Workload = Callable[[Path, list[Op]], None]


def record(base: Path, workload: Workload) -> list[Op]:
    base.mkdir()
    recorder = FdRecorder(str(base))
    with recorder.installed():
        workload(base, recorder.ops)
    model = pl.Model(recorder.ops)
    end = list(model.points())[-1]
    tree = end.tree(frozenset(i for ops in end.nondurable_entries().values() for i in ops))
    disk, disk_contents, _ = pl.real_tree(base)
    assert [] == pl.same_shape(tree, end.contents(tree, "full"), disk, disk_contents)
    return recorder.ops


@contextmanager
def at_point(name: str, action: Callable[[], None]) -> Iterator[None]:
    """Run `action` when castore reaches crash point `name` (once)."""
    real = crashpoints.reach
    done: list[bool] = []

    def reach(point: str) -> None:
        if point == name and not done:
            done.append(True)
            action()
        real(point)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(crashpoints, "reach", reach)
        yield
    assert done, f"{name} was never reached"


# -- the workloads ---------------------------------------------------------------------------------


def gc_workload(base: Path, ops: list[Op]) -> None:
    """A task, garbage, and a blob that a commit names while gc runs."""
    store = castore.Store.init(base / STORE)
    ops.append(Op("ack_init"))
    run = store.start("job-g", PLAN)
    run.commit_step("a", {"n": 1})
    garbage = store.put_blob({"garbage": True})
    late = store.put_blob({"late": True})  # unnamed when gc first reads the slots
    with at_point("gc.slots_read", lambda: run.commit_step("b", late)):
        report = collect(store.root, grace_s=0, now=time.time() + 3600)
    assert {object_relpath(garbage.blob)} <= set(report.removed)
    assert object_relpath(late.blob) not in report.removed
    run.close()


def quarantine_workload(base: Path, ops: list[Op]) -> None:
    """A damaged object moved to quarantine/, and an intact one (fsck's finding about it
    outdated: a writer stored it again) left in place after the look that follows its link."""
    store = castore.Store.init(base / STORE)
    ops.append(Op("ack_init"))
    run = store.start("job-q", PLAN)
    ref = store.put_blob({"kept": True})
    run.commit_step("a", ref)
    run.close()
    fsio.make_dir_durable(os.path.dirname(store.objects.path(BAD_ID)))  # made on first use
    fd = os.open(store.objects.path(BAD_ID), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.write(fd, BAD)
    os.fsync(fd)
    os.close(fd)
    fsio.fsync_dir(os.path.dirname(store.objects.path(BAD_ID)))
    findings = list(check_store(store.root, jobs=1))
    assert "unknown-kind" in {f.code for f in findings}
    blob_path = object_relpath(ref.blob)
    findings.append(Finding("hash-mismatch", blob_path, "outdated", ref.blob))
    real_judge = fsck_quarantine._still_damaged
    looks: list[str] = []

    def first_look_outdated(finding: Finding) -> Judge:
        judge = real_judge(finding)

        def looked(data: bytes | None, entry: Entry) -> bool:
            looks.append(entry.name)
            if entry.name == ref.blob and looks.count(entry.name) == 1:
                return True  # what fsck saw; the look after the link sees it intact
            return judge(data, entry)

        return looked

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fsck_quarantine, "_still_damaged", first_look_outdated)
        _, moved, _ = quarantine(store.root, findings)
    assert [BAD_ID] == [f.object_id for f in moved]
    assert 2 == looks.count(ref.blob)


# -- the checker: as test_power_loss's, and "whole after the next gc" for gc's temp names ----------

BAD = b"castore 1 widget 2\n{}"  # the damaged object the quarantine workload plants
BAD_ID = castore.format.digest.hash_bytes(BAD)
CHECK_STATE = pl.check_state  # explore() calls pl.check_state: these tests put theirs there
HEALED: list[str] = []  # states that were whole only after the next gc


def heal_then_check(base: Path) -> Verdict:
    """test_power_loss.check_state; a state it finds broken is checked again after one gc
    (no grace: the clock far ahead), which links a set-aside object back to its name. (The
    state is a scratch copy: healing it in place keeps its hard links as they are.)"""
    verdict = CHECK_STATE(base)
    root = base / STORE
    if not verdict.problems or not (root / MARKER_NAME).exists():
        return verdict
    collect(root, grace_s=0, now=time.time() + 10 * 365 * 86400)
    HEALED.append(str(base))
    return CHECK_STATE(base)


def quarantine_check(base: Path) -> Verdict:
    """heal_then_check, and the damaged object is still somewhere: in objects/ or moved
    into quarantine/ (quarantine never deletes)."""
    root = base / STORE
    # Once quarantine/ exists the damaged object was planted long before (and made durable).
    lost = (root / "quarantine").exists() and not [
        p for p in root.rglob(BAD_ID) if p.is_file() and p.read_bytes() == BAD
    ]
    verdict = heal_then_check(base)  # (a gc would remove the damaged object: looked at first)
    if lost:
        verdict.problems.append(f"the damaged object {BAD_ID} is gone: quarantine lost it")
    return verdict


def run_exploration(
    tmp_path: Path,
    workload: Workload,
    monkeypatch: pytest.MonkeyPatch,
    *,
    check: Callable[[Path], Verdict] = heal_then_check,
    stop: bool = False,
    checker_writes: bool = True,  # heal_then_check runs gc on a broken state
) -> Exploration:
    ops = record(tmp_path / "base", workload)
    monkeypatch.setattr(pl, "check_state", check)
    (tmp_path / "states").mkdir()
    with scratch_dir(tmp_path / "states") as scratch:
        result = explore(ops, scratch, stop_at_first=stop, checker_writes=checker_writes)
    print(f"\npower loss ({getattr(workload, '__name__', 'workload')}): {result.summary()}")
    return result


def assert_clean(result: Exploration) -> None:
    assert result.states > 20, result.summary()
    for kind in ("invariant", "acks", "fsck"):
        failures = getattr(result, kind)
        if failures:
            pytest.fail(
                f"{result.summary()}\n{kind}: {len(failures)} state(s):\n{pl._report(failures)}",
                pytrace=False,
            )


def test_power_loss_during_gc_loses_no_acknowledged_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every crash state of gc setting objects aside, putting one back (a commit named it
    meanwhile) and removing the rest: every acknowledged commit and its blob survive (after
    the next gc for an object left under its temp name only), fsck finds no error."""
    HEALED.clear()
    assert_clean(run_exploration(tmp_path, gc_workload, monkeypatch))
    assert HEALED, "no state had an object under its temp name only: the heal was not tested"


def test_power_loss_during_quarantine_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every crash state of a quarantine that moves a damaged object and leaves an intact one
    in place: every acknowledged commit survives, fsck finds no error it did not find
    before (the damaged object is either still in objects/ or in quarantine/)."""
    result = run_exploration(tmp_path, quarantine_workload, monkeypatch, check=quarantine_check)
    # The planted damaged object is an error fsck reports until it is moved: not a loss.
    result.fsck = [f for f in result.fsck if any("unknown-kind" not in w for w in f.what)]
    assert_clean(result)


def test_every_interrupted_init_state_is_completed_by_open_create(tmp_path: Path) -> None:
    """Each power-loss state of init without a marker is completed by
    Store.open(create=True) into a store fsck finds whole."""
    ops = record(tmp_path / "base", _init_only)
    model = pl.Model(ops)
    checked = 0
    seen: set[frozenset[Any]] = set()
    # States are built on tmpfs as the explorations' are: on a disk, completing each one's
    # flushes costs ten times more and checks nothing more.
    with scratch_dir(tmp_path / "states") as scratch:
        for point, _label, variant, tree, contents in pl.crash_states(model):
            key = pl.state_key(tree, contents)
            if key in seen or f"{STORE}/{MARKER_NAME}" in tree or STORE not in tree:
                continue
            seen.add(key)
            dest = scratch / f"state-{checked}"
            pl.materialize(str(dest), tree, contents, model.modes)
            castore.Store.open(dest / STORE, create=True)
            found = check_store(dest / STORE, jobs=1)
            errors = [f.code for f in found if f.severity.value == "error"]
            assert [] == errors, f"crash after op {point.index} ({variant})"
            shutil.rmtree(dest)
            checked += 1
    assert checked >= 5  # store/ alone, then objects/, tasks/, the marker's temp file (3 ways)


def _init_only(base: Path, ops: list[Op]) -> None:
    castore.Store.init(base / STORE)
    ops.append(Op("ack_init"))


# -- self-tests: the checker fails when a needed fsync is removed ---------------------------------


def test_self_test_without_gcs_fsync_before_the_unlink_an_acked_blob_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc's fsync of the set-aside names before it unlinks the objects' own names removed: a
    crash state loses a blob an acknowledged commit names, beyond what the next gc heals."""
    monkeypatch.setattr(
        castore.maintenance.gc, "_sync_second_names", lambda medium, directories: None
    )
    result = run_exploration(tmp_path, gc_workload, monkeypatch, stop=True)
    assert result.invariant or result.acks, f"no failure found: {result.summary()}"
    print(f"self-test caught: {(result.invariant + result.acks)[0]}")


def test_self_test_without_quarantines_fsync_of_the_new_name_the_damaged_file_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """quarantine's fsync of the run directory after the link removed: a crash state has the
    damaged object under neither name (quarantine must never delete)."""
    monkeypatch.setattr(quarantine_module, "_sync_second_name", lambda dir_fd: None)
    result = run_exploration(
        tmp_path, quarantine_workload, monkeypatch, check=quarantine_check, stop=True
    )
    assert result.invariant or result.acks, f"no failure found: {result.summary()}"
    print(f"self-test caught: {(result.invariant + result.acks)[0]}")
