"""Clock skew never sends a charge twice: hosts with their own clocks, one service, its ledger.

Each worker is a real process (tests/clock_worker.py) whose store clock is the wall clock plus
its own offset; the lab service (a real process with a durable ledger) measures its retention
window with its own clock too. castore resubmits an interrupted effect to a deduplicating
service only while no clock reading it can see contradicts the resuming host's clock, and
ends the window CLOCK_TOLERANCE_MS before the declared retention.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import castore
from castore import Action, EffectState
from castore.format.effects import CLOCK_TOLERANCE_MS, ChainClock, effect_action
from castore.format.records import EffectRecord
from castore.lab.service import ServiceProcess, applied_counts, start_service

WORKER = Path(__file__).with_name("clock_worker.py")
TASK = "charge-1"  # the worker's task and plan
PLAN = castore.Plan.build("charge", "prep", castore.effect("pay", "prep"), "after")
KEY = castore.derive_key(TASK, castore.plan_id(PLAN), "pay")
MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS


class Hosts:
    """A store, a ledger and the lab services a test started, one worker process per call."""

    def __init__(self, tmp_path: Path) -> None:
        self.store_path = tmp_path / "store"
        self.ledger = tmp_path / "ledger.jsonl"
        self.service: ServiceProcess | None = None

    def serve(self, retention_s: int, clock_offset_ms: int = 0) -> None:
        """(Re)start the idempotent service on the same ledger, its clock set apart."""
        if self.service is not None:
            self.service.stop()
        self.service = start_service(
            self.ledger, "idempotent", retention_s, clock_offset_s=clock_offset_ms / 1000
        )

    def worker(
        self, offset_ms: int, retention_s: int, crash_at: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Run one worker with its clock `offset_ms` from the wall clock: (exit code, report)."""
        assert self.service is not None
        env = {**os.environ, "CASTORE_TEST_CLOCK_OFFSET_MS": str(offset_ms)}
        env.pop("CASTORE_CRASH_AT", None)
        if crash_at is not None:
            env["CASTORE_CRASH_AT"] = crash_at
        argv = [sys.executable, str(WORKER), str(self.store_path), self.service.url]
        proc = subprocess.run(
            [*argv, str(retention_s)],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if crash_at is not None:
            assert -signal.SIGKILL == proc.returncode, proc.stderr
            return proc.returncode, {}
        assert proc.returncode in (0, 6), proc.stderr
        return proc.returncode, json.loads(proc.stdout)

    def racing(self, offsets: list[int], retention_s: int) -> list[tuple[int, dict[str, Any]]]:
        """Start one worker per clock offset at once; (exit code, report) of each."""
        assert self.service is not None
        argv = [sys.executable, str(WORKER), str(self.store_path), self.service.url]
        procs = []
        for offset in offsets:
            env = {**os.environ, "CASTORE_TEST_CLOCK_OFFSET_MS": str(offset)}
            env.pop("CASTORE_CRASH_AT", None)
            procs.append(
                subprocess.Popen(
                    [*argv, str(retention_s)], env=env, stdout=subprocess.PIPE, text=True
                )
            )
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=60)
            results.append((proc.returncode, json.loads(out) if out else {}))
        return results

    def counts(self) -> dict[str, int]:
        return applied_counts(self.ledger)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    """Hosts whose service is stopped at the end of the test."""
    found = Hosts(tmp_path)
    yield found
    if found.service is not None:
        found.service.stop()


def test_a_fast_host_then_a_resume_90_minutes_later_escalates_instead_of_charging_again(
    hosts: Hosts,
) -> None:
    """A host 2 h fast submits to a service that deduplicates for 1 h and dies; a host with
    a true clock resumes 90 min later: a negative age is clock skew, UNRESOLVED; one charge."""
    hosts.serve(retention_s=3600)
    hosts.worker(2 * HOUR_MS, 3600, crash_at="effect.sent")
    assert {KEY: 1} == hosts.counts()
    hosts.serve(retention_s=3600, clock_offset_ms=90 * MINUTE_MS)  # 90 minutes have passed
    code, report = hosts.worker(90 * MINUTE_MS, 3600)
    assert (6, "mark-unresolved", "unresolved") == (code, report["action"], report["outcome"])
    assert "clock skew: the first submission is dated 30.0 min after this host" in report["reason"]
    assert "castore resolve" in report["reason"]
    assert "clock skew" in report["error"]
    assert f"castore resolve {TASK} pay" in report["error"]
    store = castore.Store.open(hosts.store_path)
    [effect] = store.status(TASK).effects
    assert ("UNRESOLVED", "escalate") == (effect.state, effect.next_action)
    assert "clock skew" in effect.reason
    assert {KEY: 1} == hosts.counts()


