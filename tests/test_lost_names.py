"""A chain slot whose snapshot lost its object name (objects/xx/<id>), the state a power loss
may leave in a format-2 store, whose commits do not sync the fan-out directory: readers read
the snapshot from its slot, fsck warns (v2) or keeps its error (v1), gc and the next commit
give the name back. The state is made here by unlinking the names by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import cli, tree_snapshot
from sealing import plan_of, seal_often

import castore
import castore.maintenance.gc
from castore.maintenance.fsck import Finding, Severity, check_store
from castore.maintenance.sealing import seal_task
from castore.watch import Watcher

TASK = "lost/1"
STEPS = 12
# Which slots lose their names: HEAD, one in the middle, several (HEAD, the root, between).
LOSSES = {"head": (6,), "middle": (3,), "several": (0, 2, 3, 6)}


def make_store(root: Path, version: int) -> castore.Store:
    """A store of format `version` with TASK at HEAD 6 (six steps committed)."""
    store = castore.Store.init(root)
    if version == 1:  # as castore 0.1.x made it (test_seal.py does the same)
        Path(store.layout.marker).write_bytes(b'{"format":"castore","version":1}\n')
        store = castore.Store.open(root)
    assert version == store.format_version
    with store.start(TASK, plan_of(STEPS)) as run:
        for _ in range(6):
            run.commit_step(str(run.next_step), {"done": run.next_step})
    return store


def slot_path(store: castore.Store, seq: int) -> str:
    return store._slots(TASK).path(seq)


def lose_names(store: castore.Store, seqs: tuple[int, ...], task: str = TASK) -> list[str]:
    """Unlink the object names of the snapshots in slots `seqs`; their store-relative paths."""
    lost = []
    slots = store._slots(task)
    for seq in seqs:
        object_id = castore.format.digest.hash_bytes(slots.read(seq))
        os.unlink(store.objects.path(object_id))
        lost.append(os.path.relpath(store.objects.path(object_id), store.root))
    return lost


def findings(store: castore.Store) -> tuple[list[Finding], int]:
    """fsck's findings (it must change nothing) and its exit status."""
    before = tree_snapshot(store.root)
    summary = castore.maintenance.fsck.Summary()
    found = list(check_store(store.root, jobs=1, summary=summary))
    assert before == tree_snapshot(store.root), "fsck changed the store"
    return found, summary.exit_status


def named_again(store: castore.Store, seq: int) -> bool:
    """True if slot `seq` and its snapshot's object name are one file again."""
    object_id = castore.format.digest.hash_bytes(store._slots(TASK).read(seq))
    path = store.objects.path(object_id)
    return os.path.lexists(path) and os.path.samestat(
        os.lstat(path), os.lstat(slot_path(store, seq))
    )


@pytest.mark.parametrize("which", sorted(LOSSES))
def test_resume_after_lost_names_gives_the_same_state_and_brief(tmp_path: Path, which: str) -> None:
    """v2: with names lost (HEAD, a middle slot, several), verify, status, the brief (head
    and full) and resume give what they gave before, and the run commits on."""
    store = make_store(tmp_path / "s", 2)
    before = store.verify(TASK)
    brief_before = store.brief(TASK, now_ms=10**13)
    lose_names(store, LOSSES[which])
    after = store.verify(TASK)
    assert (before.head_id, before.length, before.plan_id) == (
        after.head_id,
        after.length,
        after.plan_id,
    )
    assert brief_before == store.brief(TASK, now_ms=10**13)
    assert brief_before == store.brief(TASK, now_ms=10**13, verify=True)
    status = store.status(TASK)
    assert (None, 6, before.head_id) == (status.error, status.seq, status.head)
    with store.resume(TASK, plan_of(STEPS)) as run:
        assert (before.head_id, "s6") == (run.head_id, run.next_step)
        assert {"done": "s2"} == run.result("s2")
        run.commit_step("s6", "on")
    assert 7 == store.verify(TASK).head.seq


def test_the_first_commit_after_resume_gives_head_its_name_back(tmp_path: Path) -> None:
    """v2: a resumed run's first commit links HEAD's slot back to its object name first."""
    store = make_store(tmp_path / "s", 2)
    lose_names(store, (6,))
    with store.resume(TASK, plan_of(STEPS)) as run:
        assert not named_again(store, 6)
        run.commit_step("s6", "on")
        assert named_again(store, 6)


@pytest.mark.parametrize("which", sorted(LOSSES))
def test_fsck_warns_of_a_lost_name_in_v2(tmp_path: Path, which: str) -> None:
    """v2: each slot whose name is lost is one `snapshot-name-lost` warning at the slot;
    nothing else is found and the exit status is 0."""
    store = make_store(tmp_path / "s", 2)
    lost = lose_names(store, LOSSES[which])
    found, status = findings(store)
    expected = [
        ("snapshot-name-lost", Severity.WARNING, f"tasks/lost%2F1/chain/{seq:016d}", TASK)
        for seq in LOSSES[which]
    ]
    assert expected == [(f.code, f.severity, f.path, f.task) for f in found]
    assert [os.path.basename(path) for path in lost] == [f.object_id for f in found]
    assert 0 == status


