"""gc follows what trees name (castore/chain/references.py): a live tree's parts stay, however deep
and however the tree is named; an unreferenced tree goes with its parts after the grace
period; forged and damaged trees end the walk instead of hanging it or losing data."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import cli
from test_fsck_kinds import craft_tree
from test_gc_handshake import finish, spawn, wait_stopped

import castore
from castore.chain import references
from castore.format import codec
from castore.format.layout import fanout_key, temp_name
from castore.maintenance.fsck import Severity, check_store
from castore.maintenance.gc import GcReport, Reachable, collect

PLAN = castore.Plan.build("gct", "a", "b")
DAY = 86400.0


def age_all(store: castore.Store, days: float = 30) -> None:
    """Make every file of the store `days` old: only reachability protects anything now."""
    then = time.time() - days * DAY
    for path in Path(store.root).rglob("*"):
        os.utime(path, (then, then), follow_symlinks=False)


def exists(store: castore.Store, object_id: str) -> bool:
    return Path(store.objects.path(object_id)).exists()


def nested(store: castore.Store, levels: int) -> tuple[castore.TreeRef, list[str]]:
    """A tree nesting `levels` trees, each with a raw and a blob part: (root, every id)."""
    ids: list[str] = []
    ref: castore.TreeRef | None = None
    for level in range(levels):
        raw = store.put_raw(b"level %d" % level)
        blob = store.put_blob({"level": level})
        parts: dict[str, castore.RawRef | castore.BlobRef | castore.TreeRef] = {
            "raw": raw,
            "blob": blob,
        }
        if ref is not None:
            parts["down"] = ref
        ref = store.put_tree(parts, {"level": level})
        ids += [raw.raw, blob.blob, ref.tree]
    assert ref is not None
    return ref, ids


def test_gc_keeps_every_part_of_a_nested_tree_named_only_by_a_result_ref(
    store: castore.Store,
) -> None:
    """A step's result is a tree of trees; with everything old, gc removes none of its parts."""
    root, ids = nested(store, 5)
    with store.start("t", PLAN) as run:
        run.commit_step("a", root)
    age_all(store)
    report = collect(store.root, grace_s=DAY)
    assert ([], False) == (report.removed, report.unreadable)
    assert all(exists(store, object_id) for object_id in ids)
    with store.resume("t", PLAN) as run:
        tree = run.result("a")
    assert b"level 4" == store.get_raw(tree.refs["raw"])


def test_gc_removes_an_unreferenced_tree_and_its_parts_after_the_grace_period(
    store: castore.Store,
) -> None:
    """A tree no commit names goes, parts and all, once old; a part a live tree shares stays."""
    shared = store.put_raw(b"shared")
    live = store.put_tree({"s": shared})
    with store.start("t", PLAN) as run:
        run.commit_step("a", live)
    dead, dead_ids = nested(store, 3)
    dead_too = store.put_tree({"s": shared, "d": dead})
    report = collect(store.root, grace_s=DAY)
    assert [] == report.removed  # young: kept
    age_all(store)
    report = collect(store.root, grace_s=DAY)
    removed = {Path(path).name for path in report.removed}
    assert {*dead_ids, dead_too.tree} == removed
    assert exists(store, shared.raw)
    assert exists(store, live.tree)


def test_gc_dry_run_counts_what_a_tree_keeps(store: castore.Store) -> None:
    """--dry-run reports the same as a real run: a live tree's parts are not listed."""
    root, _ = nested(store, 2)
    with store.start("t", PLAN) as run:
        run.commit_step("a", root)
    orphan = store.put_raw(b"orphan")
    age_all(store)
    report = collect(store.root, grace_s=DAY, dry_run=True)
    assert [orphan.raw] == [Path(path).name for path in report.removed]


def forge(store: castore.Store, object_id: str, refs: dict[str, str]) -> None:
    """Replace the file of object `object_id` with a tree naming `refs` (a forged object:
    its bytes no longer hash to its name)."""
    path = Path(store.objects.path(object_id))
    path.parent.mkdir(exist_ok=True)
    if path.exists():
        path.chmod(0o644)
    body = codec.encode_value({"data": None, "refs": refs})
    path.write_bytes(codec.frame("tree", body, version=2))


def test_gc_survives_a_forged_cycle_of_trees(store: castore.Store) -> None:
    """A committed tree rewritten to name a tree that names it back (and itself): gc ends,
    keeps both, and removes what no longer is reachable."""
    part = store.put_raw(b"part")
    tree = store.put_tree({"p": part})
    with store.start("t", PLAN) as run:
        run.commit_step("a", tree)
    other = "ee" * 32
    forge(store, tree.tree, {"next": other, "self": tree.tree})
    forge(store, other, {"back": tree.tree})
    age_all(store)
    report = collect(store.root, grace_s=DAY)
    assert [f"objects/{part.raw[:2]}/{part.raw}"] == report.removed
    assert exists(store, tree.tree)
    assert exists(store, other)


