"""The tools on an S3 store (issue 25 item 5), on each engine: gc removes only what no
chain names (reading only the slots above a task's sealed mark, though S3 keeps the ones
below), gc looping with no grace against writers in other processes loses no acknowledged
commit, and `castore watch` follows another process's commits by listing (S3 has no events).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from s3proxy import Fault, FaultProxy
from s3servers import S3Endpoint
from sealing import EVERY, seal_often
from test_gc_handshake import race_writers_against_gc
from test_watch import Alerts, make_unresolved

import castore
from castore.maintenance.gc import collect
from castore.medium.s3 import S3Medium
from castore.watch import Watcher

__all__ = ["seal_often"]  # a fixture, imported for the tests below
HOUR = 3600.0


def test_gc_on_s3_removes_garbage_and_keeps_what_chains_name(s3: S3Endpoint) -> None:
    """Blobs no snapshot names go; the ones a committed step names, and the plan, stay."""
    url = s3.new_bucket()
    store = castore.Store.init(url)
    plan = castore.Plan.build("gc", "a", "b")
    kept = store.put_blob({"kept": 1})
    garbage = [store.put_blob({"garbage": n}) for n in range(5)]
    with store.start("t", plan, lock_timeout=None) as run:
        run.commit_step("a", kept)
    report = collect(url, grace_s=0)
    assert sorted(f"objects/{g.blob[:2]}/{g.blob}" for g in garbage) == sorted(report.removed)
    assert {"kept": 1} == store.get_blob(kept.blob)
    with store.resume("t", plan, lock_timeout=None) as run:
        run.commit_step("b", "done")
    assert [] == collect(url, grace_s=0).removed


def test_gc_on_s3_reads_only_the_slots_above_the_sealed_mark(
    s3: S3Endpoint, seal_often: int
) -> None:
    """S3 keeps a pruned slot (no name is ever freed); gc does not read it (the pack its
    anchor names holds that snapshot, and gc follows the pack): what the old steps name is
    kept all the same, and the whole history still reads back."""
    url = s3.new_bucket()
    store = castore.Store.init(url)
    steps = 5 * EVERY
    plan = castore.Plan.build("sealed", *(f"s{i}" for i in range(steps)))
    first = store.put_blob({"named by": "step 0"})
    with store.start("t", plan, lock_timeout=None) as run:
        run.commit_step("s0", first)
        for i in range(1, steps - 2):
            run.commit_step(f"s{i}", i)
    mark = store._slots("t").mark()
    assert mark is not None
    assert mark.through >= EVERY - 1  # one pack at least: slots 0 to 7
    # A pack the closing run's sealer wrote but no anchor names yet is garbage, and the only
    # thing gc may remove here: never the pack the mark names, never a snapshot or a blob.
    for key in collect(url, grace_s=0, dry_run=True).removed:
        assert store.medium.read(key).startswith(b"castore 2 pack "), key
        assert not key.endswith(mark.pack), key
    collect(url, grace_s=0)
    with FaultProxy(s3.url) as proxy:
        assert [] == collect_through(s3, proxy, url).removed
    # GETs: a HEAD of slot 0 (does the task exist?) reads no snapshot.
    read = {
        entry.path.rsplit("/", 1)[-1]
        for entry in proxy.log
        if entry.method == "GET" and "/chain/" in entry.path
    }
    assert set() == {name for name in read if name.isdigit() and int(name) <= mark.through}
    assert {"named by": "step 0"} == store.get_blob(first.blob)
    history = store.history("t")
    assert list(range(steps - 1)) == sorted(snapshot.seq for _, snapshot in history)
    with store.resume("t", plan, lock_timeout=None) as run:
        run.commit_step(f"s{steps - 2}", "after gc")


def collect_through(s3: S3Endpoint, proxy: FaultProxy, url: str) -> Any:
    """gc of the store at `url`, its requests through `proxy` (the environment gc reads)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3.env(proxy.url).items():
            patch.setenv(name, value)
        return collect(url, grace_s=0)


