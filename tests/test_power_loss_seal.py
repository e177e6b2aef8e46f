"""Power loss during sealing, with the crash model and checker of tests/test_power_loss.py
(read its docstring): a task is committed while its run seals every 4 commits (a pack
published, the next commit naming it, the mark, the prune of slots and their objects) and is
sealed whole when it finishes; every crash state it allows is built and checked with castore,
and every acknowledged commit must survive.

The checker is test_power_loss's, and also checks the tasks whose slot 0 a prune removed (a
task with a sealed mark has started). Self-test: a sealer that writes the mark and prunes as
soon as its pack is published, before a durable commit names the pack, must make the checker
fail (a state whose HEAD does not reach the pack, with the slots below it gone).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import test_power_loss as pl
from test_power_loss import STORE, Exploration, Op, Recorder, Verdict, explore, scratch_dir

import castore
import castore.chain.seal
import castore.store
from castore.chain.sealmark import started_by_mark
from castore.errors import CastoreError
from castore.format.layout import CHAIN_DIR, TASKS_DIR, decode_task_id
from castore.format.records import Sealed, Snapshot

PLAN = castore.Plan.build("plseal", *(f"s{i}" for i in range(7)))
EVERY = 4
# fsck learns packs and marks from the kinds helper's branch (castore/chain/references.py with it).
FSCK_KNOWS_PACKS = importlib.util.find_spec("castore.chain.references") is not None


def seal_workload(base: Path, ops: list[Op]) -> None:
    """A task of 7 steps sealing every 4 commits, then sealed whole at close. The sealing
    thread is drained after each commit, so the recording has one order."""
    store = castore.Store.init(base / STORE)
    ops.append(Op("ack_init"))
    run = store.start("job-s", PLAN)
    sealer = run._sealer
    assert sealer is not None
    for step in PLAN.steps:
        run.commit_step(step.id, {"step": step.id})
        sealer.drain()
    run.close()
    chain = store.verify("job-s")
    assert chain.head.sealed is not None  # the finish seal happened, and pruned
    assert not os.path.exists(store.layout.slot_path("job-s", 0))


def record(base: Path) -> list[Op]:
    base.mkdir()
    recorder = Recorder(str(base))
    with recorder.installed():
        seal_workload(base, recorder.ops)
    return recorder.ops


def check_sealed_state(base: Path) -> Verdict:
    """test_power_loss.check_state, plus every task whose slot 0 is pruned below a mark."""
    verdict = CHECK_STATE(base)
    tasks = base / STORE / TASKS_DIR
    if not verdict.store or not tasks.is_dir():
        return verdict
    store = castore.Store.open(base / STORE)
    for name in sorted(os.listdir(tasks)):
        chain = tasks / name / CHAIN_DIR
        if not (chain / f"{0:016d}").exists() and started_by_mark(store.medium, f"tasks/{name}"):
            pl._check_task(store, decode_task_id(name), chain, verdict)
    if not FSCK_KNOWS_PACKS:
        verdict.fsck_errors = []  # main's fsck reads a pack as undecodable: see the test below
    return verdict


CHECK_STATE = pl.check_state  # explore() calls pl.check_state: these tests put theirs there


def run_exploration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, stop: bool = False
) -> Exploration:
    monkeypatch.setattr(castore.store, "SEAL_EVERY", EVERY)
    ops = record(tmp_path / "base")
    monkeypatch.setattr(pl, "check_state", check_sealed_state)
    (tmp_path / "states").mkdir()
    with scratch_dir(tmp_path / "states") as scratch:
        result = explore(ops, scratch, stop_at_first=stop)
    print(f"\npower loss (sealing): {result.summary()}")
    return result


def test_power_loss_during_sealing_loses_no_acknowledged_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every crash state of a run that seals twice (every 4 commits, and whole at the end),
    writing packs, marks and prunes: invariant I holds and every acknowledged commit is in
    the chain, read through its packs."""
    result = run_exploration(tmp_path, monkeypatch)
    assert result.states > 50, result.summary()
    for kind in ("invariant", "acks"):
        failures = getattr(result, kind)
        if failures:
            pytest.fail(
                f"{result.summary()}\n{kind}: {len(failures)} state(s):\n{pl._report(failures)}",
                pytrace=False,
            )


@pytest.mark.skipif(not FSCK_KNOWS_PACKS, reason="fsck learns packs with the kinds branch")
def test_fsck_reports_no_error_in_any_sealing_power_loss_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every crash state of sealing is one fsck finds no error in (leftovers are notes)."""
    result = run_exploration(tmp_path, monkeypatch)
    assert [] == [f"{f}" for f in result.fsck][:5]


def test_self_test_pruning_before_a_commit_names_the_pack_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sealer that writes the mark and prunes right after publishing its pack (before the
    commit naming it is durable): some crash state has slots pruned below a HEAD that does
    not name the pack, which the checker must report."""
    real_build = castore.chain.seal.Sealer._build

    def eager(
        self: castore.chain.seal.Sealer,
        chunk: list[bytes],
        records: list[Snapshot | None],
        anchor: Sealed | None,
        parent: bytes | None,
    ) -> None:
        real_build(self, chunk, records, anchor, parent)
        ready = self._ready
        assert ready is not None
        castore.chain.seal.prune(self._slots, ready)  # the protocol's order broken on purpose

    monkeypatch.setattr(castore.chain.seal.Sealer, "_build", eager)
    try:
        result = run_exploration(tmp_path, monkeypatch, stop=True)
    except CastoreError as exc:  # the workload itself may already trip over the damage
        pytest.fail(f"the workload failed before any crash state was checked: {exc}")
    assert result.invariant or result.acks, f"no failure found: {result.summary()}"
    print(f"self-test caught: {(result.invariant + result.acks)[0]}")
