"""The golden stores of tests/golden/ read exactly as recorded: the compatibility contract.

A failure here is a format break (see tests/golden/README.md): fix the code, not the store.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import castore
from castore.format import codec

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden", ROOT / "tools" / "make_golden.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_golden"] = module
    spec.loader.exec_module(module)
    return module


make_golden = _load_tool()
SETS = sorted(p.parent for p in GOLDEN.glob("v*/*/expected.json"))
V1 = GOLDEN / "v1"
V2 = GOLDEN / "v2"
V2_DEV = GOLDEN / "v2-dev"  # written before format 2's revision (issue 23): the legacy mark


def expected_of(golden: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((golden / "expected.json").read_text(encoding="utf-8"))
    return data


def materialize(golden: Path, tmp_path: Path) -> Path:
    dest: Path = make_golden.materialize(golden, tmp_path / golden.name)
    return dest


def test_the_v1_set_is_there() -> None:
    """The v1 set holds the clean store and every damaged variant the README lists."""
    expected = {"clean"} | set(make_golden.DAMAGE)
    assert expected == {p.name for p in SETS if p.parent.name == "v1"}


def test_the_v2_set_is_there() -> None:
    """The v2 set holds the clean store, v1's damaged variants and the v2-only ones (a
    truncated pack, a damaged sealed mark, a missing tree part)."""
    expected = {"clean"} | set(make_golden.DAMAGE) | set(make_golden.DAMAGE_V2)
    assert expected == {p.name for p in SETS if p.parent.name == "v2"}
    assert expected == {p.name for p in SETS if p.parent.name == "v2-dev"}


@pytest.mark.parametrize("golden", SETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_store_reads_as_recorded(golden: Path, tmp_path: Path) -> None:
    """Open, tasks, status, resume, fsck and the CLI's exit codes are what was recorded."""
    expected = expected_of(golden)
    root = materialize(golden, tmp_path)
    plans = make_golden.plans_from_json(expected["plans"])
    assert expected["observed"] == make_golden.observe(root, plans)