def test_gc_keeps_everything_when_a_named_tree_cannot_be_read(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tree whose body no longer decodes might name anything: gc keeps every object, names
    the tree, and exits 2."""
    tree = store.put_tree({"p": store.put_raw(b"part")})
    with store.start("t", PLAN) as run:
        run.commit_step("a", tree)
    orphan = store.put_raw(b"orphan")
    path = Path(store.objects.path(tree.tree))
    path.chmod(0o644)
    path.write_bytes(b"castore 2 tree 5\n{nope")
    age_all(store)
    code, out, err = cli(capsys, "--store", store.root, "gc", "--grace", "1d")
    assert 2 == code
    assert f"cannot read what {tree.tree} names" in err
    assert "removed 0 file(s)" in out
    assert exists(store, orphan.raw)


def test_the_second_read_follows_a_tree_set_aside_under_its_temp_name(
    store: castore.Store,
) -> None:
    """While a batch is set aside, a new slot naming a set-aside tree still reaches the tree's
    parts: the tree is read under its temp name (Reachable.aside), so both are put back."""
    raw = store.put_raw(b"part")
    tree = store.put_tree({"p": raw})
    with store.start("t", PLAN) as run:
        run.commit_step("a", tree)
    reach = Reachable(store.medium, GcReport())
    aside = {}
    for object_id in (tree.tree, raw.raw):
        own = store.objects.path(object_id)
        aside[object_id] = f"{fanout_key(object_id)}/{temp_name()}"  # a key
        os.link(own, store.medium.where(aside[object_id]))
        os.unlink(own)
    reach.aside = aside
    reach.read_new()
    assert {tree.tree, raw.raw} <= reach.referenced


WRITER = """
import sys
import castore
root, task = sys.argv[1], sys.argv[2]
plan = castore.Plan.build("gct", "a", "b")
putter = castore.Store.open(root)
leaf = putter.put_tree({"raw": putter.put_raw(b"deep " + task.encode())})
tree = putter.put_tree({"blob": putter.put_blob({"task": task}), "down": leaf}, task)
store = castore.Store.open(root)  # reads every part back from disk: nothing remembered
with store.start(task, plan) as run:
    snapshot_id = run.commit_step("a", tree)
print("ack", snapshot_id, flush=True)
"""
GC = "import sys, castore.maintenance.gc as gc; gc.BATCH = 1; gc.collect(sys.argv[1], grace_s=0)"


@pytest.mark.parametrize(
    "point", [f"gc.{p}:{n}" for p in ("set_aside", "reread") for n in (1, 3, 5)]
)
def test_a_writer_pausing_across_gc_batches_keeps_every_part_of_its_tree(
    store: castore.Store, children: list[subprocess.Popen[str]], point: str
) -> None:
    """gc without grace, one object per batch, stopped after a batch's set-aside or second
    read while the writer waits just before linking a slot whose result is a tree of trees:
    the acknowledged commit's tree reads back whole, parts of parts included."""
    writer = spawn(children, WRITER, store.root, "t", pause="commit.before_link:2")
    wait_stopped(writer)
    gc = spawn(children, GC, store.root, pause=point)
    wait_stopped(gc)
    out = finish(writer)
    finish(gc)
    assert 1 == out.count("ack ")
    with store.resume("t", PLAN) as run:
        tree = run.result("a")
    assert {"task": "t"} == store.get_blob(tree.refs["blob"])
    assert b"deep t" == store.get_raw(store.get_tree(tree.refs["down"]).refs["raw"])
    errors = [f for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]
    assert [] == errors


def test_reachable_is_what_gc_keeps(store: castore.Store) -> None:
    """gc.reachable names the slots' snapshots, plans, result trees and their parts, and
    nothing an uncommitted tree alone names (the hook other gc passes build on)."""
    root, ids = nested(store, 2)
    with store.start("t", PLAN) as run:
        run.commit_step("a", root)
        head = run.head_id
    orphan = store.put_tree({"x": store.put_raw(b"orphan")})
    reach = castore.maintenance.gc.reachable(store.root)
    assert False is reach.unreadable
    assert {head, root.tree, *ids} <= reach.referenced
    assert orphan.tree not in reach.referenced


def test_a_tombstone_names_only_its_plan() -> None:
    """A forgotten task's tombstone (transition kind forget) keeps only its plan alive (`status`,
    `brief` and fsck read it, FORMAT.md §17): not its parent, not the packs its
    anchor names; any other snapshot names them all."""
    entry = {
        "plan": "p" * 64,
        "parent": "a" * 64,
        "sealed": {"pack": "b" * 64, "through": 3},
        "transition": {"kind": "forget", "result_ref": None},
    }
    assert ["p" * 64] == list(references.named_by("snapshot", codec.encode_value(entry)))
    entry["transition"] = {"kind": "seal", "result_ref": "c" * 64}
    named = list(references.named_by("snapshot", codec.encode_value(entry)))
    assert ["p" * 64, "a" * 64, "c" * 64, "b" * 64] == named


def test_gc_keeps_a_tree_deeper_than_castore_writes_whole(store: castore.Store) -> None:
    """gc has no depth limit: a hand-made chain of 150 trees (put_tree stops at 100) named by
    a result keeps every tree and the leaf part at its bottom."""
    leaf = store.put_raw(b"bottom")
    ids = [craft_tree(store, {"leaf": leaf.raw})]
    for _ in range(149):
        ids.append(craft_tree(store, {"down": ids[-1]}))
    with store.start("t", PLAN) as run:
        run.commit_step("a", castore.TreeRef(ids[-1]))
    age_all(store)
    assert [] == collect(store.root, grace_s=DAY).removed
    assert exists(store, leaf.raw)
