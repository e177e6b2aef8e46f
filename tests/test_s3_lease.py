"""The task lease on S3 (castore.medium.s3lease): a second worker is refused as the
directory's lock refuses it, a freed lease is taken at once, an expired one after its term on
the taker's own clock, and a SIGKILLed holder's lease after its term; the holder that was
taken over loses its next commit at the commit point, as it would without a lease."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import sim
from s3servers import S3Endpoint

import castore
from castore.errors import ConflictError, TaskBusyError
from castore.maintenance.fsck import check_store
from castore.medium import s3lease
from castore.store import Store

PLAN = castore.Plan.build("p", "a", "b", "c")
TERM_S = 0.4


def _leasing_world() -> tuple[sim.Server, Store]:
    server = sim.Server(sim.AWS, random.Random(0), sim.NO_FAULTS)
    Store.init(sim.medium(server))
    store = _store(server)
    with store.open_task("t", PLAN) as run:  # the task exists: the next opens take its lease
        run.commit_step("a", 1)
    return server, store


def _store(server: sim.Server) -> Store:
    medium = sim.medium(server)
    medium.lease_s = TERM_S
    return Store(medium)


def test_a_second_worker_is_refused_while_the_lease_is_held() -> None:
    server, store = _leasing_world()
    held = store.resume("t", PLAN)
    try:
        started = time.monotonic()
        with pytest.raises(TaskBusyError, match="leased by another worker") as refused:
            _store(server).resume("t", PLAN, lock_timeout=0.2)
        assert refused.value.lease
        assert time.monotonic() - started >= 0.2
        time.sleep(TERM_S * 1.5)  # the holder renews: its lease does not expire
        with pytest.raises(TaskBusyError):
            _store(server).resume("t", PLAN, lock_timeout=TERM_S * 1.5)
    finally:
        held.close()
    started = time.monotonic()
    with _store(server).resume("t", PLAN, lock_timeout=1.0) as run:  # freed: taken at once
        assert time.monotonic() - started < TERM_S
        run.commit_step("b", 2)


def test_a_lease_whose_holder_stopped_renewing_is_taken_over_after_its_term(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, store = _leasing_world()
    monkeypatch.setattr(s3lease.Lease, "_start_renewing", lambda self: None)  # a paused holder
    paused = store.resume("t", PLAN)
    started = time.monotonic()
    with _store(server).resume("t", PLAN, lock_timeout=5.0) as taker:
        waited = time.monotonic() - started
        assert TERM_S <= waited < TERM_S * 4
        taker.commit_step("b", "taker's")
    with pytest.raises(ConflictError):
        paused.commit_step("b", "paused holder's")  # it loses at the commit point
    paused.close()


@pytest.mark.s3
def test_a_sigkilled_holders_lease_is_taken_after_its_term(s3: S3Endpoint) -> None:
    url = s3.new_bucket()
    with Store.open(url, create=True).open_task("t", PLAN) as run:
        run.commit_step("a", 1)
    child = textwrap.dedent(
        f"""
        import sys, time, castore
        plan = castore.Plan.build("p", "a", "b", "c")
        run = castore.Store.open({url!r}, lease_s=1.0).resume("t", plan)
        print("held", flush=True)
        time.sleep(600)
        """
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TaskBusyError):
            Store.open(url, lease_s=1.0).resume("t", PLAN, lock_timeout=0.3)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        started = time.monotonic()
        with Store.open(url, lease_s=1.0).resume("t", PLAN, lock_timeout=20) as run:
            waited = time.monotonic() - started
            run.commit_step("b", 2)
        assert 1.0 <= waited < 6.0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert Store.open(url).status("t").error is None
    findings = list(check_store(Store.open(url).medium))  # the claims are no unknown files
    assert [f.code for f in findings if f.severity != "info"] == []
