"""fsck on S3 reads with threads on the client's own pool (issue 40, item 4), on each engine:
the same findings as one thread, damage included, from requests sent by several threads of
one client."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from s3servers import S3Endpoint

import castore
from castore.maintenance.fsck import check_store
from castore.medium.s3client import Client


def test_fsck_on_s3_reads_in_threads_and_finds_what_one_thread_finds(
    s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = s3.new_bucket()
    store = castore.Store.init(url)
    plan = castore.Plan.build("threads", "a", "b")
    blobs = []
    for task in range(24):
        with store.start(f"t{task}", plan, lock_timeout=None) as run:
            blobs.append(store.put_blob({"task": task}))
            run.commit_step("a", blobs[-1])
            run.commit_step("b", task)
    store.put_blob({"named by": "nothing"})  # unreachable: an info finding
    damaged = f"objects/{blobs[5].blob[:2]}/{blobs[5].blob}"
    store.medium.heal(damaged, b"castore 1 blob 3\n{}\n")  # bytes that are not the blob
    senders: list[tuple[str, int]] = []
    original = Client.call

    def call(self: Client, where: str, operation: str, **params: Any) -> Any:
        senders.append((threading.current_thread().name, id(self._s3)))
        return original(self, where, operation, **params)

    monkeypatch.setattr(Client, "call", call)
    threaded = sorted(str(f) for f in check_store(url))
    names = {name for name, _ in senders}
    clients = {client for _, client in senders}
    senders.clear()
    serial = sorted(str(f) for f in check_store(url, jobs=1))
    assert threaded == serial
    assert any(damaged in finding for finding in threaded), threaded
    assert any("unreachable-object" in finding for finding in threaded), threaded
    assert len({n for n in names if n.startswith("castore-fsck")}) > 1, names
    assert 1 == len(clients)  # one client: its connection pool, shared by the threads
    assert {name for name, _ in senders} == {"MainThread"}
