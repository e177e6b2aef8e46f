"""Build the golden stores of tests/golden/: stores written by this castore, kept forever.

    python tools/make_golden.py --version {1,2} [--out DIR]

writes DIR/v<N>/<name>/ (default DIR: tests/golden) for every store of the set: `store/`, the
store's files as git can hold them; `manifest.json`, what git cannot hold (empty directories,
file modes, which paths are one inode: a slot is a hard link of its snapshot object); and
`expected.json`, what this castore reads from the store (open, status, resume and fsck of
every task). tests/test_golden.py rebuilds each store from its manifest and checks that the
castore under test reads exactly that. Run it once per format version: a set already
committed is the compatibility contract and is never regenerated (the tool refuses to write
over one), and a change that breaks it is a format break.

Deterministic: a fixed clock, a fixed writer (host, pid, run id), no randomness in what the
scenarios do, so the same castore builds the same bytes (test_golden checks that of every set).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import castore
from castore.chain.refs import TaskSlots
from castore.cli import main as cli_main
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.layout import Layout
from castore.format.marker import marker_bytes
from castore.format.records import Writer
from castore.maintenance.fsck import Summary, check_store
from castore.maintenance.sealing import seal_task
from castore.medium import posixinit as storeinit

GOLDEN = ROOT / "tests" / "golden"
T0_MS = 1_796_029_200_000  # 2026-11-30T09:00:00Z: in the past, so ages and "stuck" are fixed
TICK_MS = 1000
NOW_MS = T0_MS + 86_400_000  # the clock status and resume are read with: one day later
MANIFEST_FORMAT = "castore golden store manifest 1"


# -- a deterministic castore ---------------------------------------------------------------
class FixedClock:
    """A clock that moves TICK_MS per reading, from T0_MS."""

    def __init__(self, start: int = T0_MS) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += TICK_MS
        return self.now


@contextlib.contextmanager
def fixed_writers() -> Iterator[None]:
    """Every run, fork and tombstone writes as host "golden", pid 4242, run id = a counter
    (no random ids): `Writer.new_run`, which each of them calls, gives the fixed one."""
    counter = itertools.count(1)
    original = Writer.__dict__["new_run"]

    def fixed(cls: type[Writer]) -> Writer:
        return cls("golden", 4242, f"{next(counter):016x}")

    Writer.new_run = classmethod(fixed)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Writer.new_run = original  # type: ignore[method-assign]


def init_store(root: Path, version: int) -> None:
    """A new, empty store whose marker names `version`, with the 256 fan-out directories
    castore's init made up front when the sets were written (since 2026-12-04 a fan-out
    directory is made by the first put of an id it holds; readers never needed them)."""
    storeinit.build(str(root), marker_bytes(version))
    for fanout in range(256):
        (root / "objects" / f"{fanout:02x}").mkdir(exist_ok=True)


# -- the scenarios of the clean store ----------------------------------------------------------
SEALED_STEPS = 40  # far below SEAL_EVERY: only the explicit seal below seals it (deterministic)
ONE_SHOT = castore.Service("mailer")  # neither idempotent nor reconcilable: a kill -> UNRESOLVED
BILLING = castore.Service("billing", idempotent=True, retention=86_400)


class Interrupted(Exception):
    """Raised inside an effect's body: the request went out, no answer came back."""


def plans(version: int = 1) -> dict[str, castore.Plan]:
    """The plan each task of the clean store ends with (the overridden one: its new plan)."""
    charge = castore.effect("charge", "prepare")
    v1 = {
        "finished": castore.Plan.build("report", "fetch", "parse", "summarize"),
        "mid-plan": castore.Plan.build("etl", "extract", "transform", "load", "verify", "publish"),
        "effect-planned": castore.Plan.build("pay", "prepare", charge),
        "effect-submitted": castore.Plan.build("pay", "prepare", charge),
        "effect-confirmed": castore.Plan.build("pay", "prepare", charge, "notify"),
        "effect-unresolved": castore.Plan.build("mail", "draft", castore.effect("send", "draft")),
        "resolved": castore.Plan.build("mail", "draft", castore.effect("send", "draft")),
        "overridden": castore.Plan.build("deploy", "build", "test", "ship", "announce"),
        "tâche/1": castore.Plan.build("unicode", "un", "deux"),
    }
    v2 = {
        "raw-and-tree": castore.Plan.build("parts", "dump", "assemble", "use"),
        "sealed": castore.Plan.build("long", *[f"s{i}" for i in range(SEALED_STEPS)]),
        "sealed-finished": castore.Plan.build("short", *[f"s{i}" for i in range(SEALED_STEPS)]),
        "forked": castore.Plan.build("etl", "extract", "transform", "load", "verify", "publish"),
        "forgotten": castore.Plan.build("gone", "a", "b"),
    }
    return {**v1, **(v2 if version >= 2 else {})}


