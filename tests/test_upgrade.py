"""`castore upgrade`: a v1 store checked as fsck does, then made v2 by one atomic marker
replace; refused when damaged, resumable after a kill at any step, safe beside a writer."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, read_line, tree_snapshot
from test_golden import V1, expected_of, make_golden, materialize

import castore
import castore.maintenance.upgrade
from castore import crashpoints
from castore.maintenance.upgrade import TARGET_VERSION, upgrade

V1_MARKER = b'{"format":"castore","version":1}\n'
V2_MARKER = b'{"format":"castore","version":2}\n'
DAMAGED = sorted(p.name for p in V1.glob("damaged-*") if p.name != "damaged-bad-marker-version")


def _clean(tmp_path: Path) -> Path:
    return materialize(V1 / "clean", tmp_path)


def _plans() -> dict[str, castore.Plan]:
    plans: dict[str, castore.Plan] = make_golden.plans_from_json(expected_of(V1 / "clean")["plans"])
    return plans


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _resumed(root: Path) -> dict[str, dict[str, Any]]:
    """Where each task stands after a resume (HEAD ids left out: sealing adds commits)."""
    store = castore.Store.open(root)
    found = {}
    for task, plan in _plans().items():
        with store.resume(task, plan) as run:
            effects = {r.step: r.state.value for r in run.head.effects}
            found[task] = {"next_step": run.next_step, "finished": run.finished, **effects}
    return found


def _recorded() -> dict[str, dict[str, Any]]:
    resume = expected_of(V1 / "clean")["observed"]["resume"]
    return {
        task: {"next_step": r["next_step"], "finished": r["finished"], **r["effects"]}
        for task, r in resume.items()
    }


def test_upgrade_makes_a_clean_v1_store_v2_and_it_resumes_as_before(tmp_path: Path) -> None:
    """The marker becomes version 2 (its only write without a seal), no object is rewritten,
    every task resumes where it stood, and the store reads as format 2."""
    root = _clean(tmp_path)
    before = _files(root)
    report = upgrade(root)
    assert (1, 2, True, False, 0) == (
        report.from_version,
        report.to_version,
        report.marker_written,
        report.refused,
        report.exit_status,
    )
    assert V2_MARKER == (root / "castore.json").read_bytes()
    assert 2 == castore.Store.open(root).format_version
    after = _files(root)
    kept = {path: data for path, data in after.items() if path in before}
    # No file is rewritten; sealing adds packs, marks and SEAL slots, and prunes the slots
    # (and their snapshot objects) below each mark.
    assert {path: before[path] for path in kept} | {"castore.json": V2_MARKER} == kept
    if not report.seal_available:
        assert before.keys() == after.keys()
    assert _recorded() == _resumed(root)


def test_upgrade_again_finishes_nothing_more(tmp_path: Path) -> None:
    """A second upgrade finds format 2, writes no marker and succeeds (a re-run is safe)."""
    root = _clean(tmp_path)
    upgrade(root)
    report = upgrade(root)
    assert (2, False, 0) == (report.from_version, report.marker_written, report.exit_status)
    assert V2_MARKER == (root / "castore.json").read_bytes()


@pytest.mark.parametrize("name", DAMAGED)
def test_upgrade_refuses_a_damaged_store_and_writes_nothing(name: str, tmp_path: Path) -> None:
    """Each damaged golden store: refused with fsck's errors for it, every file unchanged."""
    golden = V1 / name
    root = materialize(golden, tmp_path)
    before = tree_snapshot(root)
    report = upgrade(root)
    recorded = expected_of(golden)["observed"]["fsck"]["findings"]
    errors = [(code, path) for severity, code, path, *_ in recorded if severity == "error"]
    assert (True, 1, False) == (report.refused, report.exit_status, report.marker_written)
    assert errors == [(f.code, f.path) for f in report.errors]
    assert before == tree_snapshot(root)


