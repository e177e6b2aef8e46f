"""A deterministic simulated S3 endpoint, under the interleaving scheduler, with a seed.

The real code runs on it (FoundationDB's way): castore's own `Client` (its retry rules) and
`S3Medium` talk to `SimS3`, which stands where boto3's client stands and answers as an S3
endpoint does (conditional PUT, ETags, listing, no rename). Every request an actor makes is a
point of tests/interleave.py's scheduler, as every castore named point is; a seeded random
walk chooses who goes on at each, and the same seed draws each request's fate:

- answered (most), or answered 503 SlowDown without taking effect;
- **lost**: the request takes effect, its answer is lost (a read timeout);
- **refused**: no effect, a connection error;
- **late**: no effect yet, a read timeout now, and the request lands later: at a later request
  of anyone, within a bound of steps, or when its sender's client `settle`s (the client's
  stated bound: castore.medium.s3client.LATE_BOUND_S). A retried request whose first attempt
  is late is a request applied twice.

`Profile` says which conditions the endpoint honours: "aws" honours If-Match on DELETE (and
on PUT), "rgw" ignores it on DELETE and refuses a right one on PUT (Ceph RGW 16.2, measured:
../shared/design/SHAREDFS.md). Run ids and the store clock come from the seed too, so a
seed replays its schedule exactly.
"""

from __future__ import annotations

import bisect
import datetime
import hashlib
import io
import random
import threading
from collections.abc import Callable
from typing import Any

import attrs
import botocore.exceptions

from castore import crashpoints
from castore.format.digest import hash_bytes
from castore.medium.s3 import S3Medium
from castore.medium.s3client import Client

ENDPOINT = "http://sim.invalid"
BUCKET = "sim"
LATE_WITHIN = 40  # a late request lands within this many requests of anyone, at the latest


@attrs.define
class Profile:
    name: str
    delete_if_match: bool
    put_if_match: bool


AWS = Profile("aws", delete_if_match=True, put_if_match=True)
RGW = Profile("rgw", delete_if_match=False, put_if_match=False)


@attrs.define
class Stored:
    data: bytes
    etag: str
    mtime: float


@attrs.define
class Faults:
    """How often each fate is drawn for an actor's request (the rest are answered)."""

    lost: float = 0.06
    refused: float = 0.02
    late: float = 0.05
    slow_down: float = 0.02

    @property
    def any(self) -> float:
        return self.lost + self.refused + self.late + self.slow_down


NO_FAULTS = Faults(0.0, 0.0, 0.0, 0.0)


def _error(status: int, code: str, operation: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )


class Late:
    """A request that has not landed yet: `apply` it at the latest `by` the server's step."""

    def __init__(self, sender: SimS3, apply: Callable[[], object], by: int, what: str) -> None:
        self.sender, self.apply, self.by, self.what = sender, apply, by, what


class Server:
    """The endpoint's state, and the log the checkers read: who wrote what."""

    def __init__(self, profile: Profile, rng: random.Random, faults: Faults) -> None:
        self.profile = profile
        self.rng = rng
        self.faults = faults
        self.objects: dict[str, Stored] = {}
        self.keys: list[str] = []  # sorted, for listings
        self.step = 0
        self.late: list[Late] = []
        self.lock = threading.Lock()  # only the scheduler's one running thread is in here
        self.writes_by: dict[str, int] = {}  # actor name -> write requests that took effect
        self.fates: dict[str, int] = {}
        self.actor_of: Callable[[], str | None] = lambda: None
        self.landing_for: str | None = None  # whose late request is landing now
        self.intact_removed: list[tuple[str, str]] = []  # (actor, key): an object's own bytes

    # -- state -------------------------------------------------------------------------------
    def now(self) -> datetime.datetime:
        # One virtual second a request, from 1 January 2000: gc and the store's clock run on it.
        return datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
            seconds=self.step
        )

    def put(self, key: str, data: bytes) -> str:
        etag = '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'
        if key not in self.objects:
            bisect.insort(self.keys, key)
        self.objects[key] = Stored(data, etag, self.now().timestamp())
        return etag

    def delete(self, key: str) -> None:
        found = self.objects.pop(key, None)
        if found is not None:
            self.keys.pop(bisect.bisect_left(self.keys, key))
            name = key.rsplit("/", 1)[-1]
            stored = key.split("/", 1)[-1].startswith("objects/")  # not a quarantine copy
            if stored and hash_bytes(found.data) == name:
                actor = self.landing_for or self.actor_of() or "(setup)"
                self.intact_removed.append((actor, key))

    def land_due(self) -> None:
        """Land each late request whose bound has come, and now and then one before it."""
        for late in list(self.late):
            if late.by <= self.step or self.rng.random() < 0.05:
                self.late.remove(late)
                late.apply()

    def land_all(self, sender: SimS3 | None = None) -> None:
        for late in [x for x in self.late if sender is None or x.sender is sender]:
            self.late.remove(late)
            late.apply()

    def wrote(self) -> None:
        actor = self.landing_for or self.actor_of() or "(setup)"
        self.writes_by[actor] = self.writes_by.get(actor, 0) + 1