def _submit_and_lose_answer(run: castore.Run, step: str, service: castore.Service) -> None:
    with contextlib.suppress(Interrupted), run.effect(step, service) as call:
        assert call.key
        raise Interrupted


def build_clean(root: Path, version: int) -> None:
    """The clean store: a task in every state a store of its version can hold (v2 adds raw
    and tree results, a sealed task with a tail, a sealed finished task, a fork and a
    forgotten task)."""
    init_store(root, version)
    clock = FixedClock()
    store = castore.Store.open(root, clock=clock)
    p = plans(version)
    with store.start("finished", p["finished"]) as run:
        run.commit_step("fetch", {"rows": 3, "source": "https://example.invalid/data"})
        table = store.put_blob({"table": [[i, i * i, f"row {i}"] for i in range(40)]})
        run.commit_step("parse", table)
        run.commit_step("summarize", "3 rows, all squares")
    with store.start("mid-plan", p["mid-plan"]) as run:
        run.commit_step("extract", [1, 2.5, None, True, "x"])
        run.commit_step("transform", {"nested": {"deeper": {"list": [[], {}]}}})
    with store.start("effect-planned", p["effect-planned"]) as run:
        run.commit_step("prepare", {"amount": 1200})
    with store.start("effect-submitted", p["effect-submitted"]) as run:
        run.commit_step("prepare", {"amount": 300})
        _submit_and_lose_answer(run, "charge", BILLING)
    with store.start("effect-confirmed", p["effect-confirmed"]) as run:
        run.commit_step("prepare", {"amount": 50})
        run.perform("charge", BILLING, lambda key: f"receipt-{key[-8:]}")
    for task in ("effect-unresolved", "resolved"):
        with store.start(task, p[task]) as run:
            run.commit_step("draft", "hello")
            _submit_and_lose_answer(run, "send", ONE_SHOT)
        with store.resume(task, p[task]) as run:
            run.settle(ONE_SHOT)  # no reconcile, not idempotent: UNRESOLVED
    store.resolve("resolved", "send", receipt="msg-0001", who="ops@example.invalid")
    old = castore.Plan.build("deploy", "build", "test", "ship")
    with store.start("overridden", old) as run:
        run.commit_step("build", "artifact-1")
    store.override("overridden", who="lead", why="ship needs an announcement", plan=p["overridden"])
    with store.start("tâche/1", p["tâche/1"]) as run:
        run.commit_step("un", "é")
    if version >= 2:
        build_v2_tasks(store, p)


def build_v2_tasks(store: castore.Store, p: dict[str, castore.Plan]) -> None:
    """The tasks only a v2 store can hold (docs/design V3-V5): raw and tree results, a sealed
    history with a tail above its pack, one sealed and then finished, a fork, a forgotten task.
    Nothing seals in the background: every task stays far below SEAL_EVERY commits, so only
    the explicit seal_task calls (and the close of a finished sealed task) seal, in this thread."""
    with store.start("raw-and-tree", p["raw-and-tree"]) as run:
        raw = store.put_raw(bytes(range(256)) * 4)  # not valid UTF-8: raw, not a blob
        run.commit_step("dump", raw)
        blob = store.put_blob({"rows": list(range(20))})
        tree = store.put_tree({"state": raw.raw, "rows": blob.blob}, data={"schema": 1})
        run.commit_step("assemble", tree)
    with store.start("sealed", p["sealed"]) as run:
        for step in [s.id for s in p["sealed"].steps][:-3]:
            run.commit_step(step, {"step": step})
    seal_task(store, "sealed")
    with store.resume("sealed", p["sealed"]) as run:
        run.commit_step(run.next_step, "above the anchor")
    # Sealed half way, then finished: its close seals the rest whole (one more SEAL commit).
    with store.start("sealed-finished", p["sealed-finished"]) as run:
        for step in [s.id for s in p["sealed-finished"].steps][: SEALED_STEPS // 2]:
            run.commit_step(step, step)
    seal_task(store, "sealed-finished")
    with store.resume("sealed-finished", p["sealed-finished"]) as run:
        for step in run.pending():
            run.commit_step(step, step)
    store.fork("mid-plan@1", "forked")
    with store.resume("forked", p["forked"]) as run:
        run.commit_step(run.next_step, "forked on")
    with store.start("forgotten", p["forgotten"]) as run:
        run.commit_step("a", 1)
    store.forget("forgotten", who="ops@example.invalid", why="a test task, not needed")


# -- the damaged variants (each a copy of the clean store, damaged by hand) -------------------
def _slot(root: Path, task: str, seq: int) -> Path:
    return Path(Layout(root).slot_path(task, seq))


def _writable(path: Path) -> None:
    path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWUSR)