def test_upgrade_refuses_a_marker_it_does_not_know(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Marker version 999: FormatVersionError; the CLI says so in one line, exit 2."""
    root = materialize(V1 / "damaged-bad-marker-version", tmp_path)
    with pytest.raises(castore.FormatVersionError):
        upgrade(root)
    code, out, err = cli(capsys, "upgrade", str(root))
    assert (2, "", 1) == (code, out, err.count("\n"))
    assert "version 999" in err


def test_dry_run_checks_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run: the check runs and the verdict is printed; not one file changes."""
    root = _clean(tmp_path)
    before = tree_snapshot(root)
    code, out, _ = cli(capsys, "upgrade", str(root), "--dry-run")
    assert 0 == code
    assert "can be upgraded to format 2 (dry run: nothing written)" in out.splitlines()[-1]
    assert before == tree_snapshot(root)


def test_text_output_is_fsck_lines_then_one_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Text: a line per warning or error (fsck's format), then counts and the verdict."""
    root = _clean(tmp_path)
    code, out, _ = cli(capsys, "upgrade", "--store", str(root))
    lines = out.splitlines()
    assert 0 == code
    assert ["warning: effect-stuck", "warning: effect-unresolved"] == [
        ": ".join(line.split(": ")[:2])
        for line in lines[:-1]
        if not line.startswith("warning: seal")
    ]
    assert lines[-1].startswith("checked 39 object(s) and 9 task(s): 0 error(s), 2 warning(s); ")
    assert f"upgraded {root} from format 1 to format 2" in lines[-1]


def test_damaged_store_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged store: exit 1; text ends with "not upgraded" and what to do; --json is a
    line per finding and a summary line saying refused, as fsck --json does."""
    root = materialize(V1 / "damaged-missing-middle-slot", tmp_path)
    code, out, _ = cli(capsys, "upgrade", str(root))
    assert 1 == code
    assert "error: slot-gap: tasks/finished/chain [finished]" in out
    assert "not upgraded" in out.splitlines()[-1]
    assert "then run `castore upgrade` again" in out.splitlines()[-1]
    code, out, _ = cli(capsys, "upgrade", str(root), "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    summary = lines[-1]["summary"]
    assert (1, 1, True, False) == (
        code,
        summary["exit_status"],
        summary["refused"],
        summary["marker_written"],
    )
    assert "slot-gap" in {line.get("code") for line in lines[:-1]}
    assert V1_MARKER == (root / "castore.json").read_bytes()


# -- kills at each step -----------------------------------------------------------------------
def _upgrade_process(root: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != crashpoints.ENV_VAR}
    if crash_at is not None:
        env[crashpoints.ENV_VAR] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "castore", "upgrade", str(root), "--jobs", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


# What each kill leaves: the marker's version, and whether a temp file of it may be left.
KILLS = {
    "upgrade.verified": V1_MARKER,  # checked, nothing written
    "object.temp_synced": V1_MARKER,  # the new marker's temp file written, not renamed
    "upgrade.marker_written": V2_MARKER,  # the flip done, no task sealed
}


@pytest.mark.parametrize("point", sorted(KILLS))
def test_a_kill_at_each_step_leaves_a_store_a_rerun_finishes(point: str, tmp_path: Path) -> None:
    """SIGKILL at a step: the store reads (either format), fsck finds no error, and running
    upgrade again finishes it: format 2, every task where it stood."""
    root = _clean(tmp_path)
    killed = _upgrade_process(root, point)
    assert -signal.SIGKILL == killed.returncode, killed.stderr
    assert KILLS[point] == (root / "castore.json").read_bytes()
    assert 0 == _fsck_exit(root)
    rerun = _upgrade_process(root, None)
    assert (0, "") == (rerun.returncode, rerun.stderr)
    assert V2_MARKER == (root / "castore.json").read_bytes()
    assert _recorded() == _resumed(root)


def _fsck_exit(root: Path) -> int:
    summary = castore.maintenance.fsck.Summary()
    list(castore.maintenance.fsck.check_store(root, jobs=1, summary=summary))
    return summary.exit_status


@pytest.mark.skipif(
    importlib.util.find_spec("castore.chain.seal") is None,
    reason="castore.chain.seal is not in this castore yet: upgrade seals nothing",
)
def test_a_kill_between_two_seals_is_finished_by_a_rerun(tmp_path: Path) -> None:
    """SIGKILL after the first task's seal: a rerun seals the rest and every task resumes."""
    root = _clean(tmp_path)
    killed = _upgrade_process(root, "upgrade.sealed:1")
    assert -signal.SIGKILL == killed.returncode, killed.stderr
    assert V2_MARKER == (root / "castore.json").read_bytes()
    rerun = _upgrade_process(root, None)
    assert (0, "") == (rerun.returncode, rerun.stderr)
    assert _recorded() == _resumed(root)


# -- a writer during the upgrade ----------------------------------------------------------------
WRITER = """
import sys
import castore

root, steps = sys.argv[1], int(sys.argv[2])
plan = castore.Plan.build("busy", *[f"s{i}" for i in range(steps)])
run = castore.Store.open(root).open_task("busy", plan)
print("ready", flush=True)
for step in run.pending():
    run.commit_step(step, {"n": run.head.seq})
    print("ack", run.head.seq, run.head_id, flush=True)
"""


def test_a_run_opened_on_the_v1_store_keeps_committing_through_the_upgrade(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """A writer opened on the v1 store commits as fast as it can while upgrade checks and
    flips the marker: upgrade is not refused, every commit the writer acknowledged (after
    the flip too) is in the chain, which verifies, and its objects are v1 ones."""
    root = _clean(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), "5000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children.append(proc)
    assert "ready\n" == read_line(proc)
    report = upgrade(root, jobs=1)
    store = castore.Store.open(root)
    flipped_at = store.verify("busy").head.seq
    seen = read_line(proc)
    # Until 3 commits after the flip, or the writer's end (it loses to a seal commit).
    while seen.endswith("\n") and _ack(seen.splitlines()[-1])[0] < flipped_at + 3:
        seen += read_line(proc)
    os.kill(proc.pid, signal.SIGKILL)
    # Through the same buffered reader (communicate() would skip what readline read ahead).
    assert proc.stdout is not None
    rest = proc.stdout.read()
    proc.communicate(timeout=60)
    # Complete lines only: the kill may tear the last one.
    acked = dict(_ack(line) for line in (seen + rest).split("\n")[:-1])
    assert (False, True) == (report.refused, report.marker_written)
    # The writer holds the task: a seal of it, if this castore seals, may have to wait.
    assert set() == {(p.task, p.kind) for p in report.seal_problems} - {("busy", "busy")}
    history = {snapshot.seq: object_id for object_id, snapshot in store.history("busy")}
    assert acked == {seq: history[seq] for seq in acked}
    after = [oid for seq, oid in acked.items() if seq > flipped_at]
    assert {b"castore 1 "} == {Path(store.objects.path(oid)).read_bytes()[:10] for oid in after}
    assert TARGET_VERSION == store.format_version


def _ack(line: str) -> tuple[int, str]:
    word, seq, head = line.split(" ")
    assert "ack" == word
    return int(seq), head


def test_an_error_only_one_check_sees_is_a_race_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error the second check does not find again (a writer's commit racing the first)
    does not refuse the upgrade; one that both checks find does."""
    root = _clean(tmp_path)
    real = castore.maintenance.upgrade.check_store
    race = castore.maintenance.fsck.Finding(
        "slot-not-published", "tasks/busy/chain/0000000000000047", "x"
    )
    passes: list[int] = []

    def first_pass_only(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        yield from real(*args, **kwargs)
        if len(passes) == 1:
            yield race

    monkeypatch.setattr(castore.maintenance.upgrade, "check_store", first_pass_only)
    report = upgrade(root, dry_run=True)
    assert (2, False, ()) == (len(passes), report.refused, report.errors)

    def every_pass(*args: Any, **kwargs: Any) -> Any:
        yield from real(*args, **kwargs)
        yield race

    monkeypatch.setattr(castore.maintenance.upgrade, "check_store", every_pass)
    report = upgrade(root, dry_run=True)
    assert (True, (race,)) == (report.refused, report.errors)


def test_a_stale_run_opened_on_the_v1_store_loses_once_a_seal_pruned_its_slot(
    tmp_path: Path,
) -> None:
    """A run opened while the store was v1, left behind by another writer, whose next slot
    a seal (after the upgrade) has pruned: its link succeeds, the mark check after it makes
    it lose (ConflictError), and it takes its slot back: nothing stale is acknowledged."""
    root = _clean(tmp_path)
    plan = _plans()["mid-plan"]
    stale = castore.Store.open(root).resume("mid-plan", plan, lock_timeout=None)
    assert (1, 2) == (castore.Store.open(root).format_version, stale.head.seq)
    with castore.Store.open(root).resume("mid-plan", plan, lock_timeout=None) as ahead:
        for step in ("load", "verify", "publish"):
            ahead.commit_step(step, step)
    report = upgrade(root)
    assert (True, True) == (report.marker_written, report.seal_available)
    slots = castore.Store.open(root)._slots("mid-plan")
    mark = slots.mark()
    # The upgrade sealed the task and pruned below its SEAL: the stale run's next slot, 3.
    assert mark is not None
    assert mark.through >= 3
    kept = slots.present()
    with pytest.raises(castore.ConflictError):
        stale.commit_step("load", "from a stale run")
    assert (kept, True) == (slots.present(), stale.stale)
    stale.close()


def test_objects_of_a_newer_format_say_upgrade_castore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store holding an object of format 999 is refused, and the verdict says to upgrade
    castore (not to repair damage): exit 1, nothing written."""
    root = materialize(V1 / "damaged-future-object", tmp_path)
    code, out, _ = cli(capsys, "upgrade", str(root))
    assert 1 == code
    assert "error: unknown-version: objects/" in out
    assert "does not read; nothing was changed; upgrade castore" in out.splitlines()[-1]
    assert V1_MARKER == (root / "castore.json").read_bytes()


def test_a_rerun_on_a_v2_store_skips_forgotten_tasks(tmp_path: Path) -> None:
    """upgrade again on a store with a forgotten task: the tombstone stays the task's last
    snapshot (nothing may follow it), and the run reports no problem."""
    store = castore.Store.init(tmp_path / "s")
    plan = castore.Plan.build("p", "a", "b")
    for task in ("gone", "kept"):
        with store.start(task, plan) as run:
            run.commit_step("a", 1)
    store.forget("gone", who="ops", why="done with it")
    report = upgrade(store.root)
    assert ((), 0) == (report.seal_problems, report.exit_status)
    assert "gone" not in report.sealed
    assert store.status("gone").forgotten
