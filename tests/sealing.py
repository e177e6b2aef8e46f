"""Helpers for the sealing tests: v2 stores that seal often, and forged tails."""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs
import pytest

import castore
import castore.store
from castore.chain import packs
from castore.chain.verify import decode_snapshot, verify_chain
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.records import Plan, Snapshot, snapshot_version

EVERY = 8  # seal every 8 commits: many packs from short tasks


def v2_store(root: str | os.PathLike[str]) -> castore.Store:
    """A new store at `root`, format v2 (checked: these tests are about v2)."""
    store = castore.Store.init(root)
    assert 2 == store.format_version
    return store


@pytest.fixture
def seal_often(monkeypatch: pytest.MonkeyPatch) -> int:
    """Runs of this test seal every EVERY commits."""
    monkeypatch.setattr(castore.store, "SEAL_EVERY", EVERY)
    return EVERY


def plan_of(steps: int) -> Plan:
    return Plan.build("sealed", *(f"s{i}" for i in range(steps)))


def run_steps(store: castore.Store, task: str, plan: Plan, count: int | None = None) -> None:
    """Open `task` and commit `count` of its next steps (all of them if None), results of
    each step its own name, a blob for every fifth; the sealing thread is waited for after
    each commit, so the tests can say where each seal lands."""
    with store.open_task(task, plan) as run:
        for done, step in enumerate(run.pending()):
            if count is not None and done >= count:
                break
            index = int(step[1:])
            result = store.put_blob({"step": step}) if index % 5 == 4 else step
            run.commit_step(step, result)
            if run._sealer is not None:  # each seal lands at the same commit, however loaded
                run._sealer.drain()


def framed_history(store: castore.Store, task: str) -> list[bytes]:
    """Every snapshot of a verified task as its framed bytes, oldest first: from its packs
    (newest pack first in the chain) and its tail."""
    chain = verify_chain(store.objects, store._slots(task), keep_tail=True)
    found: list[bytes] = []
    for ref in reversed(chain.outcomes.pack_refs):
        found += packs.parse(ref.id, store.objects.read(ref.id)).inflate()
    return found + list(chain.tail)


def frame_snapshot(snapshot: Snapshot) -> bytes:
    return codec.frame(
        "snapshot", codec.encode_value(codec.to_builtins(snapshot)), snapshot_version(snapshot)
    )


def rechain(
    store: castore.Store, task: str, low: int, change: Callable[[Snapshot], Snapshot]
) -> None:
    """Forge the tail from `low` to HEAD: each snapshot passed through `change`, then its
    parent set to the forged predecessor (`change` may set the parent of `low` itself), and
    slot and object rewritten. What a hostile writer with file access could do."""
    slots = store._slots(task)
    head = slots.head_seq()
    assert head is not None
    parent: str | None = None
    for seq in range(low, head + 1):
        snapshot = change(decode_snapshot(slots.read(seq)))
        if parent is not None:
            snapshot = attrs.evolve(snapshot, parent=parent)
        data = frame_snapshot(snapshot)
        parent = store.objects.put_framed(data)
        os.unlink(slots.path(seq))
        os.link(store.objects.path(parent), slots.path(seq))
    assert parent == hash_bytes(slots.read(head))
