"""`fsck --quarantine` never writes through a planted symlink (quarantine/, a directory below
it, a fan-out directory), and never moves an object that was stored again, intact, after fsck
found it damaged: it looks again right before the move, and once more after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import cli, rewrite, tree_snapshot

import castore
import castore.maintenance.fsck.quarantine as quarantine_module
from castore.maintenance.fsck import Finding, Severity, check_store
from castore.maintenance.fsck.quarantine import quarantine

PLAN = castore.Plan.build("q", "a")
VALUE = {"rows": list(range(20))}


def damaged_blob(store: castore.Store) -> tuple[str, Path, list[Finding]]:
    """A task whose result blob lost its last byte, and fsck's findings about it."""
    ref = store.put_blob(VALUE)
    with store.start("t/1", PLAN) as run:
        run.commit_step("a", ref)
    path = Path(store.objects.path(ref.blob))
    rewrite(path, lambda data: data[:-1])
    findings = list(check_store(store.root, jobs=1))
    assert "hash-mismatch" in {f.code for f in findings}
    return ref.blob, path, findings


def store_again_intact(store: castore.Store, path: Path) -> None:
    """What a writer does once the damaged file is gone: store the same blob again."""
    path.unlink()
    store.put_blob(VALUE)


def errors(store: castore.Store) -> list[str]:
    return [f.code for f in check_store(store.root, jobs=1) if f.severity is Severity.ERROR]


def test_a_quarantine_symlink_is_refused_and_nothing_is_written_outside(
    store: castore.Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """quarantine/ planted as a symlink to a directory outside the store: fsck --quarantine
    refuses with UnsafeFileError naming it (exit 3), writes nothing there, moves nothing."""
    _, path, _ = damaged_blob(store)
    outside = tmp_path / "outside"
    outside.mkdir()
    Path(store.layout.quarantine).symlink_to(outside)
    before = tree_snapshot(tmp_path)
    code, out, err = cli(capsys, "fsck", store.root, "--quarantine")
    assert 3 == code
    assert "error: unsafe-file: quarantine: " in out
    assert f"{store.layout.quarantine} is a symlink, not a directory" in err
    assert before == tree_snapshot(tmp_path)
    assert path.exists()


def test_a_run_directory_planted_in_advance_is_not_written_through(
    store: castore.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A symlink planted under the very name the run directory will have: refused (never
    reused), nothing written outside, nothing moved."""
    _, path, findings = damaged_blob(store)
    monkeypatch.setattr(quarantine_module.time, "strftime", lambda *_: "20260101T000000Z")
    monkeypatch.setattr(quarantine_module.secrets, "token_hex", lambda _n: "abcdef")
    outside = tmp_path / "outside"
    outside.mkdir()
    Path(store.layout.quarantine).mkdir()
    run_dir = Path(store.layout.quarantine, f"20260101T000000Z-{os.getpid()}-abcdef")
    run_dir.symlink_to(outside)
    before = tree_snapshot(tmp_path)
    with pytest.raises(castore.CastoreError) as caught:
        quarantine(store.root, findings)
    assert "quarantin" in str(caught.value)
    assert before == tree_snapshot(tmp_path)
    assert path.exists()


def test_a_fanout_directory_swapped_for_a_symlink_is_refused(
    store: castore.Store, tmp_path: Path
) -> None:
    """After fsck looked, objects/xx is replaced by a symlink to a directory outside holding a
    file of the same name: quarantine refuses (UnsafeFileError), that file stays put."""
    blob, path, findings = damaged_blob(store)
    fanout = path.parent
    outside = tmp_path / "outside"
    fanout.rename(outside)
    fanout.symlink_to(outside)
    before = tree_snapshot(outside)
    with pytest.raises(castore.UnsafeFileError) as caught:
        quarantine(store.root, findings)
    assert str(fanout) == caught.value.path
    assert before == tree_snapshot(outside)
    assert (outside / blob).exists()


def test_an_object_stored_again_intact_after_fsck_is_not_quarantined(
    store: castore.Store,
) -> None:
    """fsck finds a blob damaged; a writer stores it again, intact, before the quarantine:
    it is not moved, and the task still verifies with its result."""
    blob, path, findings = damaged_blob(store)
    store_again_intact(store, path)
    where, moved, _ = quarantine(store.root, findings)
    assert [] == moved
    assert path.exists()
    assert VALUE == store.get_blob(blob)
    with store.resume("t/1", PLAN) as run:
        assert VALUE == run.result("a")
    assert [] == errors(store)
    assert [] == list(Path(store.root, where).glob("objects/**/*"))


def test_an_object_stored_again_between_the_look_and_the_move_is_put_back(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer stores the blob again after quarantine's last look and before its move:
    the look after the move finds it intact and puts it back."""
    blob, path, findings = damaged_blob(store)
    real_link = os.link
    swapped: list[str] = []

    def link(src: str, dst: str, **kwargs: object) -> None:
        if src == blob and not swapped:
            store_again_intact(store, path)  # between the look and the move
            swapped.append(src)
        real_link(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(quarantine_module.os, "link", link)
    where, moved, _ = quarantine(store.root, findings)
    monkeypatch.undo()
    assert ([blob], []) == (swapped, moved)
    assert VALUE == store.get_blob(blob)
    assert [] == errors(store)
    assert [] == [p for p in Path(store.root, where).rglob("*") if p.is_file() and p.name == blob]


def test_a_damaged_object_is_still_moved(store: castore.Store) -> None:
    """The look before and after the move does not spare what really is damaged."""
    blob, path, findings = damaged_blob(store)
    where, moved, _ = quarantine(store.root, findings)
    assert ["hash-mismatch"] == [f.code for f in moved]
    assert not path.exists()
    assert Path(store.root, where, "objects", blob[:2], blob).is_file()
    assert Path(store.root, where, "manifest.json").is_file()
