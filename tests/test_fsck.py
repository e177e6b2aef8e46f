"""`castore fsck`: a damage catalogue (STORAGE.md) made on real stores, one finding per kind.

Every damage test checks the finding's code, severity, path (relative to the store root) and
ids, the exit status and `--json` output of `castore fsck`, and that fsck changed nothing (a
full tree listing with modes, sizes, mtimes and content hashes, before and after). Clean
stores of every shape yield no finding at all.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import cli, flip_bit, read_line, rewrite, tree_snapshot

import castore
import castore.maintenance.fsck.quarantine
import castore.maintenance.fsck.workers
import castore.maintenance.gc
import castore.medium.fsread
from castore.chain.refs import TaskSlots
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import encode_task_id
from castore.format.limits import MAX_OBJECT_SIZE
from castore.format.records import EffectState, Frontier, Transition, TransitionKind
from castore.maintenance.fsck import CODES, Finding, Severity, Summary, check_store
from castore.run.settings import RunSettings, encode_snapshot

PLAIN = castore.Plan.build("plain", "a", "b", "c", "d")
OTHER = castore.Plan.build("other", "a", "b", "c")
SHOP = castore.Plan.build("shop", "price", castore.effect("charge", "price"), "email")
NEITHER = castore.Service("payments")  # can neither deduplicate nor be asked: UNRESOLVED
DEADLINE = 10.0
ERROR, WARNING, INFO = Severity.ERROR.value, Severity.WARNING.value, Severity.INFO.value
# What damage to a snapshot may set off along its chain, besides the finding under test.
CHAIN_CODES = (
    "slot-not-published",
    "snapshot-name-lost",  # v2: a slot that still verifies without its object name
    "slot-corrupt",
    "foreign-snapshot",
    "broken-link",
    "seq-mismatch",
    "plan-changed",
    "bad-frontier",
    "missing-object",
    "root-not-start",
    "illegal-transition",
    "unreachable-object",
)
Row = tuple[str, str, str, str | None, str | None]  # code, severity, path, object, task


class Ledger:
    """A dict-backed fake payment service: applies each key once, can be looked up by key."""

    def __init__(self) -> None:
        self.applied: dict[str, str] = {}

    def send(self, key: str) -> str:
        return self.applied.setdefault(key, f"receipt-{len(self.applied) + 1}")

    def lookup(self, key: str) -> castore.Reconciled:
        return castore.found(self.applied[key]) if key in self.applied else castore.NOT_FOUND

    @property
    def service(self) -> castore.Service:
        return castore.Service("payments", reconcile=self.lookup)


@attrs.define
class World:
    """A store with plain tasks, a blob result and a confirmed effect, and its ids."""

    store: castore.Store
    snaps: dict[str, list[str]]  # task -> snapshot ids by sequence number
    plans: dict[str, str]  # task -> plan id
    blob: str  # the blob plain/2's step b returned

    @property
    def root(self) -> str:
        return self.store.root

    def obj(self, object_id: str) -> Path:
        return Path(self.store.objects.path(object_id))

    def slot(self, task: str, seq: int) -> Path:
        return Path(self.store.layout.slot_path(task, seq))

    def rel(self, path: str | os.PathLike[str]) -> str:
        return Path(path).relative_to(self.root).as_posix()

    def slot_rel(self, task: str, seq: int) -> str:
        return self.rel(self.slot(task, seq))


def ids_by_seq(store: castore.Store, task: str) -> list[str]:
    return [snapshot_id for snapshot_id, _ in reversed(store.history(task))]


def build_world(store: castore.Store) -> World:
    """plain/1 finished (4 steps), plain/2 unfinished with a blob result, shop/1 finished
    with a charge confirmed through a service that can be looked up by key."""
    with store.start("plain/1", PLAIN) as run:
        for step in "abcd":
            run.commit_step(step, {"step": step})
    with store.start("plain/2", OTHER) as run:
        run.commit_step("a", 1)
        ref = store.put_blob({"rows": list(range(40))})
        run.commit_step("b", ref)
    ledger = Ledger()
    with store.start("shop/1", SHOP) as run:
        run.commit_step("price", 4200)
        run.perform("charge", ledger.service, ledger.send)
        run.commit_step("email", None)
    tasks = ("plain/1", "plain/2", "shop/1")
    snaps = {task: ids_by_seq(store, task) for task in tasks}
    plans = {task: store.verify(task).plan_id for task in tasks}
    return World(store, snaps, plans, ref.blob)


def clone_tree(source: str, target: str) -> None:
    """Copy a store with modes, mtimes and hard links (a slot and its object stay one inode),
    without the fsyncs that make building one slow."""
    first: dict[tuple[int, int], str] = {}
    for directory, _, filenames in os.walk(source):
        there = os.path.join(target, os.path.relpath(directory, source))
        os.makedirs(there, exist_ok=True)
        for name in filenames:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            key = (info.st_dev, info.st_ino)
            if key in first:
                os.link(first[key], os.path.join(there, name))
            else:
                first[key] = os.path.join(there, name)
                shutil.copy2(path, first[key], follow_symlinks=False)
    for directory, _, _ in os.walk(source):  # directory modes and mtimes last: copies touch them
        shutil.copystat(directory, os.path.join(target, os.path.relpath(directory, source)))


@pytest.fixture(scope="module")
def world_template(tmp_path_factory: pytest.TempPathFactory) -> World:
    """One world built per module (commits fsync: slow); each test gets a clone."""
    return build_world(castore.Store.init(tmp_path_factory.mktemp("template") / "store"))


@pytest.fixture
def world(world_template: World, tmp_path: Path) -> World:
    """A private copy of the world (same ids: objects are named by their content)."""
    clone_tree(world_template.root, str(tmp_path / "store"))
    store = castore.Store.open(tmp_path / "store")
    return attrs.evolve(world_template, store=store)


def test_clone_of_the_world_is_the_world(world_template: World, world: World) -> None:
    """The clone the tests damage is the template, entry for entry (hard links included)."""
    source, copy = tree_snapshot(world_template.root), tree_snapshot(world.root)
    assert {k: v[:1] + v[3:] for k, v in source.items()} == {
        k: v[:1] + v[3:] for k, v in copy.items()
    }
    slot = world.slot("plain/1", 2)
    assert slot.stat().st_ino == world.obj(world.snaps["plain/1"][2]).stat().st_ino
    assert 2 == slot.stat().st_nlink


# --------------------------------------------------------------------------- helpers


def within_deadline(function: Callable[[], Any], unblock: Path | None = None) -> Any:
    """Run `function` in a thread; fail if it is still running after the deadline (a FIFO
    opened for reading blocks until a writer shows up: fsck must never do that)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome["raised"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    if thread.is_alive() and unblock is not None:
        with contextlib.suppress(OSError):  # a writer showing up ends the blocked open()
            os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
    assert not thread.is_alive(), f"still running after {DEADLINE}s (blocked?)"
    if "raised" in outcome:
        raise outcome["raised"]
    return outcome["value"]


def row(finding: Finding) -> Row:
    return (finding.code, finding.severity.value, finding.path, finding.object_id, finding.task)


def parse_json_output(out: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(finding objects, summary) of `fsck --json`: one object per line, the summary last."""
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines, "no output"
    assert (["summary", "type"], "summary") == (sorted(lines[-1]), lines[-1]["type"]), lines[-1]
    rows = [line for line in lines[:-1] if line["type"] == "finding"]
    for item in rows:
        fields = {"type", "code", "severity", "path", "message", "object", "task", "advice"}
        assert fields == set(item)
        assert CODES[item["code"]] == (Severity(item["severity"]), item["advice"])
    return rows, lines[-1]["summary"]


def fsck_json(
    capsys: pytest.CaptureFixture[str], root: str, *args: str, unblock: Path | None = None
) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    code, out, err = within_deadline(
        lambda: cli(capsys, "fsck", root, "--json", *args), unblock=unblock
    )
    assert "" == err
    rows, summary = parse_json_output(out)
    return code, rows, summary


def fsck(root: str, **options: Any) -> list[Finding]:
    """Every finding of check_store, checked to have changed nothing in the store, and to be
    what a pool of worker processes finds too, in the same order."""
    before = tree_snapshot(root)
    findings = within_deadline(lambda: list(check_store(root, jobs=1, **options)))
    assert before == tree_snapshot(root), "fsck changed the store"
    # In this thread, the only one: the workers are then forked, and inherit whatever the
    # test patched (jobs=1 above already showed that nothing blocks).
    with forced_pool():
        pooled = list(check_store(root, jobs=2, **options))
    assert [row(f) for f in findings] == [row(f) for f in pooled]
    return findings


@contextlib.contextmanager
def forced_pool() -> Iterator[None]:
    """Worker processes even for a small store, and direct checks shared in small batches."""
    saved = {name: getattr(castore.maintenance.fsck.workers, name) for name in FORCED_POOL}
    for name, value in FORCED_POOL.items():
        setattr(castore.maintenance.fsck.workers, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(castore.maintenance.fsck.workers, name, value)


FORCED_POOL = {"PARALLEL_TASKS": 1, "PARALLEL_OBJECTS": 1, "BATCH": 2}


def check(
    capsys: pytest.CaptureFixture[str],
    root: str,
    expected: list[Row],
    *,
    cascade: tuple[str, ...] = (),
    task: str | None = None,
    stuck_after: float | None = None,
    unblock: Path | None = None,
) -> list[Finding]:
    """fsck finds every `expected` row, nothing but those codes and `cascade`, exits 1 if
    and only if it found an error, says the same with --json, and changes nothing."""
    before = tree_snapshot(root)
    options: dict[str, Any] = {"task": task}
    args: list[str] = []
    if task is not None:
        args += ["--task", task]
    if stuck_after is not None:
        options["stuck_after"] = stuck_after
        args += ["--stuck-after", f"{stuck_after}s"]
    findings = fsck(root, **options)
    found = [row(f) for f in findings]
    for item in expected:
        assert item in found, f"{item} not in\n" + "\n".join(map(str, found))
        assert CODES[item[0]][0].value == item[1]
    allowed = {item[0] for item in expected} | set(cascade)
    assert [] == [item for item in found if item[0] not in allowed]
    errors = sum(1 for f in findings if f.severity is Severity.ERROR)
    code, rows, summary = fsck_json(capsys, root, *args, unblock=unblock)
    assert sorted(found, key=str) == sorted(
        ((r["code"], r["severity"], r["path"], r["object"], r["task"]) for r in rows), key=str
    )
    assert (1 if errors else 0) == code == summary["exit_status"]
    assert errors == summary["errors"]
    assert before == tree_snapshot(root), "fsck --json changed the store"
    return findings


def put_raw(store: castore.Store, data: bytes) -> str:
    """Place `data` as a read-only object file named by its blake3 (whatever it holds)."""
    object_id = hash_bytes(data)
    path = Path(store.objects.path(object_id))
    path.parent.mkdir(exist_ok=True)  # fan-out directories are made on first use
    path.write_bytes(data)
    path.chmod(0o444)
    return object_id


def replace_file(path: Path, data: bytes) -> None:
    """Give `path` new content as a new inode (a slot is a hard link to its object: editing
    it in place would damage the object too)."""
    path.unlink()
    path.write_bytes(data)
    path.chmod(0o444)


def forge(
    store: castore.Store, task: str, *, clock_ms: int | None = None, **changes: Any
) -> tuple[str, int]:
    """Commit a hand-made successor of `task`'s HEAD (whatever the protocol says); returns
    (its id, its sequence number)."""
    head_id, head = store.history(task)[0]
    fields: dict[str, Any] = {"seq": head.seq + 1, "parent": head_id}
    if clock_ms is not None:
        fields["time_ms"] = clock_ms
    snapshot = attrs.evolve(head, **{**fields, **changes})
    data = encode_snapshot(snapshot, RunSettings())
    slots = TaskSlots(store.medium, store.objects, task)
    return slots.commit(data, snapshot.seq, head_id), snapshot.seq


# --------------------------------------------------------------------------- clean stores


def shape_empty(store: castore.Store) -> None:
    """No task at all."""


def shape_plain_finished(store: castore.Store) -> None:
    with store.start("p/1", PLAIN) as run:
        for step in "abcd":
            run.commit_step(step, step * 3)


def shape_plain_unfinished(store: castore.Store) -> None:
    with store.start("p/2", PLAIN) as run:
        run.commit_step("a", None)
    with store.start("p/3", OTHER):
        pass  # only the start snapshot


def shape_blobs(store: castore.Store) -> None:
    with store.start("b/1", PLAIN) as run:
        run.commit_step("a", store.put_blob({"rows": list(range(100))}))
        run.commit_step("b", store.put_blob("same"))
        run.commit_step("c", store.put_blob("same"))  # a deduplicated blob, named twice


def applied_then_lost(ledger: Ledger, key: str) -> None:
    ledger.send(key)
    raise ConnectionError("applied, then the answer was lost")


def shape_effects(store: castore.Store) -> None:
    ledger = Ledger()
    with store.start("e/1", SHOP) as run:
        run.commit_step("price", 1)
        run.perform("charge", ledger.service, ledger.send)
        run.commit_step("email", None)
    with store.start("e/2", SHOP) as run:  # in flight: SUBMITTED a moment ago
        run.commit_step("price", 2)
        with pytest.raises(ConnectionError), run.effect("charge", ledger.service):
            raise ConnectionError("answer lost")
    with store.start("e/3", SHOP) as run:  # reconciled after a lost answer
        run.commit_step("price", 3)
        with pytest.raises(ConnectionError), run.effect("charge", ledger.service) as call:
            applied_then_lost(ledger, call.key)
    with store.open_task("e/3", SHOP) as run:
        run.settle(ledger.service)


def shape_resolved(store: castore.Store) -> None:
    for task, decision in (("r/1", {"receipt": "R-1"}), ("r/2", {"not_done": True})):
        with store.start(task, SHOP) as run:
            run.commit_step("price", 1)
            with pytest.raises(ConnectionError), run.effect("charge", NEITHER):
                raise ConnectionError("answer lost")
        with store.open_task(task, SHOP) as run:
            run.settle(NEITHER)
        store.resolve(task, "charge", who="ops", reason="checked the ledger", **decision)


def shape_override(store: castore.Store) -> None:
    with store.start("o/1", PLAIN) as run:
        run.commit_step("a", 1)
    store.override("o/1", who="ops", why="steps renamed", plan=OTHER)
    with store.open_task("o/1", OTHER) as run:
        run.commit_step("b", 2)


def shape_everything(store: castore.Store) -> None:
    build_world(store)
    for shape in SHAPES[:-1]:
        shape(store)


SHAPES = [
    shape_empty,
    shape_plain_finished,
    shape_plain_unfinished,
    shape_blobs,
    shape_effects,
    shape_resolved,
    shape_override,
    shape_everything,
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.__name__.removeprefix("shape_"))
def test_clean_store_has_no_finding(
    store: castore.Store, capsys: pytest.CaptureFixture[str], shape: Callable[..., None]
) -> None:
    """A store castore wrote, of any shape, yields no finding at all and exit status 0."""
    shape(store)
    summary = Summary()
    before = tree_snapshot(store.root)
    assert [] == [row(f) for f in check_store(store.root, jobs=1, summary=summary)]
    assert before == tree_snapshot(store.root)
    assert (0, len(store.tasks())) == (summary.exit_status, summary.tasks)
    code, rows, totals = fsck_json(capsys, store.root)
    assert (0, []) == (code, rows)
    assert {"errors": 0, "warnings": 0, "infos": 0, "codes": {}, "exit_status": 0} == {
        k: totals[k] for k in ("errors", "warnings", "infos", "codes", "exit_status")
    }
    assert len(store.tasks()) == totals["tasks"]


def test_clean_text_output(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json, a clean store prints one summary line and exits 0."""
    code, out, err = cli(capsys, "fsck", world.root)
    assert (0, "") == (code, err)
    [line] = out.splitlines()
    assert line.startswith("checked ")
    assert " objects and 3 tasks in " in line
    assert line.endswith(": 0 errors, 0 warnings, 0 notes")


def test_summary_counts_every_object_and_task(world: World) -> None:
    """The summary counts each object file once and each task once."""
    summary = Summary()
    assert [] == list(check_store(world.root, jobs=1, summary=summary))
    objects = sum(len(os.listdir(d)) for d in Path(world.root, "objects").iterdir())
    assert (objects, 3) == (summary.objects, summary.tasks)


def test_text_output_names_code_path_and_ids(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finding prints as `severity: code: path [task object]: message`, exit status 1."""
    rewrite(world.obj(world.blob), lambda data: b"")
    code, out, _ = cli(capsys, "fsck", world.root)
    assert 1 == code
    blob_rel = world.rel(world.obj(world.blob))
    assert f"error: object-empty: {blob_rel} [{world.blob[:12]}]: the file is empty" in out
    slot = world.slot_rel("plain/2", 2)
    assert f"error: missing-object: {slot} [plain/2 {world.snaps['plain/2'][2][:12]}]: " in out


# --------------------------------------------------------------------------- object damage


def target_of(world: World, kind: str) -> str:
    return {
        "snapshot": world.snaps["plain/1"][2],
        "plan": world.plans["plain/1"],
        "blob": world.blob,
    }[kind]


# A byte inside a JSON string of each kind: flipping it leaves an object that still decodes.
IN_A_STRING = {"snapshot": b"plain/1", "plan": b"plain", "blob": b"rows"}


@pytest.mark.parametrize("where", ["in-a-string", "last-byte", "header"])
@pytest.mark.parametrize("kind", ["snapshot", "plan", "blob"])
def test_bit_flip_is_a_hash_mismatch(
    world: World, capsys: pytest.CaptureFixture[str], kind: str, where: str
) -> None:
    """One flipped bit anywhere in an object is a hash mismatch on its path (bit rot: restore
    it), also when the damaged bytes still decode (a letter of a string changed)."""
    object_id = target_of(world, kind)
    data = world.obj(object_id).read_bytes()
    index = {
        "in-a-string": data.index(IN_A_STRING[kind], data.index(b"\n")),
        "last-byte": len(data) - 1,
        "header": 3,
    }[where]
    rewrite(world.obj(object_id), lambda data: flip_bit(data, index))
    findings = check(
        capsys,
        world.root,
        [("hash-mismatch", ERROR, world.rel(world.obj(object_id)), object_id, None)],
        cascade=CHAIN_CODES,
    )
    if kind == "snapshot":  # the slot is the same inode: the task is named too
        assert any(f.task == "plain/1" and f.severity is Severity.ERROR for f in findings)
    if kind == "blob":
        assert (
            "missing-object",
            ERROR,
            world.slot_rel("plain/2", 2),
            world.snaps["plain/2"][2],
            "plain/2",
        ) in [row(f) for f in findings]


@pytest.mark.parametrize("kind", ["snapshot", "plan", "blob"])
def test_truncated_to_zero_is_object_empty(
    world: World, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """An object truncated to 0 bytes is `object-empty` on its path."""
    object_id = target_of(world, kind)
    rewrite(world.obj(object_id), lambda data: b"")
    findings = check(
        capsys,
        world.root,
        [("object-empty", ERROR, world.rel(world.obj(object_id)), object_id, None)],
        cascade=CHAIN_CODES,
    )
    if kind == "snapshot":
        slot = world.slot_rel("plain/1", 2)
        assert ("slot-corrupt", ERROR, slot, hash_bytes(b""), "plain/1") in map(row, findings)


@pytest.mark.parametrize("kind", ["snapshot", "plan", "blob"])
def test_truncated_by_one_byte_is_a_hash_mismatch(
    world: World, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """An object one byte short no longer hashes to its name: `hash-mismatch`; a slot of
    those bytes says the body is truncated."""
    object_id = target_of(world, kind)
    rewrite(world.obj(object_id), lambda data: data[:-1])
    findings = check(
        capsys,
        world.root,
        [("hash-mismatch", ERROR, world.rel(world.obj(object_id)), object_id, None)],
        cascade=CHAIN_CODES,
    )
    if kind == "snapshot":
        [corrupt] = [f for f in findings if f.code == "slot-corrupt"]
        assert (world.slot_rel("plain/1", 2), "plain/1") == (corrupt.path, corrupt.task)
        assert "truncated" in corrupt.message


def test_truncated_object_under_its_own_hash_is_truncated(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes one short of their header's length, named by their own blake3: `truncated`."""
    short = world.obj(world.blob).read_bytes()[:-1]
    object_id = put_raw(world.store, short)
    [finding, *_] = check(
        capsys,
        world.root,
        [("truncated", ERROR, world.rel(world.obj(object_id)), object_id, None)],
        cascade=("unreachable-object",),
    )
    assert "truncated" in finding.message


def test_valid_object_under_a_wrong_name(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy of a valid object under another name: `object-wrong-name`, naming its real id."""
    name = "ab" + "0" * 62
    path = Path(world.root, "objects", "ab", name)
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(world.obj(world.blob).read_bytes())
    path.chmod(0o444)
    [finding, *_] = check(
        capsys,
        world.root,
        [("object-wrong-name", ERROR, world.rel(path), name, None)],
        cascade=("unreachable-object",),
    )
    assert world.blob in finding.message


def test_object_replaced_by_another_valid_object(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A blob file holding another (stored) blob's bytes: `object-wrong-name`; the step that
    names it is reported too."""
    other = world.store.put_blob("another value").blob
    rewrite(world.obj(world.blob), lambda _: world.obj(other).read_bytes())
    check(
        capsys,
        world.root,
        [
            ("object-wrong-name", ERROR, world.rel(world.obj(world.blob)), world.blob, None),
            (
                "missing-object",
                ERROR,
                world.slot_rel("plain/2", 2),
                world.snaps["plain/2"][2],
                "plain/2",
            ),
        ],
        cascade=("unreachable-object",),
    )


def craft(kind: bytes, body: bytes, version: bytes = b"1") -> bytes:
    return b"castore %s %s %d\n%s" % (version, kind, len(body), body)


@pytest.mark.parametrize(
    ("code", "data"),
    [
        ("unknown-kind", craft(b"widget", b"{}")),
        ("unknown-version", craft(b"blob", b"{}", version=b"3")),
        ("bad-header", b"hello world\n"),
        ("bad-header", b"no newline at all"),
        ("undecodable", craft(b"blob", b"{x}")),
        ("undecodable", craft(b"blob", b'"\xff"')),
        ("not-canonical", craft(b"blob", b'{"b": 1, "a": 2}')),
        ("not-canonical", craft(b"blob", b'{"b":1,"a":2}')),
        ("schema-invalid", codec.frame("plan", codec.encode_value({"name": "p"}))),
        (
            "schema-invalid",
            codec.frame("plan", codec.encode_value({"name": "p", "steps": [{"id": 1}]})),
        ),
        ("schema-invalid", codec.frame("plan", codec.encode_value({"name": "p", "steps": []}))),
        ("schema-invalid", codec.frame("snapshot", codec.encode_value({"task": "x"}))),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_crafted_object_named_by_its_hash(
    world: World, capsys: pytest.CaptureFixture[str], code: str, data: bytes
) -> None:
    """An object whose name matches its bytes but whose header or body is wrong gets the
    code that says what is wrong with it."""
    object_id = put_raw(world.store, data)
    check(
        capsys,
        world.root,
        [(code, ERROR, world.rel(world.obj(object_id)), object_id, None)],
        cascade=("unreachable-object",),
    )


def test_writable_object_is_a_warning(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """An object file someone made writable (chmod u+w): `writable-object`, exit status 0."""
    world.obj(world.blob).chmod(0o644)
    [finding] = check(
        capsys,
        world.root,
        [("writable-object", WARNING, world.rel(world.obj(world.blob)), world.blob, None)],
    )
    assert "644" in finding.message


@pytest.mark.parametrize("where", ["quarantine", "elsewhere-in-fanout"])
def test_hard_linked_object_is_a_warning(
    world: World, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """An extra hard link to a plan object anywhere in the store: `hard-linked-object`."""
    plan_id = world.plans["plain/1"]
    source = world.obj(plan_id)
    target = {
        "quarantine": Path(world.root, "quarantine", "kept-copy"),
        "tmp-name": source.parent / ".tmp-otherhost-77-0123456789ab",
        "elsewhere-in-fanout": Path(world.root, "objects", "00", "copy-of-plan"),
    }[where]
    target.parent.mkdir(exist_ok=True)
    os.link(source, target)
    cascade = {"quarantine": (), "tmp-name": ("temp-file",), "elsewhere-in-fanout": ("stray-file",)}
    [finding] = [
        f
        for f in check(
            capsys,
            world.root,
            [("hard-linked-object", WARNING, world.rel(source), plan_id, None)],
            cascade=cascade[where],
        )
        if f.code == "hard-linked-object"
    ]
    assert "2 names" == finding.message


def test_a_leftover_temp_link_explains_the_extra_name(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash between link() and unlink() of the temp file leaves the temp as a second name
    of the object: only `temp-file` (info) is reported, not `hard-linked-object`."""
    plan_id = world.plans["plain/1"]
    source = world.obj(plan_id)
    leftover = source.parent / ".tmp-otherhost-77-0123456789ab"
    os.link(source, leftover)
    found = [row(f) for f in fsck(world.root)]
    assert [("temp-file", INFO, world.rel(leftover), None, None)] == found


def test_snapshot_with_a_third_name_is_hard_linked(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot has two names (object and slot); a third is `hard-linked-object`."""
    snapshot_id = world.snaps["shop/1"][1]
    os.link(world.obj(snapshot_id), Path(world.root, "quarantine-copy"))
    check(
        capsys,
        world.root,
        [
            ("hard-linked-object", WARNING, world.rel(world.obj(snapshot_id)), snapshot_id, None),
            ("unknown-file", WARNING, "quarantine-copy", None, None),
        ],
    )


def make_unsafe(path: Path, what: str) -> None:
    path.unlink()
    if what == "symlink":
        path.symlink_to("/etc/passwd")
    elif what == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()


@pytest.mark.parametrize("what", ["symlink", "fifo", "directory"])
def test_unsafe_file_in_place_of_an_object(
    world: World, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    """A symlink, FIFO or directory where a blob belongs: `unsafe-file`, never followed or
    blocked on; the step that names the blob reports it missing."""
    path = world.obj(world.blob)
    make_unsafe(path, what)
    [finding, *_] = check(
        capsys,
        world.root,
        [
            ("unsafe-file", ERROR, world.rel(path), world.blob, None),
            (
                "missing-object",
                ERROR,
                world.slot_rel("plain/2", 2),
                world.snaps["plain/2"][2],
                "plain/2",
            ),
        ],
        unblock=path if what == "fifo" else None,
    )
    assert {"symlink": "symlink", "fifo": "FIFO", "directory": "directory"}[what] in (
        finding.message
    )


@pytest.mark.parametrize("what", ["symlink", "fifo", "directory"])
def test_unsafe_file_in_place_of_a_snapshot_object_names_the_task(
    world: World, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    """A FIFO (etc.) where a middle snapshot object belongs is `unsafe-file`, and the task
    whose chain needs that object is named by an error too (resume refuses it)."""
    snapshot_id = world.snaps["plain/1"][2]
    path = world.obj(snapshot_id)
    make_unsafe(path, what)
    findings = check(
        capsys,
        world.root,
        [("unsafe-file", ERROR, world.rel(path), snapshot_id, None)],
        cascade=CHAIN_CODES,
        unblock=path if what == "fifo" else None,
    )
    with pytest.raises(castore.ChainError):
        world.store.verify("plain/1")
    assert any(f.task == "plain/1" and f.severity is Severity.ERROR for f in findings), findings


# --------------------------------------------------------------------------- the tree


def test_stray_and_badly_named_files_in_a_fanout_dir(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files in a fan-out directory that are not object ids (wrong case, length, a note):
    `stray-file` warnings, exit status 0."""
    names = ["notes.txt", "AB" * 32, "ab" * 31, "ab" * 32 + "0", ".tmp-no-pid"]
    Path(world.root, "objects", "ab").mkdir(exist_ok=True)
    for name in names:
        Path(world.root, "objects", "ab", name).write_text("x")
    check(
        capsys,
        world.root,
        [("stray-file", WARNING, f"objects/ab/{name}", None, None) for name in names],
    )


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_object_in_the_wrong_fanout_dir(
    world: World, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """A valid object file moved or copied to another fan-out directory: `misplaced-object`
    (a moved blob is also missing for the step that names it)."""
    wrong = Path(world.root, "objects", "00" if world.blob[:2] != "00" else "01", world.blob)
    wrong.parent.mkdir(exist_ok=True)
    shutil.copy2(world.obj(world.blob), wrong)
    expected: list[Row] = [("misplaced-object", ERROR, world.rel(wrong), world.blob, None)]
    if how == "moved":
        world.obj(world.blob).unlink()
        expected.append(
            (
                "missing-object",
                ERROR,
                world.slot_rel("plain/2", 2),
                world.snaps["plain/2"][2],
                "plain/2",
            )
        )
    check(capsys, world.root, expected, cascade=("unreachable-object",))


def test_unknown_files_at_the_top_level(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """A file or directory at the top of the store that castore did not write: `unknown-file`."""
    Path(world.root, "README").write_text("x")
    Path(world.root, "backup").mkdir()
    check(
        capsys,
        world.root,
        [
            ("unknown-file", WARNING, "README", None, None),
            ("unknown-file", WARNING, "backup", None, None),
        ],
    )


def test_top_level_directory_replaced_by_a_file(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """`quarantine` as a file (where castore wants a directory): `unsafe-file`."""
    Path(store.root, "quarantine").write_text("x")
    check(capsys, store.root, [("unsafe-file", ERROR, "quarantine", None, None)])


def test_bad_fanout_entries(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """Entries of objects/ that are not two-hex-digit directories: `bad-fanout`; a symlink
    in place of a fan-out directory: `unsafe-file`."""
    Path(world.root, "objects", "zz").mkdir()
    Path(world.root, "objects", "AB").mkdir()
    Path(world.root, "objects", "abc").mkdir()
    Path(world.root, "objects", "cd.txt").write_text("x")
    taken = set(os.listdir(Path(world.root, "objects")))
    empty = Path(
        world.root, "objects", next(f"{n:02x}" for n in range(256) if f"{n:02x}" not in taken)
    )
    empty.symlink_to("/tmp")  # a symlink in place of a fan-out directory
    check(
        capsys,
        world.root,
        [
            *[
                ("bad-fanout", WARNING, f"objects/{name}", None, None)
                for name in ("zz", "AB", "abc", "cd.txt")
            ],
            ("unsafe-file", ERROR, world.rel(empty), None, None),  # never followed
        ],
    )


@pytest.mark.parametrize("name", ["objects", "tasks"])
def test_missing_top_level_directory(
    world: World, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A store without objects/ or tasks/: `missing-directory` (and, for objects/, every
    chain is reported), never a crash."""
    shutil.rmtree(Path(world.root, name))
    check(
        capsys,
        world.root,
        [("missing-directory", ERROR, name, None, None)],
        cascade=CHAIN_CODES,
    )


def test_temp_file_at_the_top_level(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A temp file next to castore.json (an interrupted write of the marker): `temp-file`."""
    Path(store.root, ".tmp-myhost-99-0123456789ab").write_bytes(b"{")
    check(capsys, store.root, [("temp-file", INFO, ".tmp-myhost-99-0123456789ab", None, None)])


def test_leftover_temp_files_are_info_with_their_age(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Temp files of interrupted writes (objects and slots): `temp-file`, with writer and age."""
    old = Path(world.root, "objects", "ab", ".tmp-myhost-4242-0123456789ab")
    old.parent.mkdir(exist_ok=True)
    old.write_bytes(b"half an object")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    young = world.slot("plain/1", 0).parent / ".tmp-myhost-4243-0123456789ac"
    young.write_bytes(b"")
    findings = check(capsys, world.root, [("temp-file", INFO, world.rel(old), None, None)])
    messages = {f.path: f.message for f in findings if f.code == "temp-file"}
    assert {world.rel(old), world.rel(young)} == set(messages)
    assert "written by myhost pid 4242, 2.0 h old" == messages[world.rel(old)]
    assert messages[world.rel(young)].startswith("written by myhost pid 4243, ")
    assert messages[world.rel(young)].endswith(" s old")


def test_temp_file_in_a_chain_names_its_task(world: World) -> None:
    """A temp file in a task's chain directory names the task, as every other finding under
    tasks/<task>/ does (a stray file there does)."""
    young = world.slot("plain/1", 0).parent / ".tmp-myhost-4243-0123456789ac"
    young.write_bytes(b"")
    stray = world.slot("plain/1", 0).parent / "stray"
    stray.write_bytes(b"")
    found = [row(f) for f in fsck(world.root)]
    assert ("stray-file", WARNING, world.rel(stray), None, "plain/1") in found
    assert ("temp-file", INFO, world.rel(young), None, "plain/1") in found


def test_unreachable_object_is_info(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """A blob no task refers to (a write whose commit never came): `unreachable-object`."""
    blob = world.store.put_blob({"orphan": True}).blob
    check(
        capsys, world.root, [("unreachable-object", INFO, world.rel(world.obj(blob)), blob, None)]
    )


@pytest.mark.parametrize("damage", ["none", "parent-damaged", "slot-replaced"])
def test_what_fsck_calls_unreachable_gc_would_remove(world: World, damage: str) -> None:
    """`unreachable-object` says "gc removes it after the grace period": every object fsck
    calls unreachable is one gc would remove once the grace period has passed (gc keeps an
    object a later snapshot names as its parent, and everything when a slot is unreadable)."""
    orphan = world.store.put_blob("orphan").blob
    named = world.snaps["plain/1"][2]  # slot 3 names it as its parent
    if damage == "parent-damaged":
        rewrite(world.obj(named), lambda data: data[:-1])
    elif damage == "slot-replaced":
        replace_file(world.slot("plain/1", 2), world.slot("plain/2", 2).read_bytes())
    unreachable = {f.path for f in fsck(world.root) if f.code == "unreachable-object"}
    # With an unreadable slot nothing is called unreachable: gc keeps everything then.
    listed = damage != "parent-damaged"
    assert listed == (world.rel(world.obj(orphan)) in unreachable)
    future = time.time() + 400 * 86400
    would_remove = set(castore.maintenance.gc.collect(world.root, dry_run=True, now=future).removed)
    assert set() == unreachable - would_remove


def test_a_name_with_a_newline_in_a_fanout_directory_is_a_stray_file(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name made of two object ids joined by a newline is not an object (listing the
    fan-out directory checks names in bulk, one per line)."""
    fanout = world.obj(world.plans["plain/1"]).parent
    odd = fanout / (fanout.name + "a" * 62 + "\n" + fanout.name + "b" * 62)
    odd.write_bytes(b"junk")
    check(capsys, world.root, [("stray-file", WARNING, world.rel(odd), None, None)])


def test_a_symlinked_fanout_directory_is_never_read_through(
    world: World, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The fan-out directory of a plan replaced by a symlink to a copy outside the store: its
    objects are not indexed, and the chains that name the plan do not find it either."""
    plan = world.plans["plain/1"]
    fanout = world.obj(plan).parent
    fanout.rename(tmp_path / "elsewhere")
    fanout.symlink_to(tmp_path / "elsewhere")
    first = world.snaps["plain/1"][0]
    findings = check(
        capsys,
        world.root,
        [
            ("unsafe-file", ERROR, world.rel(fanout), None, None),
            ("missing-object", ERROR, world.slot_rel("plain/1", 0), first, "plain/1"),
        ],
        cascade=CHAIN_CODES,
    )
    assert not any(f.message.endswith("it is a plan") for f in findings)


def test_a_device_in_place_of_a_slot_is_unsafe_and_never_read(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A character device (/dev/zero's numbers) where slot 4 belongs: `unsafe-file`, and fsck
    ends (reading it would never end)."""
    slot = world.slot("plain/1", 4)
    slot.unlink()
    try:
        os.mknod(slot, 0o444 | stat.S_IFCHR, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs root")
    check(
        capsys,
        world.root,
        [("unsafe-file", ERROR, world.slot_rel("plain/1", 4), None, "plain/1")],
        cascade=CHAIN_CODES,
    )


def test_slots_whose_objects_are_gone_are_reported_in_slot_order(world: World) -> None:
    """Whatever the string hash seed, the nameless slots' `snapshot-name-lost` (v2; v1 says
    `slot-not-published`, from the same code path) come in slot order."""
    for seq in range(5):
        world.obj(world.snaps["plain/1"][seq]).unlink()
    expected = [world.slot_rel("plain/1", seq) for seq in range(5)]
    code = (
        "import sys, castore.maintenance.fsck as fsck\n"
        "import castore.maintenance.fsck.workers as workers\n"
        "workers.PARALLEL_TASKS = 1\n"
        "for f in fsck.check_store(sys.argv[1], jobs=int(sys.argv[2])):\n"
        "    if f.code == 'snapshot-name-lost': print(f.path)\n"
    )
    for seed, jobs in (("1", 1), ("2", 1), ("3", 2), ("4", 2)):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, world.root, str(jobs)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert expected == out.splitlines(), (seed, jobs)


def test_slot_findings_of_clean_and_damaged_slots_come_in_slot_order(world: World) -> None:
    """Slots 0 and 2 of plain/2 lose their objects; slot 0 is also writable (so it takes the
    full check, slot 2 the short one): `snapshot-name-lost` still comes for 0, then 2."""
    for seq in (0, 2):
        world.obj(world.snaps["plain/2"][seq]).unlink()
    world.slot("plain/2", 0).chmod(0o644)
    found = [f.path for f in fsck(world.root) if f.code == "snapshot-name-lost"]
    assert [world.slot_rel("plain/2", 0), world.slot_rel("plain/2", 2)] == found


@pytest.mark.parametrize("where", ["blob", "slot"])
def test_deeply_nested_bodies_are_undecodable_not_a_crash(
    world: World, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """A body nested 100,000 levels deep: a finding (the decoders would recurse too deep)."""
    body = b"[" * 100_000 + b"]" * 100_000
    if where == "blob":
        object_id = put_raw(world.store, codec.frame("blob", body))
        expected = [("undecodable", ERROR, f"objects/{object_id[:2]}/{object_id}", object_id, None)]
        check(capsys, world.root, expected, cascade=("unreachable-object",))
    else:
        replace_file(world.slot("plain/1", 4), codec.frame("snapshot", body))
        findings = fsck(world.root)
        corrupt = [f for f in findings if f.code == "slot-corrupt"]
        assert [world.slot_rel("plain/1", 4)] == [f.path for f in corrupt]


def test_task_check_covers_what_a_slot_that_is_no_snapshot_still_names(world: World) -> None:
    """--task: slot 2 of plain/2 decodes but has an extra field, so it is no Snapshot record;
    the blob it names (damaged here) is checked anyway, as gc keeps it."""
    slot = world.slot("plain/2", 2)
    entry = json.loads(codec.unframe(slot.read_bytes())[1])
    assert entry["transition"]["result_ref"] == world.blob
    replace_file(slot, codec.frame("snapshot", codec.encode_value({**entry, "extra": 1})))
    rewrite(world.obj(world.blob), lambda data: data[:-1])
    codes = {(f.code, f.object_id) for f in fsck(world.root, task="plain/2")}
    assert ("hash-mismatch", world.blob) in codes
    assert ("slot-corrupt", hash_bytes(slot.read_bytes())) in codes


def test_two_checks_consumed_in_turn_do_not_mix(world: World, tmp_path: Path) -> None:
    """Two check_store generators over different stores, consumed in turn in one process,
    each find what they find alone."""
    other = tmp_path / "other"
    clone_tree(world.root, str(other))
    (Path(world.root) / "notes.txt").write_text("a")
    (other / "notes.txt").write_text("b")
    (other / "objects" / world.blob[:2] / world.blob).unlink()
    alone = [row(f) for f in check_store(world.root, jobs=1)]
    other_alone = [row(f) for f in check_store(str(other), jobs=1)]
    assert alone != other_alone
    mine, theirs = check_store(world.root, jobs=1), check_store(str(other), jobs=1)
    first = row(next(mine))
    assert other_alone == [row(f) for f in theirs]
    assert alone == [first, *(row(f) for f in mine)]


# --------------------------------------------------------------------------- chains


def test_missing_parent_object_is_a_lost_name_in_v2(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A middle snapshot object deleted from objects/ while its slot remains, in a v2 store
    (a power loss may leave this): `snapshot-name-lost`, a warning, on the slot, naming the
    snapshot and the task. v1 keeps `slot-not-published`: test_lost_names.py."""
    snapshot_id = world.snaps["plain/1"][2]
    world.obj(snapshot_id).unlink()
    check(
        capsys,
        world.root,
        [("snapshot-name-lost", WARNING, world.slot_rel("plain/1", 2), snapshot_id, "plain/1")],
    )


def test_missing_slot_and_object_is_a_slot_gap(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A middle snapshot gone from both objects/ and its chain: `slot-gap` on the chain."""
    snapshot_id = world.snaps["plain/1"][2]
    world.obj(snapshot_id).unlink()
    world.slot("plain/1", 2).unlink()
    [finding] = check(
        capsys,
        world.root,
        [("slot-gap", ERROR, f"tasks/{encode_task_id('plain/1')}/chain", None, "plain/1")],
    )
    assert "[2]" in finding.message


def test_a_slot_named_with_the_largest_sequence_is_checked_without_counting_to_it(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy of slot 1 named 9999999999999999: `slot-gap` (counted, the first ten listed)
    and `seq-mismatch` there, found at once. fsck used to build the set of every missing
    number, and never finished."""
    last = "9" * 16
    shutil.copyfile(world.slot("plain/1", 1), world.slot("plain/1", 1).with_name(last))
    chain = f"tasks/{encode_task_id('plain/1')}/chain"
    head = len(world.snaps["plain/1"])
    findings = check(
        capsys,
        world.root,
        [
            ("slot-gap", ERROR, chain, None, "plain/1"),
            ("seq-mismatch", ERROR, f"{chain}/{last}", world.snaps["plain/1"][1], "plain/1"),
        ],
        cascade=("slot-not-published",),
    )
    [gap] = [f for f in findings if f.code == "slot-gap"]
    listed = ", ".join(str(seq) for seq in range(head, head + 10))
    assert f"missing slots [{listed}, ...] ({10**16 - 1 - head} in all)" == gap.message


def test_chain_ending_at_another_tasks_root(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slot 0 holding another task's start snapshot: `foreign-snapshot` there, and the
    snapshot after it no longer links to it."""
    replace_file(world.slot("plain/1", 0), world.slot("plain/2", 0).read_bytes())
    check(
        capsys,
        world.root,
        [
            (
                "foreign-snapshot",
                ERROR,
                world.slot_rel("plain/1", 0),
                world.snaps["plain/2"][0],
                "plain/1",
            ),
            (
                "broken-link",
                ERROR,
                world.slot_rel("plain/1", 1),
                world.snaps["plain/1"][1],
                "plain/1",
            ),
            (
                "plan-changed",
                ERROR,
                world.slot_rel("plain/1", 1),
                world.snaps["plain/1"][1],
                "plain/1",
            ),
        ],
        cascade=("unreachable-object",),
    )


def test_foreign_snapshot_spliced_into_a_chain(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slot 2 holding another task's snapshot 2: `foreign-snapshot` and `broken-link` there,
    `broken-link` after it, and the plan change is reported."""
    foreign = world.snaps["plain/2"][2]
    replace_file(world.slot("plain/1", 2), world.slot("plain/2", 2).read_bytes())
    slot2, slot3 = world.slot_rel("plain/1", 2), world.slot_rel("plain/1", 3)
    check(
        capsys,
        world.root,
        [
            ("foreign-snapshot", ERROR, slot2, foreign, "plain/1"),
            ("broken-link", ERROR, slot2, foreign, "plain/1"),
            ("plan-changed", ERROR, slot2, foreign, "plain/1"),
            ("broken-link", ERROR, slot3, world.snaps["plain/1"][3], "plain/1"),
        ],
        cascade=("unreachable-object", "plan-changed"),
    )


def test_snapshot_of_another_sequence_is_seq_mismatch(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slot 3 holding the task's own snapshot 1: `seq-mismatch` and `broken-link`."""
    replace_file(world.slot("plain/1", 3), world.slot("plain/1", 1).read_bytes())
    slot3, slot4 = world.slot_rel("plain/1", 3), world.slot_rel("plain/1", 4)
    own1 = world.snaps["plain/1"][1]
    [mismatch, *_] = check(
        capsys,
        world.root,
        [
            ("seq-mismatch", ERROR, slot3, own1, "plain/1"),
            ("broken-link", ERROR, slot3, own1, "plain/1"),
            ("broken-link", ERROR, slot4, world.snaps["plain/1"][4], "plain/1"),
        ],
        cascade=("unreachable-object", "bad-frontier"),
    )
    assert "slot 3 holds sequence 1" == mismatch.message


def test_foreign_snapshot_of_another_sequence(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slot 2 holding another task's snapshot 1: foreign, wrong sequence and broken link."""
    foreign = world.snaps["plain/2"][1]
    replace_file(world.slot("plain/1", 2), world.slot("plain/2", 1).read_bytes())
    slot2 = world.slot_rel("plain/1", 2)
    check(
        capsys,
        world.root,
        [
            ("foreign-snapshot", ERROR, slot2, foreign, "plain/1"),
            ("seq-mismatch", ERROR, slot2, foreign, "plain/1"),
            ("broken-link", ERROR, slot2, foreign, "plain/1"),
        ],
        cascade=CHAIN_CODES,
    )


def test_forged_back_link_is_a_broken_link(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forged snapshot at slot 2 naming slot 3 as its parent (the nearest thing to a cycle
    content addressing allows): `broken-link` at slots 2 and 3."""
    _, head = world.store.history("plain/1")[2]  # the snapshot at seq 2
    forged = attrs.evolve(head, parent=world.snaps["plain/1"][3])
    data = encode_snapshot(forged, RunSettings())
    forged_id = world.store.objects.put_framed(data)
    world.slot("plain/1", 2).unlink()
    os.link(world.obj(forged_id), world.slot("plain/1", 2))
    check(
        capsys,
        world.root,
        [
            ("broken-link", ERROR, world.slot_rel("plain/1", 2), forged_id, "plain/1"),
            (
                "broken-link",
                ERROR,
                world.slot_rel("plain/1", 3),
                world.snaps["plain/1"][3],
                "plain/1",
            ),
        ],
        cascade=("unreachable-object",),
    )


def test_task_directory_problems(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """A task without a chain (`no-chain`), a directory that no task id encodes to
    (`bad-task-name`), a stranger in a task directory (`unknown-file`), a chain entry that
    is no slot name (`stray-file`)."""
    Path(world.root, "tasks", "nochain").mkdir()
    Path(world.root, "tasks", "Bad.Name").mkdir()
    task_dir = Path(world.store.layout.task_dir("plain/1"))
    (task_dir / "notes").write_text("x")
    for name in ("000000000000000x", "5", "0" * 17):
        (task_dir / "chain" / name).write_text("")
    rel = world.rel(task_dir)
    check(
        capsys,
        world.root,
        [
            ("no-chain", WARNING, "tasks/nochain/chain", None, "nochain"),
            ("bad-task-name", WARNING, "tasks/Bad.Name", None, None),
            ("unknown-file", WARNING, f"{rel}/notes", None, "plain/1"),
            ("stray-file", WARNING, f"{rel}/chain/000000000000000x", None, "plain/1"),
            ("stray-file", WARNING, f"{rel}/chain/5", None, "plain/1"),
            ("stray-file", WARNING, f"{rel}/chain/{'0' * 17}", None, "plain/1"),
        ],
    )


HEAD_SEQ = 4


@pytest.mark.parametrize("damage", ["empty", "trailing-garbage", "a-plan", "a-blob", "half"])
def test_malformed_head_slot_is_slot_corrupt(
    world: World, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """HEAD's slot empty, with trailing garbage, half written, or holding a plan or a blob
    object instead of a snapshot: `slot-corrupt` on the slot, naming the task."""
    head = world.slot("plain/1", HEAD_SEQ)
    good = head.read_bytes()
    data = {
        "empty": b"",
        "trailing-garbage": good + b"garbage",
        "half": good[: len(good) // 2],
        "a-plan": world.obj(world.plans["plain/1"]).read_bytes(),
        "a-blob": world.obj(world.blob).read_bytes(),
    }[damage]
    replace_file(head, data)
    check(
        capsys,
        world.root,
        [("slot-corrupt", ERROR, world.rel(head), hash_bytes(data), "plain/1")],
        cascade=("slot-not-published", "unreachable-object"),
    )


@pytest.mark.parametrize("what", ["symlink", "fifo", "directory"])
def test_unsafe_file_in_place_of_the_head_slot(
    world: World, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    """A symlink, FIFO or directory as HEAD's slot: `unsafe-file` on the slot, never followed."""
    head = world.slot("plain/1", HEAD_SEQ)
    make_unsafe(head, what)
    check(
        capsys,
        world.root,
        [("unsafe-file", ERROR, world.rel(head), None, "plain/1")],
        cascade=("unreachable-object",),
        unblock=head if what == "fifo" else None,
    )


@pytest.mark.parametrize("what", ["fifo", "directory", "symlink"])
def test_unsafe_lock_file(world: World, capsys: pytest.CaptureFixture[str], what: str) -> None:
    """Something other than a regular file as a task's lock file: `unsafe-file`."""
    lock = Path(world.store.layout.lock_path("plain/2"))
    make_unsafe(lock, what)
    check(
        capsys,
        world.root,
        [("unsafe-file", ERROR, world.rel(lock), None, "plain/2")],
        unblock=lock if what == "fifo" else None,
    )


# --------------------------------------------------------------------------- effects and plans


def test_illegal_effect_transition(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forged snapshot moving an effect PLANNED -> CONFIRMED: `illegal-transition`."""
    with store.start("shop/2", SHOP) as run:
        run.commit_step("price", 1)
    assert EffectState.PLANNED == run.head.effects[0].state
    forged, seq = forge(
        store,
        "shop/2",
        transition=Transition(
            TransitionKind.EFFECT,
            step="charge",
            effect_from=EffectState.PLANNED,
            effect_to=EffectState.CONFIRMED,
            receipt="forged",
        ),
        effects=(),
        frontier=Frontier(2, "email"),
    )
    [finding] = check(
        capsys,
        store.root,
        [("illegal-transition", ERROR, f"tasks/shop%2F2/chain/{seq:016d}", forged, "shop/2")],
    )
    assert "charge: PLANNED -> CONFIRMED is not allowed" == finding.message


def test_effect_record_changed_without_a_transition(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain step whose snapshot also flips an effect to SUBMITTED: `illegal-transition`."""
    with store.start("shop/2", SHOP) as run:
        run.commit_step("price", 1)
    record = run.head.effects[0]
    forged, seq = forge(
        store,
        "shop/2",
        transition=Transition(TransitionKind.STEP, step="price", result=2),
        effects=(attrs.evolve(record, state=EffectState.SUBMITTED),),
    )
    check(
        capsys,
        store.root,
        [("illegal-transition", ERROR, f"tasks/shop%2F2/chain/{seq:016d}", forged, "shop/2")],
    )


def test_keyless_effect_in_flight(store: castore.Store, capsys: pytest.CaptureFixture[str]) -> None:
    """A forged SUBMITTED record without a key: `keyless-effect`."""
    with store.start("shop/2", SHOP) as run:
        run.commit_step("price", 1)
    record = run.head.effects[0]
    forged, seq = forge(
        store,
        "shop/2",
        transition=Transition(
            TransitionKind.EFFECT,
            step="charge",
            effect_from=EffectState.PLANNED,
            effect_to=EffectState.SUBMITTED,
        ),
        effects=(attrs.evolve(record, state=EffectState.SUBMITTED, key=None),),
    )
    check(
        capsys,
        store.root,
        [("keyless-effect", ERROR, f"tasks/shop%2F2/chain/{seq:016d}", forged, "shop/2")],
    )


def test_frontier_outside_the_plan(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forged snapshot whose frontier names no step of the plan: `bad-frontier`."""
    with store.start("p/1", PLAIN) as run:
        run.commit_step("a", 1)
    forged, seq = forge(
        store,
        "p/1",
        transition=Transition(TransitionKind.STEP, step="b", result=2),
        frontier=Frontier(2, "zz"),
    )
    check(
        capsys,
        store.root,
        [("bad-frontier", ERROR, f"tasks/p%2F1/chain/{seq:016d}", forged, "p/1")],
    )


def test_start_snapshot_after_sequence_0(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forged `start` transition at sequence 1: `root-not-start`."""
    with store.start("p/1", PLAIN):
        pass
    forged, seq = forge(store, "p/1", transition=Transition(TransitionKind.START))
    check(
        capsys,
        store.root,
        [("root-not-start", ERROR, f"tasks/p%2F1/chain/{seq:016d}", forged, "p/1")],
    )


def test_plan_changed_without_override(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forged step that also swaps the plan (no override snapshot): `plan-changed`."""
    with store.start("p/1", PLAIN) as run:
        run.commit_step("a", 1)
    renamed = castore.Plan.build("renamed", "a", "b", "c", "d")
    forged, seq = forge(
        store,
        "p/1",
        plan=store.put_plan(renamed),
        transition=Transition(TransitionKind.STEP, step="b", result=2),
        frontier=Frontier(2, "c"),
    )
    check(
        capsys,
        store.root,
        [("plan-changed", ERROR, f"tasks/p%2F1/chain/{seq:016d}", forged, "p/1")],
    )


def unresolved(store: castore.Store, task: str) -> None:
    with store.start(task, SHOP) as run:
        run.commit_step("price", 1)
        with pytest.raises(ConnectionError), run.effect("charge", NEITHER):
            raise ConnectionError("connection dropped after the request was sent")
    with store.open_task(task, SHOP) as run:
        assert castore.Action.ESCALATE == run.settle(NEITHER).action


def test_unresolved_effect_is_a_warning(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """HEAD with an UNRESOLVED effect: `effect-unresolved` warning, exit status 0."""
    unresolved(store, "u/1")
    head_id, head = store.history("u/1")[0]
    [finding] = check(
        capsys,
        store.root,
        [("effect-unresolved", WARNING, f"tasks/u%2F1/chain/{head.seq:016d}", head_id, "u/1")],
    )
    assert head.effects[0].key in finding.message


def test_effect_submitted_for_long_is_stuck(
    store: castore.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """An effect SUBMITTED 10 minutes ago: `effect-stuck` with --stuck-after 1s, nothing with
    the default (1 h)."""
    then = time.time_ns() // 1_000_000 - 600_000
    old = castore.Store.open(store.root, clock=lambda: then)
    with old.start("s/1", SHOP) as run:
        run.commit_step("price", 1)
        with pytest.raises(ConnectionError), run.effect("charge", NEITHER):
            raise ConnectionError("no answer")
    head_id, head = store.history("s/1")[0]
    assert EffectState.SUBMITTED == head.effects[0].state
    assert [] == fsck(store.root)
    [finding] = check(
        capsys,
        store.root,
        [("effect-stuck", WARNING, f"tasks/s%2F1/chain/{head.seq:016d}", head_id, "s/1")],
        stuck_after=1.0,
    )
    assert "effect 'charge' SUBMITTED 0.2 h ago" == finding.message


HOLDER = """
import sys
import castore
store = castore.Store.open(sys.argv[1])
run = store.open_task(sys.argv[2], castore.Plan.build("held", "x", "y"))
print("ready", flush=True)
sys.stdin.readline()
run.close()
"""


@pytest.fixture
def lock_holder(store: castore.Store) -> Iterator[subprocess.Popen[str]]:
    """A child process holding task held/1's lock until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, store.root, "held/1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "ready" == read_line(proc).strip()
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=DEADLINE)


def test_lock_held_by_a_live_process_is_info(
    store: castore.Store, capsys: pytest.CaptureFixture[str], lock_holder: subprocess.Popen[str]
) -> None:
    """A task whose lock a running worker holds: `lock-held` info; fsck does not wait for it."""
    check(capsys, store.root, [("lock-held", INFO, "tasks/held%2F1/lock", None, "held/1")])
    assert lock_holder.stdin is not None
    lock_holder.stdin.close()
    lock_holder.wait(timeout=DEADLINE)
    assert [] == fsck(store.root)


# --------------------------------------------------------------------------- options


def test_task_option_checks_only_that_task(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """--task T reports T's damage and nothing of other tasks, unreachable objects or strays."""
    rewrite(world.obj(world.blob), lambda data: data[:-1])  # plain/2's blob
    world.store.put_blob("orphan")
    Path(world.root, "README").write_text("x")
    assert [] == fsck(world.root, task="plain/1")
    code, rows, summary = fsck_json(capsys, world.root, "--task", "plain/1")
    assert (0, [], 1) == (code, rows, summary["tasks"])
    assert len(world.snaps["plain/1"]) + 1 == summary["objects"]  # its snapshots and plan
    check(
        capsys,
        world.root,
        [
            ("hash-mismatch", ERROR, world.rel(world.obj(world.blob)), world.blob, None),
            (
                "missing-object",
                ERROR,
                world.slot_rel("plain/2", 2),
                world.snaps["plain/2"][2],
                "plain/2",
            ),
        ],
        task="plain/2",
    )


def test_task_option_with_an_unknown_task_is_a_usage_error(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """--task of a task the store does not have: exit status 2, one error line."""
    code, out, err = cli(capsys, "fsck", world.root, "--task", "nope")
    assert (2, "") == (code, out)
    assert err.startswith("castore: error: ")


@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_jobs_must_be_a_whole_number_of_at_least_one(
    world: World, capsys: pytest.CaptureFixture[str], jobs: str
) -> None:
    code, out, err = cli(capsys, "fsck", world.root, "--jobs", jobs)
    assert (2, "") == (code, out)
    assert "--jobs" in err


@pytest.mark.parametrize("kind", ["empty-dir", "missing", "not-castore", "future-version"])
def test_fsck_of_a_non_store_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """fsck of something that is not a store it can read: exit status 2, nothing written."""
    target = tmp_path / "target"
    if kind != "missing":
        target.mkdir()
    if kind == "not-castore":
        (target / "castore.json").write_text('{"format": "other"}')
    if kind == "future-version":
        (target / "castore.json").write_text('{"format":"castore","version":99}\n')
    before = tree_snapshot(tmp_path)
    code, out, err = cli(capsys, "fsck", str(target))
    assert (2, "") == (code, out)
    assert 1 == len(err.splitlines()), err
    assert before == tree_snapshot(tmp_path)


def test_with_other_threads_running_fsck_works_in_its_own_process(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With another thread running (a Watcher, say), no worker is forked (it would inherit
    that thread's locks as they are); fsck finds the same, in the same order, by itself."""
    rewrite(world.obj(world.blob), lambda data: data[:-1])
    alone = [row(f) for f in check_store(world.root, jobs=1)]

    def no_pool(*_: object, **__: object) -> None:
        raise AssertionError("worker processes were started")

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        with forced_pool():
            monkeypatch.setattr(castore.maintenance.fsck.workers, "ForkedMap", no_pool)
            pooled = [row(f) for f in check_store(world.root, jobs=2)]
    finally:
        stop.set()
        other.join()
    assert alone == pooled


def test_a_script_without_a_main_guard_may_run_fsck_beside_a_thread(world: World) -> None:
    """A plain script (no `if __name__ == "__main__"`) with a thread running calls
    check_store(jobs=2): its top level runs once, and it gets its findings."""
    script = Path(world.root).parent / "plain_script.py"
    script.write_text(
        "import sys, threading, castore.maintenance.fsck.workers as workers\n"
        "from castore.maintenance.fsck import check_store\n"
        "print('top level', flush=True)\n"
        "workers.PARALLEL_TASKS = workers.PARALLEL_OBJECTS = 1\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop.wait, daemon=True).start()\n"
        "print(len(list(check_store(sys.argv[1], jobs=2))), flush=True)\n"
        "stop.set()\n"
    )
    out = subprocess.run(
        [sys.executable, str(script), world.root],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert ["top level", "0"] == out.splitlines()


def test_direct_checks_use_workers_even_with_few_tasks(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few tasks but many objects to check directly (here: all unreachable ones): the direct
    checks are shared among worker processes, with the same findings."""
    for number in range(40):
        put_raw(world.store, codec.frame("blob", codec.encode_value({"n": number})))
    alone = [row(f) for f in check_store(world.root, jobs=1)]
    started: list[int] = []
    real = castore.maintenance.fsck.workers.ForkedMap

    def spy(function: Any, units: Any, jobs: int) -> Any:
        started.append(jobs)
        return real(function, units, jobs)

    monkeypatch.setattr(castore.maintenance.fsck.workers, "PARALLEL_OBJECTS", 10)
    monkeypatch.setattr(castore.maintenance.fsck.workers, "BATCH", 7)
    monkeypatch.setattr(castore.maintenance.fsck.workers, "ForkedMap", spy)
    assert (
        3 < castore.maintenance.fsck.workers.PARALLEL_TASKS
    )  # the world has 3 tasks: no task pool
    pooled = [row(f) for f in check_store(world.root, jobs=2)]
    assert [2] == started
    assert alone == pooled
    assert 40 == sum(1 for r in pooled if r[0] == "unreachable-object")


@pytest.mark.parametrize("jobs", [1, 3])
def test_progress_counts_up_to_every_object_checked(
    world: World, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    """progress(done, total) never goes back, stays below total until its last call, and
    that call says every object was checked."""
    monkeypatch.setattr(castore.maintenance.fsck.workers, "PARALLEL_TASKS", 1)
    calls: list[tuple[int, int]] = []
    summary = Summary()
    list(check_store(world.root, jobs=jobs, summary=summary, progress=lambda *c: calls.append(c)))
    assert calls[-1] == (summary.objects, summary.objects)
    assert summary.objects == sum(1 for _ in Path(world.root, "objects").glob("*/*"))
    assert all(done < total for done, total in calls[:-1])
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_transient_read_error_is_read_again(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that fails once with EIO and then succeeds is no finding."""
    real = castore.medium.fsread.read_regular_with_stat
    failed: list[str] = []

    def flaky(path: str, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, os.stat_result]:
        if not failed and "/objects/" in path:  # an object's read (the store's files share it)
            failed.append(path)
            raise OSError(errno.EIO, "Input/output error", path)
        return real(path, limit)

    monkeypatch.setattr(castore.medium.fsread, "read_regular_with_stat", flaky)
    assert [] == fsck(world.root)
    assert 1 == len(failed)


def test_persistent_read_error_is_read_error(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object that fails to read twice in a row: `read-error`, naming the errno."""
    real = castore.medium.fsread.read_regular_with_stat
    bad = str(world.obj(world.blob))
    calls: list[str] = []

    def failing(path: str, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, os.stat_result]:
        if path == bad:
            calls.append(path)
            raise OSError(errno.EIO, "Input/output error", path)
        return real(path, limit)

    monkeypatch.setattr(castore.medium.fsread, "read_regular_with_stat", failing)
    list(check_store(world.root, jobs=1))
    assert 2 == len(calls)  # read, then read once more
    findings = fsck(world.root)  # (with workers too: whichever process reads it, counted or not)
    blob_rel = world.rel(bad)
    assert ("read-error", ERROR, blob_rel, world.blob, None) in map(row, findings)
    [finding] = [f for f in findings if f.code == "read-error"]
    assert finding.message.startswith("EIO")


def test_parallel_check_finds_what_the_serial_one_finds(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks and objects checked by a process pool give the same findings, in the same
    order, as one process."""
    rewrite(world.obj(world.blob), lambda data: data[:-1])
    world.obj(world.plans["shop/1"]).chmod(0o644)
    world.obj(world.snaps["plain/1"][1]).chmod(0o644)  # a snapshot object, judged via its slot
    put_raw(world.store, craft(b"widget", b"{}"))
    serial = [row(finding) for finding in check_store(world.root, jobs=1)]
    assert {"hash-mismatch", "writable-object", "unknown-kind"} <= {r[0] for r in serial}
    monkeypatch.setattr(castore.maintenance.fsck.workers, "PARALLEL_TASKS", 1)
    monkeypatch.setattr(castore.maintenance.fsck.workers, "PARALLEL_OBJECTS", 1)
    monkeypatch.setattr(castore.maintenance.fsck.workers, "BATCH", 3)
    before = tree_snapshot(world.root)
    parallel = [row(finding) for finding in check_store(world.root, jobs=3)]
    assert before == tree_snapshot(world.root)
    assert serial == parallel


# --------------------------------------------------------------------------- quarantine


def regular_files(root: str) -> dict[str, str]:
    """relpath -> sha256 of every regular file under root."""
    return {
        path: entry[3]
        for path, entry in tree_snapshot(root).items()
        if stat.S_ISREG(entry[0]) and entry[3] is not None
    }


def test_quarantine_moves_damaged_objects_and_deletes_nothing(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """--quarantine moves each damaged object to quarantine/<stamp>/objects/xx/<id> with a
    manifest naming code and original path; deletes nothing; a second fsck reports them
    missing, not corrupt; intact, writable and newer-version objects stay where they were."""
    snapshot_id = world.snaps["plain/1"][2]
    rewrite(world.obj(world.blob), lambda data: data[:-1])  # hash-mismatch
    rewrite(world.obj(snapshot_id), lambda data: data + b"x")  # slot and object: one inode
    widget = put_raw(world.store, craft(b"widget", b"{}"))  # unknown-kind
    newer = put_raw(world.store, craft(b"blob", b"{}", version=b"3"))  # unknown-version: stays
    world.obj(world.plans["shop/1"]).chmod(0o644)  # writable: a warning, stays
    damaged = {world.blob: "hash-mismatch", snapshot_id: "hash-mismatch", widget: "unknown-kind"}
    contents_before = regular_files(world.root)

    code, out, err = cli(capsys, "fsck", world.root, "--quarantine", "--json")
    assert (1, "") == (code, err)
    lines = [json.loads(line) for line in out.splitlines()]
    [note] = [line for line in lines if line["type"] == "quarantine"]
    assert len(damaged) == note["moved"]
    base = Path(world.root, note["quarantine"])
    assert "quarantine" == base.parent.name
    assert base.parent.parent == Path(world.root)

    for object_id in damaged:
        moved = base / "objects" / object_id[:2] / object_id
        assert moved.is_file(), moved
        assert not world.obj(object_id).exists()
    assert world.obj(newer).exists()
    assert world.obj(world.plans["shop/1"]).exists()
    manifest = json.loads((base / "manifest.json").read_text())
    assert {
        (oid, code_name, world.rel(world.obj(oid)), f"{note['quarantine']}/objects/{oid[:2]}/{oid}")
        for oid, code_name in damaged.items()
    } == {(m["object"], m["code"], m["path"], m["moved_to"]) for m in manifest}

    contents_after = regular_files(world.root)
    assert len(contents_before) + 1 == len(contents_after)  # the manifest, nothing less
    assert sorted(contents_before.values()) == sorted(
        v for k, v in contents_after.items() if k != world.rel(base / "manifest.json")
    )

    findings = fsck(world.root)
    rows = list(map(row, findings))
    assert [] == [r for r in rows if r[0] in castore.maintenance.fsck.quarantine.DAMAGE]
    assert (
        "missing-object",
        ERROR,
        world.slot_rel("plain/2", 2),
        world.snaps["plain/2"][2],
        "plain/2",
    ) in rows
    assert any(
        r[0] in ("slot-not-published", "missing-object") and r[4] == "plain/1" for r in rows
    ), rows


def test_quarantine_twice_in_one_second_keeps_both_manifests(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two quarantines in the same second (same stamp) both leave a manifest naming what
    they moved: none is silently lost."""
    monkeypatch.setattr(
        castore.maintenance.fsck.quarantine.time, "strftime", lambda *_: "20260101T000000Z"
    )
    first = put_raw(world.store, craft(b"widget", b"{}"))
    assert 1 == cli(capsys, "fsck", world.root, "--quarantine")[0]
    second = put_raw(world.store, craft(b"gadget", b"{}"))
    assert 1 == cli(capsys, "fsck", world.root, "--quarantine")[0]
    manifests = list(Path(world.root, "quarantine").rglob("manifest*.json"))
    named = {m["object"] for path in manifests for m in json.loads(path.read_text())}
    assert {first, second} == named


def test_quarantine_with_nothing_damaged_writes_nothing(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """--quarantine on a clean store moves nothing and creates no directory."""
    before = tree_snapshot(world.root)
    code, out, _ = cli(capsys, "fsck", world.root, "--quarantine")
    assert 0 == code
    assert "nothing to quarantine" in out
    assert before == tree_snapshot(world.root)
