"""On S3, sealing's prune and gc cost what changed since they last ran, not the history (issue
40, item 2). S3 keeps every pruned slot (`retire` keeps its key and bytes), so a prune that
listed and read the slots below its mark, or a gc that listed a task's whole chain and
reclaimed a forgotten task again at every run, paid for every step the task ever took.

Counted request by request, by the client castore itself uses (each request with the thread
that sent it, the operation and the key): on the simulated endpoint (tests/sim.py) over
thousands of commits, and on each real engine (moto, RGW) over a shorter history.
"""

from __future__ import annotations

import collections
import random
import threading
from typing import Any

import pytest
import sim
from s3servers import S3Endpoint
from sealing import EVERY, seal_often

import castore
import castore.chain.seal
from castore.maintenance.gc import collect
from castore.medium.s3 import S3Medium
from castore.medium.s3client import Client

__all__ = ["seal_often"]  # a fixture, imported for the tests below


class Requests:
    """Every request castore's S3 clients send while it is installed: (thread, operation,
    key), in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, str, str]] = []

    def since(self, start: int, thread: int | None = None) -> list[tuple[str, str]]:
        return [(op, key) for who, op, key in self.sent[start:] if thread in (None, who)]


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Requests:
    found = Requests()
    original = Client.call

    def call(self: Client, where: str, operation: str, **params: Any) -> Any:
        key = str(params.get("Key", params.get("StartAfter", params.get("Prefix", ""))))
        found.sent.append((threading.get_ident(), operation, key))
        return original(self, where, operation, **params)

    monkeypatch.setattr(Client, "call", call)
    return found


@pytest.fixture
def prunes(monkeypatch: pytest.MonkeyPatch, requests: Requests) -> list[list[tuple[str, str]]]:
    """The requests of each prune a sealer runs (on its own thread), in order."""
    made: list[list[tuple[str, str]]] = []
    original = castore.chain.seal.prune

    def prune(*args: Any, **kwargs: Any) -> None:
        start = len(requests.sent)
        original(*args, **kwargs)
        made.append(requests.since(start, threading.get_ident()))

    monkeypatch.setattr(castore.chain.seal, "prune", prune)
    return made


def sim_store(seal_every: int = 64) -> castore.Store:
    server = sim.Server(sim.AWS, random.Random(40), sim.NO_FAULTS)
    castore.Store.init(sim.medium(server, seal_every=seal_every))
    return castore.Store(sim.medium(server, seal_every=seal_every))


def chain_reads(sent: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The requests that read or list a chain's slots."""
    return [(op, key) for op, key in sent if "/chain/" in key and op != "put_object"]


def commit(store: castore.Store, task: str, steps: int) -> None:
    with store.open_task(task, castore.Plan.grow("g"), lock_timeout=None) as run:
        for i in range(steps):
            run.append(f"s{i}", i)


def test_each_prune_on_s3_costs_the_same_over_thousands_of_commits(
    prunes: list[list[tuple[str, str]]],
) -> None:
    """A task of 64 x 48 commits on the simulated endpoint, sealed every 64: every prune makes
    the same requests (the sealed mark's, and nothing of the chain), the first as the last.
    Before, the n-th prune read the n x 64 slots below its mark again (GETs per 256 commits
    rose 192, 448, 704)."""
    store = sim_store()
    commit(store, "long", 64 * 48)
    assert len(prunes) >= 10  # how many: as fast as the sealer's thread kept up
    assert [] == [chain_reads(each) for each in prunes if chain_reads(each)]
    costs = collections.Counter(len(each) for each in prunes)
    assert 1 == len(costs), costs  # one cost for all, whatever the history below
    assert max(costs) <= 3, prunes[-1]  # the next generation's HEAD, its PUT (and a look)
    # The whole history still reads back, and resumes.
    assert 64 * 48 <= len(store.history("long"))


def forget(store: castore.Store, task: str) -> None:
    store.forget(task, who="test", why="done with it")


