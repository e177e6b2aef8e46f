"""A verified resume on S3 costs a few requests, whatever the length of the sealed history
(format 3: the anchor's pack lists the packs below it; the tail, the pack and the plan are
read at once), and still refuses a damaged pack (issue 40, item 1)."""

from __future__ import annotations

import boto3
import pytest
from s3servers import S3Endpoint

import castore
from castore.medium.s3 import S3Medium

TASK = "long"
# Store.open (the marker, the endpoint's record), the mark (listing, generation, legacy file),
# HEAD (a listing after the mark's slot, its GET), then the anchor's pack, the plan and the
# oldest pack (its first snapshot's fork) and the run's look for a newer mark.
MOST_REQUESTS = 12


def _plan(steps: int) -> castore.Plan:
    return castore.Plan.build(TASK, *(f"s{i}" for i in range(steps)))


def _built(s3: S3Endpoint, steps: int, finish: bool) -> tuple[str, castore.Plan]:
    url = s3.new_bucket()
    store = castore.Store.init(url)
    plan = _plan(steps + (0 if finish else 5))
    with store.start(TASK, plan, lock_timeout=None) as run:
        for index in range(steps):
            run.commit_step(f"s{index}", index)
    return url, plan


def _resume_requests(url: str, plan: castore.Plan) -> int:
    store = castore.Store.open(url)
    assert isinstance(store.medium, S3Medium)
    with store.resume(TASK, plan, lock_timeout=None) as run:
        sent = store.medium.client.requests
        assert 3 == run.result("s3")  # a sealed step, read from its pack
    return sent


@pytest.mark.parametrize("finish", [True, False], ids=["finished", "mid-run"])
def test_a_resume_costs_a_few_requests_however_long_the_history(
    s3: S3Endpoint, finish: bool
) -> None:
    """A task of 700 steps (11 packs of 64 and more) and one of 140 resume in the same few
    requests, finished (tail: HEAD) or mid-run (a tail of up to 64 slots, read at once)."""
    counts = []
    for steps in (140, 700):
        url, plan = _built(s3, steps, finish)
        sent = _resume_requests(url, plan)
        head = castore.Store.open(url).verify(TASK).head
        tail = head.seq - (head.sealed.through if head.sealed is not None else -1)
        counts.append(sent - (tail - 1))  # each tail slot beyond HEAD is one GET
    assert counts[0] == counts[1]
    assert counts[1] <= MOST_REQUESTS


def test_a_damaged_anchor_pack_on_s3_is_refused(s3: S3Endpoint) -> None:
    """The anchor's pack with one byte changed at its key: the resume refuses the chain."""
    url, plan = _built(s3, 200, True)
    store = castore.Store.open(url)
    assert isinstance(store.medium, S3Medium)
    anchor = store.verify(TASK).head.sealed
    assert anchor is not None
    key = store.medium.s3_key(f"objects/{anchor.pack[:2]}/{anchor.pack}")
    client = boto3.client("s3", **s3.options())
    bucket = store.medium.client.bucket
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 1
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    with pytest.raises(castore.ChainError, match=anchor.pack):
        castore.Store.open(url).resume(TASK, plan, lock_timeout=None)
