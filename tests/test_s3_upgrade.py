"""`castore upgrade` of a store on S3 (issue 40, item 4), on each engine: the golden v1 store,
copied key for key to a bucket prefix (FORMAT.md §19.3: the same bytes), is checked as fsck
checks it, gets the current marker (the one write that changes the format), and every task
resumes where it stood; a re-run writes nothing more; a damaged one is refused untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from helpers import cli
from s3servers import S3Endpoint
from test_golden import V1, materialize
from test_upgrade import V1_MARKER, _plans, _recorded

import castore
from castore.format.layout import MARKER_KEY
from castore.format.marker import marker_bytes
from castore.maintenance.upgrade import TARGET_VERSION


def v1_on_s3(s3: S3Endpoint, golden: Path, tmp_path: Path) -> tuple[str, Any]:
    """The golden store `golden`, key for key under a new prefix (its endpoint record made
    by init, as every S3 store has one); the URL and a boto3 client of the bucket."""
    root = materialize(golden, tmp_path)
    url = s3.new_bucket()
    castore.Store.init(url)
    bucket, prefix = url[len("s3://") :].split("/", 1)
    client = boto3.client("s3", **s3.options())
    for path in sorted(root.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(root)}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return url, (client, bucket, prefix)


def keys_of(place: Any) -> dict[str, bytes]:
    client, bucket, prefix = place
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            found[item["Key"][len(prefix) + 1 :]] = body
    return found


def resumed(url: str) -> dict[str, dict[str, Any]]:
    store = castore.Store.open(url)
    found = {}
    for task, plan in _plans().items():
        with store.resume(task, plan, lock_timeout=None) as run:
            effects = {r.step: r.state.value for r in run.head.effects}
            found[task] = {"next_step": run.next_step, "finished": run.finished, **effects}
    return found


def test_upgrade_on_s3_makes_the_v1_store_current_and_it_resumes_as_before(
    s3: S3Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, place = v1_on_s3(s3, V1 / "clean", tmp_path)
    assert V1_MARKER == keys_of(place)[MARKER_KEY]
    before = keys_of(place)
    code, out, _ = cli(capsys, "upgrade", url)
    assert 0 == code, out
    assert f"upgraded {url} from format 1 to format {TARGET_VERSION}" in out
    after = keys_of(place)
    assert marker_bytes(TARGET_VERSION) == after[MARKER_KEY]
    # Nothing is rewritten (S3 keeps pruned slots: every key but the marker is as it was);
    # sealing adds packs, marks and SEAL slots.
    assert {k: v for k, v in before.items() if k != MARKER_KEY} == {
        k: after[k] for k in before if k != MARKER_KEY
    }
    assert TARGET_VERSION == castore.Store.open(url).format_version
    assert _recorded() == resumed(url)
    # A re-run finds the current format: no marker written, nothing sealed again.
    again = keys_of(place)
    code, out, _ = cli(capsys, "upgrade", url)
    assert 0 == code, out
    assert "upgraded" not in out
    assert again.keys() <= keys_of(place).keys()
    assert again[MARKER_KEY] == keys_of(place)[MARKER_KEY]


def test_upgrade_on_s3_refuses_a_damaged_store_and_writes_nothing(
    s3: S3Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, place = v1_on_s3(s3, V1 / "damaged-corrupt-object", tmp_path)
    before = keys_of(place)
    code, out, _ = cli(capsys, "upgrade", url)
    assert 1 == code, out
    assert before == keys_of(place)
