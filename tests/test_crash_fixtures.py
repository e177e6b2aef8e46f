"""The seed's crash fixtures, each its own test: the sample worker runs as a real process against
the fake service (a real process too), is SIGKILLed at one moment, and is restarted. The judge
is the service's ledger FILE (read_ledger/applied_counts), not castore's view of it.

Plan of the sample worker, with the commit (seq) and object (#) each transition writes:
plan object #1; start seq 0 #2; quote seq 1 #3; charge SUBMITTED seq 2 #4; charge CONFIRMED
seq 3 #5; reserve seq 4 #6; ship seq 5/6 #7/#8; notify seq 7/8 #9/#10; summary seq 9 #11.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import misnamed_objects, wait_for

import castore
from castore.cli import main as cli_main
from castore.crashpoints import ENV_VAR
from castore.lab import worker
from castore.lab.service import ServiceProcess, applied_counts, read_ledger, start_service

TASK = "order-7"
REFERENCE = {"amount": 3750, "slot": "bay-5"}
WORKER_TIMEOUT_S = 60.0
ALL_ONCE = {"charge": 1, "ship": 1, "notify": 1}
RECOVERING_MODES = ("lookup", "idempotent")


@dataclass
class Lab:
    """One store, one fake service in one mode, and the sample worker's task against them."""

    root: Path
    store: castore.Store
    svc: ServiceProcess
    ledger: Path
    mode: str
    task: str = TASK

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "castore.lab.worker",
            "--store",
            str(self.root),
            "--task",
            self.task,
            "--service",
            self.svc.url,
            "--mode",
            self.mode,
        ]

    def env(self, crash_at: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        if crash_at is not None:
            env[ENV_VAR] = crash_at
        return env

    def run(self, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run the worker to its end (or its crash point) as a real process."""
        return subprocess.run(
            self.command(),
            capture_output=True,
            text=True,
            env=self.env(crash_at),
            timeout=WORKER_TIMEOUT_S,
            check=False,
        )

    def spawn(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(None),
        )

    def key(self, step: str) -> str:
        return castore.derive_key(self.task, castore.plan_id(worker.PLAN), step)

    def counts(self) -> dict[str, int]:
        """How often the service applied each effect of the task, per its ledger file."""
        applied = applied_counts(self.ledger)
        return {step: applied.get(self.key(step), 0) for step in worker.EFFECTS}

    def ledger_receipt(self, step: str) -> str:
        """The receipt of the first application of `step`'s key, per the ledger file."""
        receipts = [e["receipt"] for e in read_ledger(self.ledger) if e["key"] == self.key(step)]
        assert receipts, f"{step} is not in the ledger"
        return str(receipts[0])

    def effect_state(self, step: str) -> str | None:
        status = self.store.status(self.task)
        return next((e.state for e in status.effects if e.step == step), None)

    def transitions(self, step: str, to: castore.EffectState) -> int:
        """How many committed transitions moved `step` into state `to`."""
        return sum(
            1
            for _, snapshot in self.store.history(self.task)
            if snapshot.transition.step == step and snapshot.transition.effect_to is to
        )


@pytest.fixture
def make_lab(tmp_path: Path) -> Iterator[Callable[[str], Lab]]:
    """lab(mode): a fresh store and a fake service process in `mode`, stopped at teardown."""
    started: list[ServiceProcess] = []

    def make(mode: str) -> Lab:
        root = tmp_path / "store"
        store = castore.Store.init(root)  # made here: the worker's object writes start at #1
        ledger = tmp_path / f"ledger-{mode}.jsonl"
        svc = start_service(ledger, mode)
        started.append(svc)
        return Lab(root, store, svc, ledger, mode)

    yield make
    for svc in started:
        svc.stop()


def summary_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The summary a finished worker printed as its last line."""
    last = result.stdout.strip().splitlines()[-1]
    done: dict[str, Any] = json.loads(last)["done"]
    return done


def assert_killed(result: subprocess.CompletedProcess[str]) -> None:
    assert -signal.SIGKILL == result.returncode, result.stdout + result.stderr


def assert_finished_like_crash_free(lab: Lab, result: subprocess.CompletedProcess[str]) -> None:
    """Exit 0; results equal a crash-free run's; each effect applied once; the store verifies."""
    assert worker.EXIT_DONE == result.returncode, result.stdout + result.stderr
    receipts = {step: lab.ledger_receipt(step) for step in worker.EFFECTS}
    expected = {**REFERENCE, "receipts": receipts}
    assert expected == summary_of(result)
    assert ALL_ONCE == lab.counts()
    chain = lab.store.verify(lab.task)
    assert expected == chain.outcomes["summary"].result
    assert receipts == {step: chain.outcomes[step].receipt for step in worker.EFFECTS}
    assert True is lab.store.status(lab.task).finished
    assert [] == misnamed_objects(lab.root)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """castore's CLI in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_reported_unresolved(
    lab: Lab, result: subprocess.CompletedProcess[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The worker exits 6 naming the charge and its key; `castore status` says UNRESOLVED."""
    assert worker.EXIT_UNKNOWN == result.returncode, result.stdout + result.stderr
    assert f"unresolved: charge {lab.key('charge')}" == result.stdout.strip().splitlines()[-1]
    assert "UNRESOLVED" == lab.effect_state("charge")
    code, out, _ = cli(capsys, "--store", str(lab.root), "status", lab.task)
    assert 6 == code
    assert "effect charge: UNRESOLVED" in out
    code, out, _ = cli(capsys, "--store", str(lab.root), "status", lab.task, "--json")
    assert 6 == code
    effects = json.loads(out.splitlines()[0])["effects"]  # then the summary line
    assert [("charge", "UNRESOLVED", lab.key("charge"))] == [
        (e["step"], e["state"], e["key"]) for e in effects
    ]


# --------------------------------------------------------------------------- crash-free


@pytest.mark.parametrize("mode", ["lookup", "idempotent", "none"])
def test_crash_free_run_gives_the_reference_results(
    make_lab: Callable[[str], Lab], mode: str
) -> None:
    """Without a crash the worker finishes with amount 3750, slot bay-5, each effect once."""
    lab = make_lab(mode)
    assert_finished_like_crash_free(lab, lab.run())


# --------------------------------------------------------------------------- before submission


@pytest.mark.parametrize("mode", RECOVERING_MODES)
def test_interruption_before_submission_applies_the_charge_exactly_once(
    make_lab: Callable[[str], Lab], mode: str
) -> None:
    """Killed after SUBMITTED is durable but before sending, a restart charges exactly once."""
    lab = make_lab(mode)
    assert_killed(lab.run("effect.submitted:1"))
    assert {"charge": 0, "ship": 0, "notify": 0} == lab.counts()
    assert "SUBMITTED" == lab.effect_state("charge")
    assert_finished_like_crash_free(lab, lab.run())


def test_interruption_before_submission_without_capabilities_is_unresolved_not_guessed(
    make_lab: Callable[[str], Lab], capsys: pytest.CaptureFixture[str]
) -> None:
    """Mode none: a restart reports the never-sent charge UNRESOLVED and does not send it."""
    lab = make_lab("none")
    assert_killed(lab.run("effect.submitted:1"))
    assert_reported_unresolved(lab, lab.run(), capsys)
    assert {"charge": 0, "ship": 0, "notify": 0} == lab.counts()
    code, _, err = cli(
        capsys, "--store", str(lab.root), "resolve", lab.task, "charge", "--not-done",
        "--reason", "no such key in the payment ledger",
    )  # fmt: skip
    assert (0, "") == (code, err)
    assert_finished_like_crash_free(lab, lab.run())


# --------------------------------------------------------------------------- during the request


def kill_while_in_flight(lab: Lab) -> None:
    """Start the worker, let the service commit the charge and hang; SIGKILL the worker then."""
    lab.svc.client().control(hang_after_commit_s=30)
    process = lab.spawn()
    try:
        wait_for(lambda: lab.counts()["charge"] == 1, what="the service to apply the charge")
        assert None is process.poll()  # still waiting for the answer: the request is in flight
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=WORKER_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert -signal.SIGKILL == process.returncode
    assert "SUBMITTED" == lab.effect_state("charge")


@pytest.mark.parametrize("mode", RECOVERING_MODES)
def test_interruption_during_the_request_applies_the_charge_exactly_once(
    make_lab: Callable[[str], Lab], mode: str
) -> None:
    """Killed while the request is in flight (applied, unanswered), a restart charges once."""
    lab = make_lab(mode)
    kill_while_in_flight(lab)
    assert_finished_like_crash_free(lab, lab.run())
    assert 1 == lab.transitions("charge", castore.EffectState.CONFIRMED)


def test_interruption_during_the_request_without_capabilities_is_unresolved(
    make_lab: Callable[[str], Lab], capsys: pytest.CaptureFixture[str]
) -> None:
    """Mode none: the restart exits 6, status says UNRESOLVED, and the charge stays applied once."""
    lab = make_lab("none")
    kill_while_in_flight(lab)
    assert_reported_unresolved(lab, lab.run(), capsys)
    assert {"charge": 1, "ship": 0, "notify": 0} == lab.counts()
    assert_reported_unresolved(lab, lab.run(), capsys)  # a second restart does not guess either
    assert 1 == lab.counts()["charge"]
    receipt = lab.ledger_receipt("charge")
    code, _, err = cli(
        capsys, "--store", str(lab.root), "resolve", lab.task, "charge", "--confirmed", receipt
    )
    assert (0, "") == (code, err)
    assert_finished_like_crash_free(lab, lab.run())


# --------------------------------------------------------------------------- after remote commit


def test_after_remote_commit_lookup_mode_reconciles_by_key(
    make_lab: Callable[[str], Lab],
) -> None:
    """Killed after the service committed but before CONFIRMED, a restart finds it by key."""
    lab = make_lab("lookup")
    assert_killed(lab.run("effect.sent:1"))
    assert {"charge": 1, "ship": 0, "notify": 0} == lab.counts()
    assert "SUBMITTED" == lab.effect_state("charge")
    assert_finished_like_crash_free(lab, lab.run())
    chain = lab.store.verify(lab.task)
    assert lab.ledger_receipt("charge") == chain.outcomes["charge"].receipt
    reconciled = [
        s.transition.why
        for _, s in lab.store.history(lab.task)
        if s.transition.step == "charge" and s.transition.effect_to is castore.EffectState.CONFIRMED
    ]
    assert ["reconciled: found by key"] == reconciled
    assert 1 == lab.transitions("charge", castore.EffectState.SUBMITTED)  # never resubmitted


def test_after_remote_commit_idempotent_mode_resubmits_and_the_service_dedupes(
    make_lab: Callable[[str], Lab],
) -> None:
    """Killed after the remote commit, a restart resubmits the same key; the ledger has one."""
    lab = make_lab("idempotent")
    assert_killed(lab.run("effect.sent:1"))
    assert {"charge": 1, "ship": 0, "notify": 0} == lab.counts()
    assert_finished_like_crash_free(lab, lab.run())
    assert 2 == lab.transitions("charge", castore.EffectState.SUBMITTED)  # the resubmission
    chain = lab.store.verify(lab.task)
    assert lab.ledger_receipt("charge") == chain.outcomes["charge"].receipt


def test_after_remote_commit_without_capabilities_is_unresolved(
    make_lab: Callable[[str], Lab], capsys: pytest.CaptureFixture[str]
) -> None:
    """Mode none: killed after the remote commit, a restart reports UNRESOLVED; count stays 1."""
    lab = make_lab("none")
    assert_killed(lab.run("effect.sent:1"))
    assert_reported_unresolved(lab, lab.run(), capsys)
    assert {"charge": 1, "ship": 0, "notify": 0} == lab.counts()
    receipt = lab.ledger_receipt("charge")
    code, _, err = cli(
        capsys, "--store", str(lab.root), "resolve", lab.task, "charge", "--confirmed", receipt
    )
    assert (0, "") == (code, err)
    assert_finished_like_crash_free(lab, lab.run())


# --------------------------------------------------------------------------- after confirmation


@pytest.mark.parametrize("mode", ["lookup", "idempotent", "none"])
def test_interruption_after_confirmation_skips_the_charge(
    make_lab: Callable[[str], Lab], mode: str
) -> None:
    """Killed right after CONFIRMED is durable, a restart skips the charge and goes on."""
    lab = make_lab(mode)
    assert_killed(lab.run("effect.confirmed:1"))
    assert {"charge": 1, "ship": 0, "notify": 0} == lab.counts()
    assert None is lab.effect_state("charge")
    assert "reserve" == lab.store.status(lab.task).step
    assert_finished_like_crash_free(lab, lab.run())
    assert 1 == lab.transitions("charge", castore.EffectState.SUBMITTED)


# --------------------------------------------------------------------------- mid write, mid commit


@pytest.mark.parametrize("nth", [1, 4, 5, 11])
@pytest.mark.parametrize("mode", RECOVERING_MODES)
def test_interruption_mid_object_write_recovers(
    make_lab: Callable[[str], Lab], mode: str, nth: int
) -> None:
    """Killed halfway through writing object #nth, a restart completes; nothing is torn."""
    lab = make_lab(mode)
    assert_killed(lab.run(f"object.mid_write:{nth}"))
    assert [] == misnamed_objects(lab.root)
    assert_finished_like_crash_free(lab, lab.run())


@pytest.mark.parametrize("nth", [1, 3, 4, 10])
@pytest.mark.parametrize("mode", RECOVERING_MODES)
def test_interruption_mid_commit_point_recovers(
    make_lab: Callable[[str], Lab], mode: str, nth: int
) -> None:
    """Killed after commit #nth's slot link but before its directory sync, a restart completes."""
    lab = make_lab(mode)
    assert_killed(lab.run(f"commit.linked:{nth}"))
    assert nth - 1 == lab.store.status(lab.task).seq
    assert_finished_like_crash_free(lab, lab.run())