class _Meta:
    endpoint_url = ENDPOINT


class SimS3:
    """What castore's Client calls of boto3's S3 client, answered by `server`."""

    meta = _Meta()

    def __init__(self, server: Server) -> None:
        self.server = server

    def _request(self, operation: str, apply: Callable[[], Any], *, writes: bool) -> Any:
        server = self.server
        actor = server.actor_of()
        if actor is not None:
            crashpoints.reach(f"s3.{operation}")  # a point of the scheduler, as castore's are
        with server.lock:
            server.step += 1
            server.land_due()
            fate = "answered"
            if actor is not None:
                draw, f = server.rng.random(), server.faults
                for name, p in (
                    ("lost", f.lost),
                    ("refused", f.refused),
                    ("late", f.late if writes else 0.0),
                    ("slow_down", f.slow_down),
                ):
                    if draw < p:
                        fate = name
                        break
                    draw -= p
            server.fates[fate] = server.fates.get(fate, 0) + 1
            if fate == "refused":
                raise botocore.exceptions.EndpointConnectionError(endpoint_url=ENDPOINT)
            if fate == "slow_down":
                raise _error(503, "SlowDown", operation)
            if fate == "late":
                by = server.step + server.rng.randint(1, LATE_WITHIN)

                def landing() -> None:
                    server.landing_for = actor
                    try:
                        apply()
                    except botocore.exceptions.ClientError:
                        pass  # its answer (a 412, a 404) goes to nobody: the sender gave up
                    finally:
                        server.landing_for = None

                server.late.append(Late(self, landing, by, operation))
                raise botocore.exceptions.ReadTimeoutError(endpoint_url=ENDPOINT)
            answer = apply()
            if fate == "lost":
                raise botocore.exceptions.ReadTimeoutError(endpoint_url=ENDPOINT)
            return answer

    # -- the S3 API ------------------------------------------------------------------------
    def get_object(self, *, Bucket: str, Key: str, Range: str | None = None) -> Any:
        def apply() -> Any:
            found = self.server.objects.get(Key)
            if found is None:
                raise _error(404, "NoSuchKey", "GetObject")
            data = found.data
            if Range is not None:
                start, end = Range.removeprefix("bytes=").split("-")
                data = data[int(start) : int(end) + 1]
            return {
                "Body": io.BytesIO(data),
                "ContentLength": len(data),
                "LastModified": datetime.datetime.fromtimestamp(found.mtime, datetime.UTC),
                "ETag": found.etag,
            }

        return self._request("get_object", apply, writes=False)

    def head_object(self, *, Bucket: str, Key: str) -> Any:
        def apply() -> Any:
            found = self.server.objects.get(Key)
            if found is None:
                raise _error(404, "404", "HeadObject")
            return {
                "ContentLength": len(found.data),
                "LastModified": datetime.datetime.fromtimestamp(found.mtime, datetime.UTC),
                "ETag": found.etag,
            }

        return self._request("head_object", apply, writes=False)

    def put_object(
        self,
        *,
        Bucket: str,
        Key: str,
        Body: bytes,
        IfNoneMatch: str | None = None,
        IfMatch: str | None = None,
    ) -> Any:
        def apply() -> Any:
            server = self.server
            found = server.objects.get(Key)
            if IfNoneMatch == "*" and found is not None:
                raise _error(412, "PreconditionFailed", "PutObject")
            if IfMatch is not None:
                if not server.profile.put_if_match:
                    raise _error(412, "PreconditionFailed", "PutObject")  # RGW 16.2, measured
                if found is None:
                    raise _error(404, "NoSuchKey", "PutObject")
                if found.etag != IfMatch:
                    raise _error(412, "PreconditionFailed", "PutObject")
            server.wrote()
            return {"ETag": server.put(Key, bytes(Body))}

        return self._request("put_object", apply, writes=True)

    def delete_object(self, *, Bucket: str, Key: str, IfMatch: str | None = None) -> Any:
        def apply() -> Any:
            server = self.server
            found = server.objects.get(Key)
            if IfMatch is not None and server.profile.delete_if_match:
                if found is None:
                    raise _error(404, "NoSuchKey", "DeleteObject")
                if found.etag != IfMatch:
                    raise _error(412, "PreconditionFailed", "DeleteObject")
            server.wrote()
            server.delete(Key)
            return {}

        return self._request("delete_object", apply, writes=True)

    def copy_object(
        self,
        *,
        Bucket: str,
        Key: str,
        CopySource: dict[str, str],
        CopySourceIfMatch: str | None = None,
        MetadataDirective: str | None = None,
        Metadata: dict[str, str] | None = None,
    ) -> Any:
        def apply() -> Any:
            server = self.server
            found = server.objects.get(CopySource["Key"])
            if found is None:
                raise _error(404, "NoSuchKey", "CopyObject")
            if CopySourceIfMatch is not None and found.etag != CopySourceIfMatch:
                raise _error(412, "PreconditionFailed", "CopyObject")
            server.wrote()
            server.put(Key, found.data)
            return {}

        return self._request("copy_object", apply, writes=True)

    def list_objects_v2(
        self,
        *,
        Bucket: str,
        Prefix: str = "",
        Delimiter: str | None = None,
        MaxKeys: int = 1000,
        ContinuationToken: str | None = None,
        StartAfter: str = "",
    ) -> Any:
        def apply() -> Any:
            server = self.server
            start = bisect.bisect_left(server.keys, ContinuationToken or Prefix)
            if ContinuationToken is not None:
                start = bisect.bisect_right(server.keys, ContinuationToken)
            elif StartAfter > Prefix:
                start = bisect.bisect_right(server.keys, StartAfter)
            contents: list[dict[str, Any]] = []
            prefixes: list[str] = []
            last = None
            truncated = False
            for key in server.keys[start:]:
                if not key.startswith(Prefix):
                    break
                if len(contents) + len(prefixes) >= MaxKeys:
                    truncated = True
                    break
                last = key
                rest = key[len(Prefix) :]
                if Delimiter and Delimiter in rest:
                    common = Prefix + rest.split(Delimiter, 1)[0] + Delimiter
                    if not prefixes or prefixes[-1] != common:
                        prefixes.append(common)
                    continue
                found = server.objects[key]
                contents.append(
                    {
                        "Key": key,
                        "Size": len(found.data),
                        "LastModified": datetime.datetime.fromtimestamp(found.mtime, datetime.UTC),
                    }
                )
            page: dict[str, Any] = {
                "Contents": contents,
                "CommonPrefixes": [{"Prefix": p} for p in prefixes],
                "KeyCount": len(contents) + len(prefixes),
                "IsTruncated": truncated,
            }
            if truncated:
                page["NextContinuationToken"] = last
            return page

        return self._request("list_objects_v2", apply, writes=False)


class SimClient(Client):
    """castore's Client, unchanged, on a SimS3; `settle` waits as the real one does, which in
    the simulation means: every late request of this client that the bound covers lands."""

    def __init__(self, server: Server) -> None:  # no boto3 client is built
        self.bucket = BUCKET
        self._s3 = SimS3(server)
        self.endpoint_source = "the simulation"
        self.requests = 0
        self.unanswered = None

    def settle(self) -> None:
        if self.unanswered is not None:
            self._s3.server.land_all(self._s3)
        super().settle()


def medium(server: Server, prefix: str = "store", *, seal_every: int = 4) -> S3Medium:
    """A fresh S3 medium (its own client) on `server`, sealing every `seal_every` commits."""
    found = S3Medium(SimClient(server), prefix)
    found.seal_every = seal_every
    return found
