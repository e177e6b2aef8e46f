"""Reads a chain walk will make, sent at once where each read is a round trip (S3).

A resume knows, once it has read HEAD, every key it is about to read: the tail's slots (one per
sequence number above the anchor), the anchor's pack and HEAD's plan. One after another they
cost a round trip each; here they go out together on the medium's client pool, and the walk
then takes each from what came back. Nothing here is trusted: the walk hashes every byte it
takes, exactly as it hashes a read of its own, and reads again itself whatever is missing,
failed or other than it expects, so a failure is reported by the walk, in its words.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
from collections.abc import Callable, Iterable

from castore.chain.objects import ObjectStore
from castore.chain.planread import check_plan_bytes
from castore.chain.refs import TaskSlots
from castore.errors import CastoreError
from castore.format.digest import hash_bytes
from castore.format.layout import object_key
from castore.format.model import attrs

# At most this many reads in flight (the S3 client keeps 64 connections).
WORKERS = 32


@attrs.define
class Fetched:
    """What came back: slot bytes by seq, object bytes by id, and whether the plan's bytes
    were found to hash to its id (the walk checks it again itself when not)."""

    slots: dict[int, bytes] = attrs.field(factory=dict)
    objects: dict[str, bytes] = attrs.field(factory=dict)
    plan_checked: str | None = None

    def slot(self, seq: int, object_id: str) -> bytes | None:
        """Slot `seq`'s bytes if they hash to `object_id`, else None (read them yourself)."""
        data = self.slots.pop(seq, None)
        return data if data is not None and hash_bytes(data) == object_id else None

    def object(self, object_id: str) -> bytes | None:
        """Object `object_id`'s bytes if they hash to it, else None."""
        data = self.objects.pop(object_id, None)
        return data if data is not None and hash_bytes(data) == object_id else None


def worth_it(slots: TaskSlots) -> bool:
    """True where a slot is its snapshot's only copy (S3): every read is a request to a
    server, and many at once cost about one."""
    return not slots.medium.aliases


def fetch(
    objects: ObjectStore,
    slots: TaskSlots,
    seqs: range,
    packs: Iterable[str] = (),
    plan: str | None = None,
) -> Fetched:
    """Slots `seqs`, objects `packs` and the hash check of plan `plan`, all at once."""
    jobs: list[tuple[object, Callable[[], object]]] = [
        (seq, functools.partial(slots.read, seq)) for seq in seqs
    ]
    read = objects.medium.read
    jobs += [(pack, functools.partial(read, object_key(pack))) for pack in packs]
    if plan is not None:
        jobs.append((("plan", plan), lambda: check_plan_bytes(objects, slots.task_id, plan)))
    fetched = Fetched()
    for key, value in run_all(jobs).items():
        if isinstance(key, int) and isinstance(value, bytes):
            fetched.slots[key] = value
        elif isinstance(key, str) and isinstance(value, bytes):
            fetched.objects[key] = value
        elif isinstance(key, tuple):
            fetched.plan_checked = plan
    return fetched


def run_all(jobs: list[tuple[object, Callable[[], object]]]) -> dict[object, object]:
    """key -> result, for each (key, job) that succeeded; `WORKERS` at a time."""
    if not jobs:
        return {}
    found: dict[object, object] = {}
    with concurrent.futures.ThreadPoolExecutor(min(WORKERS, len(jobs))) as pool:
        futures = {pool.submit(job): key for key, job in jobs}
        for future in concurrent.futures.as_completed(futures):
            # A failed read is read again by the walk itself, which says what is wrong.
            with contextlib.suppress(CastoreError, OSError):
                found[futures[future]] = future.result()
    return found
