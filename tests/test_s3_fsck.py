"""`castore fsck` on an S3 store (issues 24 and 25), on each engine in turn (conftest's `s3`):
it reads every key through the S3 medium, writes nothing, finds a damaged or a missing
object, and exits as on POSIX (docs/reference/cli.md: 0 clean, 1 errors found, 2 no store).
A slot is its snapshot's only copy on S3 (no hard links): no finding asks for an object name.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import cli
from s3servers import S3Endpoint

import castore
from castore.format.layout import object_relpath, slot_name
from castore.maintenance.fsck import Finding, Summary, check_store
from castore.maintenance.fsck.quarantine import quarantine
from castore.medium.s3 import S3Medium

TASK = "job"
PLAN = castore.Plan.build("s3fsck", "a", "b", "c")


def filled(s3: S3Endpoint) -> tuple[castore.Store, str]:
    """A v2 store on S3 with one task of three steps (a blob result, inline results), and the
    id of the blob."""
    store = castore.Store.init(s3.new_bucket())
    blob = store.put_blob({"big": list(range(50))})
    with store.start(TASK, PLAN, lock_timeout=None) as run:
        run.commit_step("a", blob)
        run.commit_step("b", {"x": 1})
    return store, blob.blob


def client(s3: S3Endpoint) -> Any:
    import boto3  # noqa: PLC0415 - the s3 extra

    return boto3.client("s3", **s3.options())


def bucket_and_key(store: castore.Store, key: str) -> tuple[str, str]:
    assert isinstance(store.medium, S3Medium)
    return store.medium.client.bucket, store.medium.s3_key(key)


def listing(s3: S3Endpoint, store: castore.Store) -> dict[str, str]:
    """Every key of the store's bucket, with its ETag: what fsck must leave as it is."""
    bucket = bucket_and_key(store, "")[0]
    pages = client(s3).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {item["Key"]: item["ETag"] for page in pages for item in page.get("Contents", ())}


def rows(findings: list[Finding]) -> list[tuple[str, str, str]]:
    return [(f.code, f.severity.value, f.path) for f in findings]


def test_a_clean_store_passes_and_fsck_writes_nothing(s3: S3Endpoint) -> None:
    store, blob = filled(s3)
    before = listing(s3, store)
    summary = Summary()
    findings = list(check_store(store.root, summary=summary))
    assert ([], 0) == (rows(findings), summary.exit_status)
    # Every slot's snapshot checked through its slot, the plan and the blob directly.
    assert (1, 2 + 3) == (summary.tasks, summary.objects)
    assert bucket_and_key(store, object_relpath(blob))[1] in before
    assert before == listing(s3, store)


def test_a_corrupted_object_is_a_hash_mismatch(s3: S3Endpoint) -> None:
    """The blob's key overwritten in place (the endpoint's own rot, or a hand's): reported
    where it lives, and the slot naming it says so too."""
    store, blob = filled(s3)
    bucket, key = bucket_and_key(store, object_relpath(blob))
    data = client(s3).get_object(Bucket=bucket, Key=key)["Body"].read()
    client(s3).put_object(Bucket=bucket, Key=key, Body=data[:-4] + b"48]}")
    findings = list(check_store(store.root))
    assert ("hash-mismatch", "error", object_relpath(blob)) in rows(findings)
    [named] = [f for f in findings if f.code == "missing-object"]
    assert (named.task, named.path) == (TASK, f"tasks/{TASK}/chain/{slot_name(1)}")


def test_a_missing_object_a_chain_names_is_reported(s3: S3Endpoint) -> None:
    store, blob = filled(s3)
    bucket, key = bucket_and_key(store, object_relpath(blob))
    client(s3).delete_object(Bucket=bucket, Key=key)
    findings = list(check_store(store.root))
    assert [("missing-object", "error", f"tasks/{TASK}/chain/{slot_name(1)}")] == rows(findings)
    assert blob in findings[0].message


def test_a_corrupted_slot_is_reported_at_the_slot(s3: S3Endpoint) -> None:
    """A slot is its snapshot's only copy: its damage is the slot's, and no object name is
    asked for (slot-not-published is a POSIX finding)."""
    store, _ = filled(s3)
    bucket, key = bucket_and_key(store, f"tasks/{TASK}/chain/{slot_name(2)}")
    client(s3).put_object(Bucket=bucket, Key=key, Body=b"castore 2 snapshot 3\n{}")
    codes = {f.code for f in check_store(store.root)}
    assert "slot-corrupt" in codes
    assert not codes & {"slot-not-published", "snapshot-name-lost", "missing-directory"}


def test_the_cli_exits_as_on_posix(s3: S3Endpoint, capsys: pytest.CaptureFixture[str]) -> None:
    """0 for a clean store (also for one task), 1 with errors (and --json says the same), 2
    for no such task or no store."""
    store, blob = filled(s3)
    code, out, _ = cli(capsys, "fsck", store.root)
    assert (0, "checked 5 objects and 1 task") == (code, out.splitlines()[-1].split(" in ")[0])
    code, out, _ = cli(capsys, "fsck", store.root, "--task", TASK)
    assert (0, "checked 5 objects and 1 task") == (code, out.splitlines()[-1].split(" in ")[0])
    assert 2 == cli(capsys, "fsck", store.root, "--task", "no-such-task")[0]
    bucket, key = bucket_and_key(store, object_relpath(blob))
    client(s3).put_object(Bucket=bucket, Key=key, Body=b"not an object")
    code, out, _ = cli(capsys, "fsck", store.root, "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert (1, 1) == (code, lines[-1]["summary"]["exit_status"])
    assert "hash-mismatch" in {line["code"] for line in lines if line["type"] == "finding"}
    code, _, err = cli(capsys, "fsck", s3.new_bucket())
    assert 2 == code, err


def test_quarantine_moves_a_damaged_object_aside_on_s3(
    s3: S3Endpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    """--quarantine: a copy under quarantine/<run>/, then the original deleted by a DELETE
    carrying its ETag where the endpoint honours If-Match (moto), else left in place (RGW
    16.2 ignores it), with the manifest; the intact keys stay."""
    store, blob = filled(s3)
    bucket, key = bucket_and_key(store, object_relpath(blob))
    client(s3).put_object(Bucket=bucket, Key=key, Body=b"not an object")
    where, moved, copied = quarantine(store.medium, list(check_store(store.root)))
    removes = store.medium.conditional_delete
    assert [blob] == [f.object_id for f in (moved if removes else copied)]
    keys = listing(s3, store)
    assert (key not in keys) == removes
    assert bucket_and_key(store, f"{where}/{object_relpath(blob)}")[1] in keys
    manifest = json.loads(store.medium.read(f"{where}/manifest.json"))
    place = "moved_to" if removes else "copied_to"
    assert [f"{where}/{object_relpath(blob)}"] == [entry[place] for entry in manifest]
    if not removes:
        return  # the damaged key stays: fsck still finds it damaged
    code, out, _ = cli(capsys, "fsck", store.root)
    assert 1 == code  # the chain still names the blob: now missing
    assert "missing-object" in out