def test_gc_on_s3_reclaims_a_forgotten_task_once_and_then_costs_the_same(
    requests: Requests,
) -> None:
    """Tasks forgotten over time, on the simulated endpoint, gc after each: each forgotten
    task is reported reclaimed by one gc only, the reclaim itself reads nothing below a
    tombstone, and a gc after the last forget costs what the one before it did, however long
    the forgotten histories (a short and a 2,000-step task cost the same)."""
    store = sim_store()
    commit(store, "short", 10)
    commit(store, "long", 2000)
    commit(store, "live", 70)
    reported: list[list[str]] = []
    costs: list[int] = []
    for task in ("short", "long", None, None, None):
        if task is not None:
            forget(store, task)
        start = len(requests.sent)
        reported.append(collect(store.medium, grace_s=0).reclaimed)  # type: ignore[arg-type]
        sent = requests.since(start)
        costs.append(len(sent))
        if task != "short":  # no slot below the tombstone of "long" is read
            tombstone = store._slots("long").head_seq()
            for op, key in chain_reads(sent):
                if "/long/" in key and op == "get_object":
                    assert key.endswith(f"/{tombstone:016d}"), key
    assert [["short"], ["long"], [], [], []] == reported
    assert costs[2] == costs[3] == costs[4], costs


def test_a_gc_on_s3_lists_a_long_task_from_its_mark(requests: Requests) -> None:
    """gc reads the slots above a task's sealed mark only, and lists them from there: a task
    of 5,000 commits (five pages of keys under its chain) costs the pages above its mark."""
    store = sim_store()
    commit(store, "long", 5000)
    mark = store._slots("long").mark()
    assert mark is not None
    # A page of slot keys at least below it (how far: as fast as the sealer's thread kept up;
    # 1,855 of 5,000 under CI's load).
    assert mark.through >= 1000
    start = len(requests.sent)
    report = collect(store.medium, grace_s=0)  # type: ignore[arg-type]
    assert [] == report.removed
    listings = [key for op, key in requests.since(start) if op == "list_objects_v2"]
    # gc's reads of the slots start after the mark's slot (StartAfter); the one other listing
    # is HEAD lookup's single page (MaxKeys 1,000, reclaim's look at HEAD).
    chain = collections.Counter(key for key in listings if "/chain/" in key)
    after = f"store/tasks/long/chain/{mark.through:016d}"
    assert {after, "store/tasks/long/chain/"} == set(chain), chain
    # One read of the new slots (nothing is set aside: every loose object is still named), in
    # pages of 1,000 keys above the mark.
    pages = max(1, -(-(5000 - mark.through) // 1000))
    assert pages == chain[after], (pages, chain)
    assert 1 == chain["store/tasks/long/chain/"], chain


def test_prune_and_gc_on_each_engine_are_flat(
    s3: S3Endpoint, seal_often: int, prunes: list[list[tuple[str, str]]], requests: Requests
) -> None:
    """The same on moto and RGW (their listings honour StartAfter): every prune of a task
    sealed every EVERY commits costs the same and reads no slot; a forgotten task is reclaimed
    by the first gc only, and later gcs cost the same."""
    store = castore.Store.init(s3.new_bucket())
    assert isinstance(store.medium, S3Medium)
    commit(store, "t", 12 * EVERY)
    assert len(prunes) >= 3  # how many: as fast as the sealer's thread kept up
    assert [] == [chain_reads(each) for each in prunes if chain_reads(each)]
    assert 1 == len({len(each) for each in prunes}), prunes
    forget(store, "t")
    commit(store, "live", 3 * EVERY)
    reported, costs = [], []
    for _ in range(3):
        start = len(requests.sent)
        reported.append(collect(store.root, grace_s=0).reclaimed)
        costs.append(len(requests.since(start)))
    assert [["t"], [], []] == reported
    assert costs[1] == costs[2], costs
