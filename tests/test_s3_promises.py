"""Issue 38's four holes, each reproduced directly on the simulated endpoint (tests/sim.py),
without a scheduler: each test fails on the code before its fix. The seeded simulation
(tests/test_simulation.py) finds the same holes by search."""

from __future__ import annotations

import os
import random
from pathlib import Path

import botocore.exceptions
import pytest
import sim

import castore
from castore.errors import ReadOnlyStoreError
from castore.format.layout import object_key
from castore.maintenance.fsck import check_store
from castore.maintenance.fsck.quarantine import quarantine
from castore.medium import s3client
from castore.medium.s3 import S3Medium
from castore.store import Store


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Time:
        monotonic = staticmethod(lambda: 0.0)
        sleep = staticmethod(lambda seconds: None)

    monkeypatch.setattr(s3client, "time", _Time)


def _world(profile: sim.Profile) -> sim.Server:
    server = sim.Server(profile, random.Random(0), sim.NO_FAULTS)
    Store.init(sim.medium(server))
    return server


def _damaged_blob(server: sim.Server) -> tuple[Store, str, str]:
    """A task whose result blob is then damaged where it lies: (store, blob id, its S3 key)."""
    store = Store(sim.medium(server))
    with store.open_task("t", castore.Plan.build("p", "a")) as run:
        run.commit_step("a", store.put_blob("x" * 6000))
        blob = run.outcome("a").result_ref
    assert blob is not None
    key = sim.medium(server).s3_key(object_key(blob))
    server.put(key, b"damaged")
    return store, blob, key


def test_quarantine_never_deletes_bytes_stored_again_after_it_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hole 1: fsck judged the key damaged; another remover took it away and a writer stored
    it again, intact, before this fsck's DELETE. The DELETE carries the damaged bytes' ETag:
    refused, the intact object stays (the old unconditional DELETE removed it)."""
    server = _world(sim.AWS)
    store, blob, key = _damaged_blob(server)
    findings = list(check_store(store.medium))
    intact = Store(sim.medium(server))

    def judged_then_replaced(self: S3Medium, *args: object, **kwargs: object) -> object:
        del server.objects[key]  # a second remover
        intact.put_blob("x" * 6000)  # a writer stores it again: its create succeeds
        return original_copy(self, *args, **kwargs)

    from castore.medium import s3aside  # noqa: PLC0415 - the step patched

    original_copy = s3aside._copy_judged
    monkeypatch.setattr(s3aside, "_copy_judged", judged_then_replaced)
    _, moved, _ = quarantine(store.medium, findings)
    assert moved == []
    assert server.intact_removed == []
    assert sim.medium(server).read(object_key(blob))  # the intact object is there


def test_quarantine_leaves_the_key_where_delete_ignores_if_match() -> None:
    """On an endpoint that ignores If-Match on DELETE (Ceph RGW 16.2) nothing can remove only
    the damaged bytes: the key is copied aside and left, and a writer heals it."""
    server = _world(sim.RGW)
    store, blob, key = _damaged_blob(server)
    where, moved, copied = quarantine(store.medium, list(check_store(store.medium)))
    assert (moved, [f.object_id for f in copied]) == ([], [blob])
    assert server.objects[key].data == b"damaged"
    assert f"store/{where}/{object_key(blob)}" in server.objects
    Store(sim.medium(server)).put_blob("x" * 6000)  # a writer that needs the blob heals it
    with Store(sim.medium(server)).resume("t", castore.Plan.build("p", "a")) as run:
        assert run.result("a") == "x" * 6000


def test_a_plain_delete_is_sent_once_whatever_its_answer() -> None:
    """Hole 2: a DELETE whose answer was lost is not retried (a writer may have stored the key
    again meanwhile); gc's settle then waits it out."""
    server = _world(sim.AWS)
    medium = sim.medium(server)
    server.put(medium.s3_key("objects/ab/k"), b"1")
    sent: list[str] = []
    s3 = medium.client._s3
    assert isinstance(s3, sim.SimS3)
    real = s3.delete_object

    def lost(**params: object) -> object:
        sent.append("DELETE")
        real(**params)  # type: ignore[arg-type]
        raise botocore.exceptions.ReadTimeoutError(endpoint_url=sim.ENDPOINT)

    s3.delete_object = lost  # type: ignore[method-assign]
    medium.remove("objects/ab/k")
    assert sent == ["DELETE"]
    assert medium.client.unanswered is not None
    medium.settle()
    assert medium.client.unanswered is None


def test_the_inflight_identity_survives_a_change_of_directory(tmp_path: Path) -> None:
    """Hole 3: the registry's key is the medium's identity, the same from any working
    directory (it was os.path.realpath of the s3:// URL)."""
    server = _world(sim.AWS)
    store = Store(sim.medium(server))
    plan = castore.Plan.build("p", "a")
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        first = store.open_task("t", plan, lock_timeout=None)
        place = first.task_place
        first.close()
        (tmp_path / "elsewhere").mkdir()
        os.chdir(tmp_path / "elsewhere")
        second = Store(sim.medium(server)).resume("t", plan, lock_timeout=None)
        assert second.task_place == place
        second.close()
    finally:
        os.chdir(cwd)
    assert place.startswith(f"s3:{sim.ENDPOINT}/{sim.BUCKET}/store/")


def test_a_directory_store_has_one_identity_by_any_path(tmp_path: Path) -> None:
    Store.init(tmp_path / "s")
    (tmp_path / "link").symlink_to(tmp_path / "s")
    assert (
        Store.open(tmp_path / "s").medium.identity == Store.open(tmp_path / "link").medium.identity
    )


def test_a_reader_of_a_task_whose_prune_was_cut_short_writes_nothing() -> None:
    """Hole 4: HEAD carries a seal's anchor, the mark is behind (its writer died after the
    seal's commit). A resume that commits nothing (a saver's get_tuple) writes nothing; on a
    read-only store it does not fail (the old resume finished the prune: marks/0 and slots)."""
    server = _world(sim.AWS)
    store = Store(sim.medium(server))
    plan = castore.Plan.build("p", *(f"s{n}" for n in range(11)))
    with store.open_task("t", plan) as run:
        for n in range(10):
            run.commit_step(f"s{n}", f"s{n}")
        run.seal_now()
    marks = [key for key in server.objects if "/marks/" in key]
    assert marks
    for key in marks:
        server.delete(key)  # the mark is behind HEAD's anchor
    writes = sum(server.writes_by.values())
    run = Store(sim.medium(server)).resume("t", plan, lock_timeout=None)  # may write: none
    assert run.result("s9") == "s9"
    run.close()
    assert sum(server.writes_by.values()) == writes
    reader = Store(sim.medium(server), read_only=True)  # would raise on any write
    reader.resume("t", plan, lock_timeout=None).close()
    with pytest.raises(ReadOnlyStoreError, match="opened read-only"):
        reader.put_blob("never")
    # The next writer finishes the prune, through its first commit.
    with Store(sim.medium(server)).resume("t", plan) as run:
        run.commit_step("s10", "s10")
    assert any("/marks/" in key for key in server.objects)
