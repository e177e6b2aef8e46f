"""castore on S3 (issue 25), on each engine in turn (conftest's `s3`: moto's server, a Ceph
RADOS Gateway): the commit point is PUT If-None-Match, two writers in two processes race and
exactly one wins each round, a paused writer loses when it wakes, the crash lab's campaign
(workers SIGKILLed, restarted) loses and duplicates nothing, and a store refuses an endpoint
that lets a second exclusive create succeed.
"""

from __future__ import annotations

import json
import os
import signal
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
from helpers import wait_for
from s3servers import S3Endpoint
from test_concurrency import (  # the same workers as on shared filesystems
    CTX,
    DEADLINE,
    TASK,
    children,
    join_ok,
    paused_writer,
    plan_of,
    process_state,
    race_worker,
    spawn,
)

import castore
import castore.medium.s3
from castore.errors import UnsafeEndpointError
from castore.lab.campaign import Settings, campaign
from castore.lab.service import read_ledger
from castore.medium.s3 import VERDICT_KEY, S3Medium

__all__ = ["children"]  # a fixture, imported for the tests below
ROUNDS = 12  # each round is a resume and a commit per process: about 1 s on RGW


def test_a_plain_commit_is_one_request(s3: S3Endpoint) -> None:
    """A step with an inline result costs one PUT (the slot, If-None-Match), no more."""
    store = castore.Store.init(s3.new_bucket())
    assert isinstance(store.medium, S3Medium)
    with store.start(TASK, castore.Plan.grow("g"), lock_timeout=None) as run:
        run.append("warm", 0)
        before = store.medium.client.requests
        for step in range(10):
            run.append(f"s{step}", step)
        assert 10 == store.medium.client.requests - before
    assert 11 == len(castore.Store.open(store.root).history(TASK)) - 1


def test_two_processes_race_and_exactly_one_wins_each_round(
    s3: S3Endpoint, tmp_path: Path, children: list[BaseProcess]
) -> None:
    """Each round a writer in each of two processes (two S3 clients) commits from the same
    HEAD: one wins, none is lost, every won commit is in the chain."""
    url = s3.new_bucket()
    store = castore.Store.init(url)
    store.start(TASK, plan_of(ROUNDS), lock_timeout=None).close()
    barrier = CTX.Barrier(2)
    outs = [tmp_path / f"worker{n}.json" for n in (0, 1)]
    workers = [spawn(children, race_worker, url, ROUNDS, barrier, n, str(outs[n])) for n in (0, 1)]
    for worker in workers:
        join_ok(worker)
    logs = [json.loads(out.read_text()) for out in outs]
    outcomes = [sorted(entry[0] for entry in pair) for pair in zip(*logs, strict=True)]
    assert [["lost", "won"]] * ROUNDS == outcomes
    history = store.history(TASK)
    assert list(range(ROUNDS, -1, -1)) == [snapshot.seq for _, snapshot in history]
    won = {(entry[1], entry[4]) for log in logs for entry in log if entry[0] == "won"}
    assert {(snapshot.seq - 1, i) for i, snapshot in history[:-1]} == won


def test_a_stopped_writer_is_rejected_after_another_process_advanced(
    s3: S3Endpoint, tmp_path: Path, children: list[BaseProcess]
) -> None:
    """SIGSTOP a writer; another process advances the task; SIGCONT: the first conflicts
    (no lock on S3: the conditional PUT alone decides)."""
    url = s3.new_bucket()
    store = castore.Store.init(url)
    with store.start(TASK, plan_of(3), lock_timeout=None) as run:
        parent_id = run.head_id
    ready, go, out = CTX.Event(), tmp_path / "go", tmp_path / "paused.json"
    writer = spawn(children, paused_writer, url, ready, str(go), str(out))
    assert ready.wait(DEADLINE)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGSTOP)
    wait_for(lambda: process_state(writer.pid or 0) == "T", what="the writer to stop")
    go.touch()
    with castore.Store.open(url).resume(TASK, plan_of(3), lock_timeout=None) as other:
        winner = other.commit_step("s0", "from another process")
    os.kill(writer.pid, signal.SIGCONT)
    join_ok(writer)
    assert ["conflict", parent_id, winner, 1, "still-stale"] == json.loads(out.read_text())
    assert 2 == store.verify(TASK).length


def test_crash_campaign_on_s3_loses_and_duplicates_nothing(s3: S3Endpoint, tmp_path: Path) -> None:
    """The crash lab's sample workers, killed at random and at named points and restarted,
    commit to an S3 store: the service's ledger shows every key applied once."""
    url = s3.new_bucket()
    tally = campaign(tmp_path, runs=3, settings=Settings("lookup", seed=11), store_paths=[url])  # type: ignore[list-item]
    assert (0, 0, 0, 0) == (tally.duplicates, tally.lost, tally.corrupt, tally.mismatched), (
        tally.problems
    )
    assert tally.kills > 0
    counts: dict[str, int] = {}
    for entry in read_ledger(tmp_path / "ledger-lookup.jsonl"):
        counts[entry["key"]] = counts.get(entry["key"], 0) + 1
    assert {1} == set(counts.values())


def test_a_store_refuses_an_endpoint_that_let_a_second_create_succeed(s3: S3Endpoint) -> None:
    """The store's record of its endpoint says a second PUT If-None-Match succeeded (what an
    endpoint that ignores the condition does): opening it fails, naming `castore doctor`."""
    url = s3.new_bucket()
    store = castore.Store.init(url)
    assert isinstance(store.medium, S3Medium)
    recorded = json.loads(store.medium.read(VERDICT_KEY))
    assert True is recorded["exclusive_create"]
    store.medium.replace(VERDICT_KEY, json.dumps({"exclusive_create": False}).encode())
    with pytest.raises(UnsafeEndpointError, match="castore doctor"):
        castore.Store.open(url)