@pytest.mark.parametrize("golden", SETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_reading_a_golden_store_changes_nothing(golden: Path, tmp_path: Path) -> None:
    """Status, resume (without a commit) and fsck leave every file of the store as it was."""
    root = materialize(golden, tmp_path)
    before = make_golden.manifest_of(root), _contents(root)
    make_golden.observe(root, make_golden.plans_from_json(expected_of(golden)["plans"]))
    assert before == (make_golden.manifest_of(root), _contents(root))


def _contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_checkout_must_match_its_manifest(tmp_path: Path) -> None:
    """A file the manifest does not list (a stray in the checkout) is refused, not copied."""
    golden = tmp_path / "set"
    make_golden.materialize(V1 / "clean", tmp_path / "first")
    (golden / "store").mkdir(parents=True)
    (golden / "manifest.json").write_bytes((V1 / "clean" / "manifest.json").read_bytes())
    for entry in json.loads((golden / "manifest.json").read_text())["files"]:
        for path in entry["paths"]:
            (golden / "store" / path).parent.mkdir(parents=True, exist_ok=True)
            (golden / "store" / path).write_bytes((V1 / "clean" / "store" / path).read_bytes())
    (golden / "store" / "objects" / "stray").write_bytes(b"x")
    with pytest.raises(ValueError, match="only on disk \\['objects/stray'\\]"):
        make_golden.materialize(golden, tmp_path / "second")


def test_a_copy_without_hard_links_is_not_the_store(tmp_path: Path) -> None:
    """Why materialize relinks: fsck of a plain copy of a golden store (no hard links) is
    not what castore recorded for it (the spliced slot's third name goes unseen)."""
    golden = V1 / "damaged-foreign-snapshot"
    root = materialize(golden, tmp_path)
    for entry in make_golden.manifest_of(root)["files"]:
        for other in entry["paths"][1:]:
            data = (root / other).read_bytes()
            (root / other).unlink()
            (root / other).write_bytes(data)
            (root / other).chmod(entry["mode"])
    recorded = expected_of(golden)["observed"]["fsck"]["findings"]
    found = make_golden.observe(root, make_golden.plans_from_json(expected_of(golden)["plans"]))
    assert "hard-linked-object" in {code for _, code, *_ in recorded}
    assert "hard-linked-object" not in {code for _, code, *_ in found["fsck"]["findings"]}


@pytest.mark.parametrize("version", [1, 2])
def test_set_regenerates_byte_for_byte(version: int, tmp_path: Path) -> None:
    """make_golden --version N writes the committed vN stores again, file for file, inode for
    inode: this castore writes a vN store exactly as castore did when the set was made."""
    make_golden.build_set(tmp_path, version)
    committed = [p for p in SETS if p.parent.name == f"v{version}"]
    assert committed
    for golden in committed:
        built = tmp_path / f"v{version}" / golden.name
        assert (golden / "manifest.json").read_bytes() == (built / "manifest.json").read_bytes()
        assert _contents(golden / "store") == _contents(built / "store")


def test_v2_clean_store_holds_every_v2_kind(tmp_path: Path) -> None:
    """The clean v2 store holds what only v2 writes: raw, tree and pack objects, a sealed
    mark under each sealed task, a fork's seq 0 and a forgotten task's tombstone."""
    root = materialize(V2 / "clean", tmp_path)
    kinds = {p.read_bytes().split(b" ", 3)[2] for p in (root / "objects").rglob("*") if p.is_file()}
    assert {b"raw", b"tree", b"pack"} <= kinds
    for task in ("sealed", "sealed-finished"):
        assert (root / "tasks" / task / "marks" / "0000000000000000").is_file()
        assert not (root / "tasks" / task / "sealed").exists()
    store = castore.Store.open(root)
    assert "mid-plan" == store.history("forked")[-1][1].fork.task  # type: ignore[union-attr]
    assert store.status("forgotten").forgotten


def test_the_pre_revision_v2_store_holds_the_legacy_mark(tmp_path: Path) -> None:
    """The v2 store written before format 2's revision keeps its single `sealed` file per
    sealed task (and no marks/): it is read as the mark, so its tasks resume as recorded."""
    root = materialize(V2_DEV / "clean", tmp_path)
    for task in ("sealed", "sealed-finished"):
        assert (root / "tasks" / task / "sealed").is_file()
        assert not (root / "tasks" / task / "marks").exists()
        assert castore.Store.open(root).status(task).error is None


def test_a_fork_s_outcomes_tree_is_named_in_fsck(tmp_path: Path) -> None:
    """fsck counts a fork's `fork.outcomes` tree as named (FORMAT 17: gc keeps it): not
    unreachable in the clean v2 store, and its loss is a missing-object of the fork."""
    root = materialize(V2 / "clean", tmp_path)
    store = castore.Store.open(root)
    fork = store.history("forked")[-1][1].fork
    assert fork is not None
    codes = {(f.code, f.object_id) for f in castore.maintenance.fsck.check_store(root, jobs=1)}
    assert ("unreachable-object", fork.outcomes) not in codes
    Path(store.objects.path(fork.outcomes)).unlink()
    found = {(f.code, f.task) for f in castore.maintenance.fsck.check_store(root, jobs=1)}
    assert ("missing-object", "forked") in found


# -- versions (V0): a reader refuses what it does not know, and writes a v1 store as v1 --------
def _objects_by_header(root: Path) -> dict[bytes, int]:
    counts: dict[bytes, int] = {}
    for path in (root / "objects").rglob("*"):
        if path.is_file():
            version = path.read_bytes().split(b" ", 2)[1]
            counts[version] = counts.get(version, 0) + 1
    return counts


def test_writing_into_a_v1_store_keeps_it_v1(tmp_path: Path) -> None:
    """Commits, a new task, a blob, a resolve and an override in a v1 store write v1 objects
    only and leave its marker at version 1; the store then reads clean as v1 and in fsck."""
    root = materialize(V1 / "clean", tmp_path)
    marker = (root / "castore.json").read_bytes()
    plans = make_golden.plans_from_json(expected_of(V1 / "clean")["plans"])
    store = castore.Store.open(root)
    with store.resume("mid-plan", plans["mid-plan"]) as run:
        for step in run.pending():
            run.commit_step(step, store.put_blob({"step": step}))
    with store.start("new", castore.Plan.build("n", "a", castore.effect("b", "a"))) as run:
        run.commit_step("a", 1)
        run.perform("b", make_golden.BILLING, lambda key: "r-" + key)
    store.resolve("effect-unresolved", "send", not_done=True, reason="never sent", who="ops")
    store.override("effect-planned", who="ops", why="notify after", plan=plans["effect-confirmed"])
    assert marker == (root / "castore.json").read_bytes()
    assert {b"1"} == set(_objects_by_header(root))
    assert 1 == castore.Store.open(root).format_version
    summary = castore.maintenance.fsck.Summary()
    findings = list(castore.maintenance.fsck.check_store(root, jobs=1, summary=summary))
    assert (0, []) == (summary.exit_status, [f for f in findings if f.severity.value == "error"])


def _with_marker_version(root: Path, version: int) -> None:
    marker = root / "castore.json"
    marker.unlink()
    marker.write_bytes(codec.encode_value({"format": "castore", "version": version}) + b"\n")


def test_an_unknown_marker_version_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Marker version 3: open raises FormatVersionError; the CLI prints one line naming the
    store, the version found and those supported, and says to upgrade castore; exit 2."""
    root = materialize(V1 / "clean", tmp_path)
    _with_marker_version(root, 3)
    with pytest.raises(castore.FormatVersionError) as caught:
        castore.Store.open(root)
    assert (3, codec.SUPPORTED_VERSIONS) == (caught.value.found, caught.value.supported)
    for argv in (["status", "--store", str(root)], ["fsck", str(root)]):
        code, out, err = _cli(capsys, *argv)
        supported = ", ".join(map(str, codec.SUPPORTED_VERSIONS))
        assert (2, "", 1) == (code, out, err.count("\n"))
        assert str(root / "castore.json") in err
        assert f"version 3; this castore reads {supported}. Upgrade castore" in err


def test_an_object_of_an_unknown_version_is_refused_not_corrupt(tmp_path: Path) -> None:
    """A HEAD framed as version 999: resume raises FormatVersionError (never
    ObjectCorruptError) naming the file and the versions supported; fsck says unknown-version."""
    golden = V1 / "damaged-future-object"
    root = materialize(golden, tmp_path)
    plans = make_golden.plans_from_json(expected_of(golden)["plans"])
    with pytest.raises(castore.FormatVersionError) as caught:
        castore.Store.open(root).resume("effect-planned", plans["effect-planned"])
    assert not isinstance(caught.value, castore.ObjectCorruptError)
    assert (999, codec.SUPPORTED_VERSIONS) == (caught.value.found, caught.value.supported)
    assert "chain/0000000000000002 uses castore format version 999" in str(caught.value)
    codes = {f.code for f in castore.maintenance.fsck.check_store(root, jobs=1)}
    assert "unknown-version" in codes
    assert not codes & {"hash-mismatch", "truncated", "bad-header", "undecodable"}


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from helpers import cli  # noqa: PLC0415 - the shared helper, imported where used

    return cli(capsys, *argv)


def test_a_commit_into_a_v1_store_still_makes_the_snapshot_name_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1 readers find a snapshot by its object name alone: a v1 store's commit fsyncs the
    snapshot's fan-out directory (a v2 commit does not: FORMAT.md 9.3 step 2)."""
    root = materialize(V1 / "clean", tmp_path)
    plans = make_golden.plans_from_json(expected_of(V1 / "clean")["plans"])
    store = castore.Store.open(root)
    synced: list[str] = []
    real = castore.medium.fsio.fsync_dir
    monkeypatch.setattr(castore.medium.fsio, "fsync_dir", lambda d: (synced.append(d), real(d))[1])
    with store.resume("mid-plan", plans["mid-plan"]) as run:
        synced.clear()  # the first commit of a run also syncs HEAD's chain directory
        run.commit_step(next(run.pending()), {"n": 1})
        synced.clear()
        run.commit_step(next(run.pending()), {"n": 2})
        snapshot = store.layout.object_path(run.head_id)
    assert [os.path.dirname(snapshot), store.layout.chain_dir("mid-plan")] == synced