def _rewrite(path: Path, data: bytes) -> None:
    """New content in the same inode (every other name of it sees the change), mode kept."""
    mode = stat.S_IMODE(path.stat().st_mode)
    _writable(path)
    with open(path, "r+b") as handle:
        handle.write(data)
        handle.truncate(len(data))
    path.chmod(mode)


def _head(root: Path, task: str) -> int:
    return max(int(p.name) for p in Path(Layout(root).chain_dir(task)).iterdir())


def truncated_slot(root: Path) -> None:
    """HEAD of mid-plan cut to half its bytes (its object too: the same inode)."""
    slot = _slot(root, "mid-plan", _head(root, "mid-plan"))
    data = slot.read_bytes()
    _rewrite(slot, data[: len(data) // 2])


def corrupt_object(root: Path) -> None:
    """One bit flipped in the result blob of finished."""
    store = castore.Store.open(root)
    ref = next(
        s.transition.result_ref
        for _, s in store.history("finished")
        if s.transition.result_ref is not None
    )
    path = Path(store.objects.path(ref))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    _rewrite(path, bytes(data))


def _with_slots(root: Path, *seqs: int, but: str = "") -> str:
    """The first task of the clean store's order, other than `but`, whose slots `seqs` are all
    there (finished, in a v1 store; a sealed v2 task may have pruned its low slots)."""
    return next(
        task
        for task in plans(2)
        if task != but
        and os.path.isdir(Layout(root).chain_dir(task))
        and all(_slot(root, task, seq).exists() for seq in seqs)
    )


def missing_middle_slot(root: Path) -> None:
    """Slot 1 of finished removed (its snapshot object stays)."""
    _slot(root, _with_slots(root, 1, 2), 1).unlink()


def foreign_snapshot(root: Path) -> None:
    """Slot 1 of mid-plan replaced by slot 1 of finished (another task's snapshot)."""
    target = _slot(root, "mid-plan", 1)
    target.unlink()
    os.link(_slot(root, _with_slots(root, 1, but="mid-plan"), 1), target)


def bad_marker_version(root: Path) -> None:
    """castore.json names format version 999, which no castore implements."""
    marker = root / "castore.json"
    marker.unlink()
    marker.write_bytes(codec.encode_value({"format": "castore", "version": 999}) + b"\n")
    marker.chmod(0o444)


def future_object(root: Path) -> None:
    """A successor of effect-planned's HEAD framed as format version 999 (what a future
    castore might write): a reader must refuse it as unknown, never call it corrupt."""
    store = castore.Store.open(root)
    seq = _head(root, "effect-planned")
    head_id = store.verify("effect-planned").head_id
    head = codec.to_builtins(store.history("effect-planned")[0][1])
    head.update(seq=seq + 1, parent=head_id, time_ms=head["time_ms"] + TICK_MS)
    body = codec.encode_value(head)
    data = b"castore 999 snapshot %d\n" % len(body) + body
    object_id = hash_bytes(data)
    path = Path(store.objects.path(object_id))
    path.parent.mkdir(exist_ok=True)  # fan-out directories are made on first use
    path.write_bytes(data)
    path.chmod(0o444)
    os.link(path, _slot(root, "effect-planned", seq + 1))


def _objects_of_kind(root: Path, kind: bytes) -> list[Path]:
    return sorted(
        path
        for path in (root / "objects").rglob("*")
        if path.is_file() and path.read_bytes().split(b" ", 3)[2:3] == [kind]
    )


def truncated_pack(root: Path) -> None:
    """The pack of sealed (the one its sealed mark names) cut to half its bytes (v2)."""
    store = castore.Store.open(root)
    mark = TaskSlots(store.medium, store.objects, "sealed").mark()
    assert mark is not None
    assert mark.pack is not None
    pack = Path(store.objects.path(mark.pack))
    _rewrite(pack, pack.read_bytes()[: pack.stat().st_size // 2])


def bad_mark(root: Path) -> None:
    """The sealed mark of sealed replaced by bytes that do not parse (v2)."""
    marks = Path(Layout(root).marks_dir("sealed"))
    _rewrite(max(marks.iterdir()), b'{"pack":')  # the newest generation


def missing_tree_part(root: Path) -> None:
    """The raw object that the tree of raw-and-tree names removed (v2)."""
    tree = _objects_of_kind(root, b"tree")[0]
    body = tree.read_bytes().split(b"\n", 1)[1]
    part = codec.decode_value(body)["refs"]["state"]
    Path(castore.Store.open(root).objects.path(part)).unlink()


DAMAGE_V2: dict[str, Callable[[Path], None]] = {
    "damaged-truncated-pack": truncated_pack,
    "damaged-bad-mark": bad_mark,
    "damaged-missing-tree-part": missing_tree_part,
}


DAMAGE: dict[str, Callable[[Path], None]] = {
    "damaged-truncated-slot": truncated_slot,
    "damaged-corrupt-object": corrupt_object,
    "damaged-missing-middle-slot": missing_middle_slot,
    "damaged-foreign-snapshot": foreign_snapshot,
    "damaged-bad-marker-version": bad_marker_version,
    "damaged-future-object": future_object,
}


# -- what git holds and what it does not ------------------------------------------------------
def manifest_of(root: Path) -> dict[str, Any]:
    """Directories (empty ones included), and each inode's paths and mode, sorted."""
    dirs: list[str] = []
    inodes: dict[tuple[int, int], list[str]] = {}
    modes: dict[tuple[int, int], int] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames:
            dirs.append(os.path.relpath(os.path.join(directory, name), root))
        for name in filenames:
            full = os.path.join(directory, name)
            info = os.lstat(full)
            if not stat.S_ISREG(info.st_mode):
                raise SystemExit(f"{full}: only regular files can be golden")
            key = (info.st_dev, info.st_ino)
            inodes.setdefault(key, []).append(os.path.relpath(full, root))
            modes[key] = stat.S_IMODE(info.st_mode)
    files = [{"paths": sorted(paths), "mode": modes[key]} for key, paths in inodes.items()]
    return {
        "format": MANIFEST_FORMAT,
        "dirs": sorted(dirs),
        "files": sorted(files, key=lambda entry: entry["paths"][0]),
    }


def materialize(golden: Path, dest: Path) -> Path:
    """Rebuild the store of golden set `golden` (…/v1/clean) at `dest` as castore wrote it:
    every directory, each file with its mode, the other paths of an inode as hard links.
    Refuses a checkout holding a file the manifest does not list. Returns `dest`."""
    manifest = json.loads((golden / "manifest.json").read_text(encoding="utf-8"))
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{golden}/manifest.json: not a {MANIFEST_FORMAT!r}")
    source = golden / "store"
    listed = {path for entry in manifest["files"] for path in entry["paths"]}
    present = {
        os.path.relpath(os.path.join(d, f), source)
        for d, _, files in os.walk(source)
        for f in files
    }
    if present != listed:
        raise ValueError(
            f"{source}: files and manifest disagree: only on disk {sorted(present - listed)}, "
            f"only in the manifest {sorted(listed - present)}"
        )
    dest.mkdir(parents=True)
    for directory in manifest["dirs"]:
        (dest / directory).mkdir()
    for entry in manifest["files"]:
        first, *others = entry["paths"]
        shutil.copyfile(source / first, dest / first)
        (dest / first).chmod(entry["mode"])
        for other in others:
            os.link(dest / first, dest / other)
    return dest


# -- what castore reads from a store ----------------------------------------------------------
def _error_name(exc: BaseException) -> str:
    return type(exc).__name__


def _cli_status(*argv: str) -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        return cli_main(list(argv))


def observe(root: Path, task_plans: dict[str, castore.Plan]) -> dict[str, Any]:
    """What this castore reads from the store at `root` (read-only but for task locks):
    open, the task list, status, resume with each task's plan, fsck and the CLI's exit codes.
    Messages are left out (their wording may improve); the clock is fixed at NOW_MS."""
    observed: dict[str, Any] = {}
    try:
        store = castore.Store.open(root, clock=lambda: NOW_MS)
    except castore.CastoreError as exc:
        observed["open"] = _error_name(exc)
        store = None
    else:
        observed["open"] = "ok"
    if store is not None:
        observed["tasks"] = store.tasks()
        observed["status"] = {}
        observed["resume"] = {}
        for task, plan in task_plans.items():
            observed["status"][task] = _status(store, task)
            observed["resume"][task] = _resume(store, task, plan)
    observed["fsck"] = _fsck(root)
    observed["cli"] = {
        "status": _cli_status("status", "--store", str(root)),
        "fsck": _cli_status("fsck", str(root), "--jobs", "1"),
    }
    return observed


_V1_STATUS_FIELDS = frozenset(
    [
        "effects",
        "error",
        "finished",
        "head",
        "next_action",
        "plan",
        "seq",
        "step",
        "task",
        "updated_ms",
    ]
)


_V2_STATUS_FIELDS = _V1_STATUS_FIELDS | {"forgotten"}


def _status(store: castore.Store, task: str) -> dict[str, Any]:
    """Status as data: its wording (`reason`, the error's message) is for people and may
    improve; whether it is broken, and every field a program acts on, is the contract."""
    status = store.status(task).to_dict()
    status["error"] = status["error"] is not None
    del status["reason"]
    # Fields a later castore adds (v2's `forgotten`) are not what an older store must read as.
    fields = _V2_STATUS_FIELDS if store.format_version >= 2 else _V1_STATUS_FIELDS
    status = {key: value for key, value in status.items() if key in fields}
    for effect in status["effects"]:
        del effect["reason"]
    return status


def _resume(store: castore.Store, task: str, plan: castore.Plan) -> dict[str, Any]:
    try:
        run = store.resume(task, plan)
    except castore.CastoreError as exc:
        return {"error": _error_name(exc)}
    with run:
        return {
            "seq": run.head.seq,
            "head": run.head_id,
            "next_step": run.next_step,
            "finished": run.finished,
            "effects": {r.step: r.state.value for r in run.head.effects},
        }


def _fsck(root: Path) -> dict[str, Any]:
    summary = Summary()
    try:
        found = list(check_store(root, jobs=1, summary=summary))
    except castore.CastoreError as exc:
        return {"error": _error_name(exc)}
    return {
        "exit_status": summary.exit_status,
        "objects": summary.objects,
        "tasks": summary.tasks,
        "findings": [[f.severity.value, f.code, f.path, f.task, f.object_id] for f in found],
    }


def plans_json(task_plans: dict[str, castore.Plan]) -> dict[str, Any]:
    return {task: codec.to_builtins(plan) for task, plan in task_plans.items()}


def plans_from_json(data: dict[str, Any]) -> dict[str, castore.Plan]:
    return {task: codec.from_builtins(plan, castore.Plan) for task, plan in data.items()}


# -- putting it together ----------------------------------------------------------------------
def build_set(out: Path, version: int) -> list[Path]:
    """Write every golden store of format `version` under out/v<version>/."""
    target = out / f"v{version}"
    if target.exists():
        raise SystemExit(f"{target} exists: a golden set is never regenerated (see README)")
    damage = {**DAMAGE, **(DAMAGE_V2 if version >= 2 else {})}
    built = []
    os.umask(0o022)  # the modes of lock files and directories, as the manifest records them
    with tempfile.TemporaryDirectory() as work, fixed_writers():
        clean = Path(work) / "clean"
        build_clean(clean, version)
        stores = {"clean": clean}
        for name, damage_it in damage.items():
            copy = Path(work) / name
            shutil.copytree(clean, copy, symlinks=True)  # hard links become copies: relinked
            _relink_like(clean, copy)
            damage_it(copy)
            stores[name] = copy
        task_plans = plans(version)
        for name, root in stores.items():
            expected = {
                "format_version": version,
                "what": (damage[name].__doc__ or "") if name in damage else build_clean.__doc__,
                "plans": plans_json(task_plans),
                "observed": observe(root, task_plans),
            }
            golden = target / name
            manifest = manifest_of(root)
            shutil.copytree(root, golden / "store", symlinks=True)
            for path in (golden / "store").rglob("*"):
                if path.is_file():
                    path.chmod(0o644)  # what git keeps; the manifest has the real mode
            _write_json(golden / "manifest.json", manifest)
            _write_json(golden / "expected.json", expected)
            built.append(golden)
    return built


def _relink_like(original: Path, copy: Path) -> None:
    """Make the paths that are one inode in `original` one inode in `copy` too."""
    for entry in manifest_of(original)["files"]:
        first, *others = entry["paths"]
        for other in others:
            (copy / other).unlink()
            os.link(copy / first, copy / other)


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, choices=(1, 2), required=True)
    parser.add_argument("--out", type=Path, default=GOLDEN)
    args = parser.parse_args(argv)
    for golden in build_set(args.out, args.version):
        print(golden)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