def test_fsck_cli_exits_0_on_a_lost_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`castore fsck` on a v2 store with a lost name: the warning printed, exit status 0."""
    store = make_store(tmp_path / "s", 2)
    lose_names(store, (3,))
    code, out, _ = cli(capsys, "fsck", store.root)
    assert 0 == code
    assert "snapshot-name-lost" in out


@pytest.mark.parametrize("which", sorted(LOSSES))
def test_fsck_keeps_slot_not_published_an_error_in_v1(tmp_path: Path, which: str) -> None:
    """v1 (whose writers always made the name durable): the same state is damage,
    `slot-not-published` errors and exit status 1; gc leaves the names to a person. Readers
    still read the snapshots from their slots (the bytes verify the same way)."""
    store = make_store(tmp_path / "s", 1)
    head_id = store.verify(TASK).head_id
    lose_names(store, LOSSES[which])
    found, status = findings(store)
    expected = [("slot-not-published", Severity.ERROR, seq) for seq in LOSSES[which]]
    assert expected == [(f.code, f.severity, int(f.path[-16:])) for f in found]
    assert 1 == status
    assert [] == castore.maintenance.gc.collect(store.root).names_restored
    assert head_id == store.verify(TASK).head_id


@pytest.mark.parametrize("which", sorted(LOSSES))
def test_gc_restores_lost_names_and_fsck_is_clean_after(tmp_path: Path, which: str) -> None:
    """v2: gc links every lost name back to its slot (durably) and says so; a dry run only
    says so; fsck then finds nothing."""
    store = make_store(tmp_path / "s", 2)
    lost = lose_names(store, LOSSES[which])
    dry = castore.maintenance.gc.collect(store.root, dry_run=True)
    assert (sorted(lost), []) == (sorted(dry.names_restored), dry.removed)
    assert not any(named_again(store, seq) for seq in LOSSES[which])
    report = castore.maintenance.gc.collect(store.root)
    assert (sorted(lost), []) == (sorted(report.names_restored), report.removed)
    assert all(named_again(store, seq) for seq in LOSSES[which])
    assert ([], 0) == findings(store)
    assert [] == castore.maintenance.gc.collect(store.root).names_restored


def test_a_slot_whose_bytes_changed_is_still_damage(tmp_path: Path) -> None:
    """v2: a middle slot with its name gone and other bytes in it (not its child's parent)
    is not a lost name: resume refuses the chain, fsck says `slot-not-published` (error)
    and `broken-link` at its child."""
    store = make_store(tmp_path / "s", 2)
    lose_names(store, (3,))
    # A valid snapshot 3 of this task from another history (another store, other times).
    other = Path(slot_path(make_store(tmp_path / "other", 2), 3)).read_bytes()
    path = Path(slot_path(store, 3))
    assert other != path.read_bytes()
    path.unlink()
    path.write_bytes(other)
    with pytest.raises(castore.ChainError, match="at slot 3"):
        store.resume(TASK, plan_of(STEPS))
    found, status = findings(store)
    by_code = {(f.code, f.severity, int(f.path[-16:])) for f in found if "chain/" in f.path}
    assert ("slot-not-published", Severity.ERROR, 3) in by_code
    assert ("broken-link", Severity.ERROR, 4) in by_code
    assert not any(f.code == "snapshot-name-lost" for f in found)
    assert 1 == status


@pytest.mark.usefixtures(seal_often.__name__)
def test_seal_prune_fork_status_watch_and_brief_work_with_lost_names(tmp_path: Path) -> None:
    """v2: a task whose HEAD and middle slots lost their names forks, shows in status and
    watch as intact, briefs, and seals (the prune removes the nameless slots); fsck is then
    clean."""
    store = make_store(tmp_path / "s", 2)
    lose_names(store, (1, 4, 6))
    forked = store.fork(f"{TASK}@4", "copy")
    assert (4, 0) == (forked.seq, store.verify("copy").head.seq)
    assert None is store.status(TASK).error
    assert None is store.status(TASK, verify=True).error
    assert "s6" in store.brief(TASK).text
    alerts: list[castore.watch.alerts.Alert] = []
    with Watcher(store.root, alerts.append, rescan_every=3600.0, stuck_after=3600.0) as watcher:
        watcher.check_now()
    assert [] == [a for a in alerts if a.kind == "chain"]
    report = seal_task(store, TASK)
    assert report.anchor is not None
    chain = store.verify(TASK)
    assert (7, 6) == (chain.head.seq, report.anchor.through)
    assert not any(store._slots(TASK).exists(seq) for seq in range(7))
    assert ([], 0) == findings(store)


def test_show_and_log_read_a_snapshot_whose_name_is_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """v2: `castore show TASK@SEQ` shows a snapshot whose name is lost, from its slot; `log`
    of a chain broken elsewhere (slot 1 nameless and rewritten) shows the nameless slot 4 as
    intact and slot 1 (its parent is not slot 0's snapshot) as broken."""
    store = make_store(tmp_path / "s", 2)
    lose_names(store, (4,))
    code, out, _ = cli(capsys, "--store", store.root, "show", f"{TASK}@4", "--json")
    assert (0, 4) == (code, json.loads(out)["value"]["seq"])
    other = Path(slot_path(make_store(tmp_path / "other", 2), 1)).read_bytes()
    lose_names(store, (1,))
    Path(slot_path(store, 1)).unlink()
    Path(slot_path(store, 1)).write_bytes(other)
    code, out, _ = cli(capsys, "--store", store.root, "log", TASK, "--json")
    rows = {row.get("seq"): row for row in map(json.loads, out.splitlines())}
    assert (True, True) == ("problem" not in rows[4], "problem" in rows[1])


def test_gc_cli_says_which_names_it_gives_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """v2: `castore gc --dry-run` lists the names it would give back, `gc --json` those it
    gave back."""
    store = make_store(tmp_path / "s", 2)
    (lost,) = lose_names(store, (3,))
    code, out, _ = cli(capsys, "--store", store.root, "gc", "--dry-run")
    assert 0 == code
    assert f"would give back the name {lost}" in out
    code, out, _ = cli(capsys, "--store", store.root, "gc", "--json")
    assert (0, [lost]) == (code, json.loads(out)["names_restored"])
