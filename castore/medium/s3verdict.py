"""What an S3 endpoint was found to honour, and its record in the store (docs/FORMAT.md §19.3,
§19.4): `castore init` and `castore doctor` probe the endpoint and write the verdict to
`castore-medium.json`; `Store.open` refuses a store whose record does not say that a second
exclusive create was refused, and fsck's quarantine removes a damaged key only where the
record says a DELETE with a wrong If-Match ETag was refused."""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Protocol

from castore.errors import UnsafeEndpointError
from castore.format.limits import MAX_OBJECT_SIZE
from castore.medium.base import Entry
from castore.medium.s3client import Client, Exists, Missing


class S3Medium(Protocol):
    """What the S3 medium's helpers (this module, s3aside) use of castore.medium.s3.S3Medium,
    named here so that they need not import it (it imports them)."""

    client: Client
    url: str
    _verdict: dict[str, Any] | None

    @property
    def conditional_delete(self) -> bool: ...
    def where(self, key: str) -> str: ...
    def s3_key(self, key: str) -> str: ...
    def read(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes: ...
    def read_entry(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, Entry]: ...
    def exists(self, key: str) -> bool: ...
    def remove(self, key: str) -> None: ...


VERDICT_KEY = "castore-medium.json"
PROBE_KEY = ".castore-probe"


def probe_exclusive_create(medium: S3Medium) -> bool:
    """One key created twice with If-None-Match: True if the second was refused (412)."""
    key = f"{PROBE_KEY}/{socket.gethostname()}-{time.time_ns()}"
    where = medium.where(key)
    try:
        medium.client.call(where, "put_object", Key=medium.s3_key(key), Body=b"1", IfNoneMatch="*")
        try:
            medium.client.call(
                where, "put_object", Key=medium.s3_key(key), Body=b"2", IfNoneMatch="*"
            )
        except Exists:
            return True
        return False
    finally:
        medium.remove(key)  # this probe's own key: an unanswered DELETE leaves a leftover


def probe_conditional_delete(medium: S3Medium) -> bool:
    """A DELETE with a wrong If-Match ETag: True if it was refused (412) and the key stayed,
    and the same DELETE with the right ETag then removed it (AWS documents both; Ceph RGW
    16.2 deletes on a wrong ETag, the condition ignored)."""
    key = f"{PROBE_KEY}/{socket.gethostname()}-{time.time_ns()}-del"
    where, s3_key = medium.where(key), medium.s3_key(key)
    put = medium.client.call(where, "put_object", Key=s3_key, Body=b"1", IfNoneMatch="*")
    etag = str(put.get("ETag", ""))
    wrong = '"' + "0" * 32 + '"'
    try:
        medium.client.call(where, "delete_object", Key=s3_key, IfMatch=wrong)
    except Exists:
        try:
            medium.client.call(where, "delete_object", Key=s3_key, IfMatch=etag)
        except Exists:
            return False
        return not medium.exists(key)
    except Missing:
        return False
    medium.remove(key)  # the wrong ETag deleted it (if it did not, a leftover of the probe)
    return False


def record_verdict(medium: S3Medium, exclusive: bool, by: str, **facts: Any) -> None:
    """Write what was found of the endpoint into the store (`castore-medium.json`)."""
    verdict = {"exclusive_create": exclusive, "by": by, "time": int(time.time()), **facts}
    body = json.dumps(verdict, sort_keys=True).encode() + b"\n"
    medium.client.call(
        medium.where(VERDICT_KEY), "put_object", Key=medium.s3_key(VERDICT_KEY), Body=body
    )


def require_safe(medium: S3Medium) -> None:
    """UnsafeEndpointError unless the store's record says its endpoint refused a second
    exclusive create (no record: refused too, the doctor makes one)."""
    record = medium.where(VERDICT_KEY)
    try:
        data = medium.read(VERDICT_KEY, limit=4096)
    except FileNotFoundError:
        # Every store init makes records it: one gone was removed. Opening must not write
        # (a reader may hold read-only keys), so the doctor, asked for, makes a new one.
        raise UnsafeEndpointError(medium.url, record, unchecked=True) from None
    try:
        verdict = json.loads(data)
        exclusive = verdict.get("exclusive_create") is True
    except (ValueError, AttributeError):
        verdict, exclusive = {}, False
    if not exclusive:
        raise UnsafeEndpointError(medium.url, record)
    medium._verdict = verdict if isinstance(verdict, dict) else {}