def test_writers_racing_gc_on_s3_lose_no_acknowledged_commit(
    s3: S3Endpoint, children: list[subprocess.Popen[str]]
) -> None:
    """Writers in three processes (blob results and effects) and gc looping with grace 0 in
    this one: every acknowledged commit is in its chain and every blob it named reads back."""
    url = s3.new_bucket()
    race_writers_against_gc(castore.Store.init(url), url, children, garbage=10, rounds=6)


@pytest.fixture
def s3_watchers(s3: S3Endpoint) -> Iterator[Callable[..., Watcher]]:
    made: list[Watcher] = []

    def make(url: str, on_alert: Alerts, **options: Any) -> Watcher:
        options.setdefault("rescan_every", HOUR)
        options.setdefault("stuck_after", HOUR)
        watcher = Watcher(url, on_alert, **options)
        made.append(watcher)
        return watcher

    yield make
    for watcher in made:
        watcher.stop()


def test_watch_on_s3_follows_another_process_by_listing(
    s3: S3Endpoint, s3_watchers: Callable[..., Watcher]
) -> None:
    """A worker process leaves an effect UNRESOLVED on S3: the watcher (listing every 0.2 s,
    S3 has no events) raises one alert; resolving it clears it."""
    url = s3.new_bucket()
    store = castore.Store.init(url)
    alerts = Alerts()
    watcher = s3_watchers(url, alerts, poll=0.2)
    assert "listing every 0.2s" == watcher.mode
    watcher.start()
    make_unresolved(store, "order-1")
    raised = alerts.wait("unresolved", task="order-1", timeout=30)
    assert "castore resolve order-1 charge" in raised.message
    store.resolve("order-1", "charge", not_done=True, reason="not in the ledger")
    alerts.wait("unresolved", "cleared", task="order-1", timeout=30)
    assert 1 == alerts.count("unresolved", "raised")
    assert [] == [a for a in alerts.all if a.kind == "observer"]


def test_watch_on_s3_alerts_when_its_listing_fails_and_recovers(
    s3: S3Endpoint, s3_watchers: Callable[..., Watcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint fails the watcher's listings: an observer alert (never a task that
    looks empty); once it answers again the alert clears."""
    url = s3.new_bucket()
    castore.Store.init(url)
    with FaultProxy(s3.url) as proxy:
        for name, value in s3.env(proxy.url).items():
            monkeypatch.setenv(name, value)
        alerts = Alerts()
        s3_watchers(url, alerts, poll=0.2).start()
        proxy.arm(Fault("status", method="GET", path=r"list-type=2", times=40, status=500))
        down = alerts.wait("observer", timeout=60)
        assert "listing" in down.message
        alerts.wait("observer", "cleared", timeout=90)
    assert isinstance(S3Medium.from_url(url), S3Medium)


def test_a_resume_on_s3_reads_a_short_tail_not_every_step(s3: S3Endpoint) -> None:
    """On S3 runs seal every S3Medium.seal_every commits (a resume GETs each slot above the
    sealed mark, one round trip each): resuming a 300-step task takes about that many requests
    plus some 20, not one per step."""
    url = s3.new_bucket()
    store = castore.Store.init(url)
    steps = 300
    plan = castore.Plan.build("long", *(f"s{i}" for i in range(steps)))
    with store.start("t", plan, lock_timeout=None) as run:
        for i in range(steps):
            run.commit_step(f"s{i}", i)
    every = S3Medium.seal_every
    assert every is not None
    reopened = castore.Store.open(url)
    medium = reopened.medium
    assert isinstance(medium, S3Medium)
    mark = reopened._slots("t").mark()
    assert mark is not None
    # The closing run's last seal may still be behind: at most one more tail's worth.
    assert steps - mark.through <= 2 * every
    before = medium.client.requests
    with reopened.resume("t", plan, lock_timeout=None) as run:
        head = run.head.seq  # the last step's, or a seal's anchor after it
    assert head >= steps
    # The rest: the marker, the mark, its pack, the plan and a HEAD search of ~log2(n) HEADs.
    assert medium.client.requests - before <= head - mark.through + 32 < steps
