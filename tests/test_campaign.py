"""Small crash campaigns per service mode, judged again here from the service's ledger file,
and the proof that a campaign fails when effects are resubmitted blindly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import castore
from castore.lab import worker
from castore.lab.campaign import Settings, Tally, campaign
from castore.lab.service import applied_counts, read_ledger

ROOT = Path(__file__).resolve().parent.parent
RUNS = 5
SEED = 11  # its schedule drops answers in every mode, so mode none goes UNRESOLVED


def keys_of(seed: int, runs: int) -> dict[str, tuple[str, str]]:
    """Every effect key the campaign's tasks use: key -> (task, step)."""
    plan_digest = castore.plan_id(worker.PLAN)
    keys = {}
    for index in range(runs):
        task = f"order-{seed}-{index}"
        for step in worker.EFFECTS:
            keys[castore.derive_key(task, plan_digest, step)] = (task, step)
    return keys


def went_unresolved(store: castore.Store, task: str) -> set[str]:
    """The effects of `task` whose chain records a move to UNRESOLVED."""
    return {
        snapshot.transition.step or ""
        for _, snapshot in store.history(task)
        if snapshot.transition.effect_to is castore.EffectState.UNRESOLVED
    }


def assert_clean(tally: Tally) -> None:
    assert (0, 0, 0, 0) == (tally.duplicates, tally.lost, tally.corrupt, tally.mismatched), (
        tally.problems
    )
    assert [] == tally.problems
    assert True is tally.ok


@pytest.mark.parametrize("mode", ["lookup", "idempotent", "none"])
def test_small_campaign_has_no_duplicate_loss_or_corruption(tmp_path: Path, mode: str) -> None:
    """A killing campaign applies every effect once, an UNRESOLVED one (mode none) never twice."""
    tally = campaign(tmp_path, RUNS, Settings(mode, SEED))
    assert_clean(tally)
    assert RUNS == tally.runs
    assert tally.kills > 0
    if mode != "none":
        assert 0 == tally.unresolved_reported
    # Independently of castore and of the campaign's own check: the ledger file itself.
    ledger = tmp_path / f"ledger-{mode}.jsonl"
    keys = keys_of(SEED, RUNS)
    counts = applied_counts(ledger)
    assert set(keys) == set(counts)
    assert dict.fromkeys(keys, 1) == counts
    assert len(keys) == len(read_ledger(ledger))
    store = castore.Store.open(tmp_path / "store")
    for task in {task for task, _ in keys.values()}:
        store.verify(task)
        assert True is store.status(task).finished
    if mode == "none":
        # Answers were dropped after the commit: outcomes were unknown, reported, never guessed.
        assert tally.unresolved_reported > 0
        plan_digest = castore.plan_id(worker.PLAN)
        unresolved = [(t, s) for t in store.tasks() for s in sorted(went_unresolved(store, t))]
        assert [] != unresolved
        over = {(t, s): counts.get(castore.derive_key(t, plan_digest, s), 0) for t, s in unresolved}
        assert {} == {where: n for where, n in over.items() if n > 1}


def test_blind_resubmission_makes_the_campaign_report_duplicates(tmp_path: Path) -> None:
    """Misdeclaring lookup-only services as deduplicating is caught: duplicates > 0."""
    tally = campaign(tmp_path, 6, Settings("lookup", 7, blind=True))
    assert tally.duplicates > 0, tally
    assert False is tally.ok
    counts = applied_counts(tmp_path / "ledger-lookup.jsonl")
    # The ledger file agrees with the tally: the surplus applications are the duplicates.
    assert tally.duplicates == sum(n - 1 for n in counts.values())
    assert any("applied" in problem for problem in tally.problems)


def parse_report(stdout: str) -> dict[str, str]:
    """The key=value lines at the end of the campaign tool's output."""
    report = {}
    for line in reversed(stdout.strip().splitlines()):
        key, sep, value = line.partition("=")
        if not sep or " " in key:
            break
        report[key] = value
    return report


def test_crash_campaign_tool_prints_key_value_report() -> None:
    """tools/crash_campaign.py ends with runs=, kills=, duplicates=, lost=, ... and exits 0."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "crash_campaign.py"), "--runs", "3", "--seed", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert 0 == result.returncode, result.stdout + result.stderr
    report = parse_report(result.stdout)
    wanted = {"runs", "kills", "duplicates", "lost", "unresolved_reported", "corrupt"}
    assert set() == wanted - set(report)
    assert "3" == report["runs"]
    assert int(report["kills"]) > 0
    assert ("0", "0", "0") == (report["duplicates"], report["lost"], report["corrupt"])
    assert "lookup" == report["mode"]