def test_workers_with_clocks_set_apart_racing_to_resume_all_escalate(hosts: Hosts) -> None:
    """After the fast host's crash, three workers whose clocks are 90 min ahead, 3 h ahead
    and 30 min behind resume at once: each ends UNRESOLVED (one marks it, the others find it
    so), and the service still holds one charge."""
    hosts.serve(retention_s=3600)
    hosts.worker(2 * HOUR_MS, 3600, crash_at="effect.sent")
    hosts.serve(retention_s=3600, clock_offset_ms=90 * MINUTE_MS)
    results = hosts.racing([90 * MINUTE_MS, 3 * HOUR_MS, -30 * MINUTE_MS], 3600)
    assert [6, 6, 6] == [code for code, _ in results]
    assert ["unresolved"] * 3 == [report["outcome"] for _, report in results]
    assert {KEY: 1} == hosts.counts()


def test_writers_whose_clocks_disagree_escalate_even_inside_the_retention(
    hosts: Hosts,
) -> None:
    """A host 2 h fast commits "prep", a true-clock host submits "pay" and dies: the chain's
    times go backwards, so a third host (within the 24 h retention by its clock) escalates."""
    hosts.serve(retention_s=86400)
    hosts.worker(2 * HOUR_MS, 86400, crash_at="commit.done:2")  # 1: start, 2: prep
    hosts.worker(0, 86400, crash_at="effect.sent")
    code, report = hosts.worker(150 * MINUTE_MS, 86400)
    assert (6, "mark-unresolved") == (code, report["action"])
    assert "clock skew: snapshot 2 is dated 2.0 h before its parent" in report["reason"]
    assert {KEY: 1} == hosts.counts()


def test_a_resuming_host_behind_a_later_writer_escalates(hosts: Hosts) -> None:
    """A true-clock host submits and dies; a host 1 h fast resubmits (deduplicated) and dies;
    a host 20 min fast then sees a first submission 20 min old, but a snapshot dated 40 min
    after its own clock: UNRESOLVED, not resubmitted; one charge."""
    hosts.serve(retention_s=86400)
    hosts.worker(0, 86400, crash_at="effect.sent")
    hosts.worker(HOUR_MS, 86400, crash_at="effect.sent")
    record = castore.Store.open(hosts.store_path).verify(TASK).head.effect("pay")
    assert record is not None
    assert (EffectState.SUBMITTED, 2) == (record.state, record.attempts)
    code, report = hosts.worker(20 * MINUTE_MS, 86400)
    assert (6, "mark-unresolved") == (code, report["action"])
    assert "snapshot 3 of the task is dated 40.0 min after this host's clock" in report["reason"]
    assert {KEY: 1} == hosts.counts()


# -- the rule itself, on records -------------------------------------------------------------------


def _submitted(first_ms: int, retention_s: int = 3600) -> EffectRecord:
    return EffectRecord(
        "pay",
        KEY,
        EffectState.SUBMITTED,
        first_ms,
        attempts=1,
        first_submitted_ms=first_ms,
        idempotent=True,
        retention_s=retention_s,
    )


@pytest.mark.parametrize(
    ("age_ms", "expected"),
    [
        (0, Action.RESUBMIT),
        (HOUR_MS - CLOCK_TOLERANCE_MS - 1, Action.RESUBMIT),
        (HOUR_MS - CLOCK_TOLERANCE_MS, Action.MARK_UNRESOLVED),  # the safety margin
        (HOUR_MS - 1, Action.MARK_UNRESOLVED),
        (-1, Action.MARK_UNRESOLVED),  # a submission 1 ms in the future: clock skew
        (-2 * HOUR_MS, Action.MARK_UNRESOLVED),
    ],
)
def test_retention_window_is_never_open_for_a_negative_age_and_ends_a_margin_early(
    age_ms: int, expected: Action
) -> None:
    """0 <= age < retention - CLOCK_TOLERANCE_MS, or no resubmission."""
    now = 1_800_000_000_000
    assert expected == effect_action(_submitted(now - age_ms), now).action


def test_a_retention_shorter_than_the_tolerance_never_resubmits() -> None:
    """A service that deduplicates for less than the clock tolerance is treated as not
    deduplicating after a crash: the window would be no wider than the skew castore allows."""
    now = 1_800_000_000_000
    record = _submitted(now, retention_s=CLOCK_TOLERANCE_MS // 1000)
    assert Action.MARK_UNRESOLVED == effect_action(record, now).action


@pytest.mark.parametrize(
    ("clock", "why"),
    [
        (ChainClock(latest_ms=1, latest_seq=4), "snapshot 4 of the task is dated 1.0 s after"),
        (ChainClock(backwards_ms=90_000, backwards_seq=3), "snapshot 3 is dated 1.5 min before"),
    ],
    ids=["chain-ahead-of-this-host", "chain-backwards"],
)
def test_what_the_chain_shows_of_its_clocks_stops_a_resubmission(
    clock: ChainClock, why: str
) -> None:
    """Any time in the chain after this host's now, or any step back between two snapshots,
    however small, escalates an idempotent-only effect with the skew in the reason."""
    now = 1_800_000_000_000
    if clock.latest_ms is not None:
        clock = ChainClock(latest_ms=now + 1000, latest_seq=clock.latest_seq)
    action = effect_action(_submitted(now - MINUTE_MS), now, clock)
    assert Action.MARK_UNRESOLVED == action.action
    assert why in action.reason
    assert Action.RESUBMIT == effect_action(_submitted(now - MINUTE_MS), now, ChainClock()).action
