"""An S3 bucket prefix as castore's medium (castore[s3]; docs/FORMAT.md §19.3).

Keys are S3 keys under the prefix. The commit point is `PUT If-None-Match: *` of the chain
slot's key, holding the snapshot's bytes: of any number of writers one gets 200 and the
others 412. There are no hard links (`aliases` False): a snapshot has no object key, only its
slot, which every reader falls back to. A pruned slot keeps its key and its bytes (`retire`
does nothing, `frees_names` False): no name is ever freed, so no stale writer can create a
pruned slot again and a commit needs no read of the sealed mark after its claim; nobody
reads below the mark. There are no directories (a "directory" is a key prefix), no locks, no
temp files (a PUT is whole or absent), no modes, inodes or link counts.

An endpoint that ignores `If-None-Match` would let two writers both commit: a store records
that its endpoint refused a second exclusive create (`castore-medium.json`, written by init
or `castore doctor`), and `Store.open` refuses one whose record is missing or says otherwise.
The record also says whether a `DELETE` with a wrong `If-Match` ETag was refused: only then
does fsck's quarantine remove a damaged key (with the ETag it judged); else it copies the key
aside and leaves it (docs/FORMAT.md §19.4).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from castore import crashpoints
from castore.errors import (
    CommitUncertainError,
    DurabilityError,
    OversizedFileError,
    StoreIOError,
    StoreNotFoundError,
    UnsafeEndpointError,
    UsageError,
)
from castore.format.digest import Hasher
from castore.format.layout import MARKER_KEY, OBJECTS_DIR, TASKS_DIR
from castore.format.limits import MAX_OBJECT_SIZE
from castore.medium import s3aside
from castore.medium.base import Entry, Judge, Medium, SetAside
from castore.medium.s3client import Client, Exists, Missing, Unanswered
from castore.medium.s3lease import Lease
from castore.medium.s3verdict import (
    PROBE_KEY,
    VERDICT_KEY,
    probe_conditional_delete,
    probe_exclusive_create,
    record_verdict,
    require_safe,
)
from castore.medium.tasklock import HeldLock

__all__ = ["VERDICT_KEY", "S3Medium"]

_CHUNK = 1 << 20
# The keys that name "directories" of the format (a key prefix on S3): everything else is a
# file's key, looked up with one HEAD.
_DIRECTORY = re.compile(r"(objects|tasks)(/[0-9a-f]{2})?|tasks/[^/]+(/(chain|marks|lease))?|")


class S3Medium(Medium):
    """A store at s3://bucket/prefix."""

    kind = "s3"
    frees_names = False
    aliases = False
    keeps_retired = True
    directories = False
    file_events = False
    private_names = frozenset({VERDICT_KEY, PROBE_KEY})
    seal_every = 64  # a resume GETs each slot above the mark: at most 64 round trips

    def __init__(self, client: Client, prefix: str, *, lease_s: float | None = None) -> None:
        if lease_s is not None and not lease_s > 0:
            raise UsageError(f"lease_s must be a positive number of seconds, not {lease_s!r}")
        self.client = client
        self.lease_s = lease_s  # a task's lease term; None: no lease (s3lease.py)
        self.prefix = prefix.strip("/")
        self.url = f"s3://{client.bucket}/{self.prefix}" if self.prefix else f"s3://{client.bucket}"
        self._head = f"{self.prefix}/" if self.prefix else ""
        self._verdict: dict[str, Any] | None = None  # the endpoint's record, once read

    @property
    def identity(self) -> str:
        """The endpoint, bucket and prefix as the client resolved them: never the URL string
        alone (one bucket name on two endpoints is two stores)."""
        return f"s3:{self.client.identity}/{self.prefix}"

    @property
    def conditional_delete(self) -> bool:
        """True if the endpoint was seen to refuse a DELETE whose If-Match ETag is wrong."""
        return self.verdict().get("delete_if_match") is True

    def verdict(self) -> dict[str, Any]:
        """The endpoint's record (`castore-medium.json`), read once; {} if there is none."""
        if self._verdict is None:
            try:
                found = json.loads(self.read(VERDICT_KEY, limit=4096))
            except (FileNotFoundError, ValueError):
                found = {}
            self._verdict = found if isinstance(found, dict) else {}
        return self._verdict

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Medium:
        """The store at `url` (s3://bucket[/prefix]); `options` are the client's (endpoint_url,
        region_name, profile_name, aws_access_key_id, ...; unset: the environment and the
        AWS config files, the boto3 way); `lease_s`: lease each task a worker runs, with that
        term (castore.medium.s3lease; docs/howto/object-storage.md)."""
        lease_s = options.pop("lease_s", None)
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise StoreNotFoundError(
                url, "not an s3://bucket/prefix URL", "give s3://BUCKET/PREFIX"
            )
        return cls(Client(parsed.netloc, **options), parsed.path, lease_s=lease_s)

    def s3_key(self, key: str) -> str:
        return self._head + key

    def where(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    # -- reading ---------------------------------------------------------------------------
    def read(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes:
        where = self.where(key)
        try:
            response = self.client.call(where, "get_object", Key=self.s3_key(key))
            return self.client.body(response, where, limit)
        except Missing:
            raise FileNotFoundError(2, "no such key", where) from None
        except OverflowError as exc:
            raise OversizedFileError(where, int(str(exc)), limit) from None

    def read_entry(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, Entry]:
        """One GET: the bytes and the key's size and age, as that response gives them."""
        where = self.where(key)
        try:
            response = self.client.call(where, "get_object", Key=self.s3_key(key))
            data = self.client.body(response, where, limit)
        except Missing:
            raise FileNotFoundError(2, "no such key", where) from None
        except OverflowError as exc:
            raise OversizedFileError(where, int(str(exc)), limit) from None
        modified = response.get("LastModified")
        return data, Entry(
            key.rsplit("/", 1)[-1], "regular file", len(data), s3aside.seconds(modified)
        )

    def read_fresh(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> bytes:
        return self.read(key, limit=limit)  # S3 reads are strongly consistent: no cache

    def read_head(self, key: str, size: int) -> bytes:
        where = self.where(key)
        try:
            response = self.client.call(
                where, "get_object", Key=self.s3_key(key), Range=f"bytes=0-{max(size, 1) - 1}"
            )
            return self.client.body(response, where, size)
        except Missing:
            raise FileNotFoundError(2, "no such key", where) from None

    def hash(self, key: str, *, limit: int = MAX_OBJECT_SIZE) -> str:
        where = self.where(key)
        try:
            response = self.client.call(where, "get_object", Key=self.s3_key(key))
        except Missing:
            raise FileNotFoundError(2, "no such key", where) from None
        if int(response.get("ContentLength", 0)) > limit:
            raise OversizedFileError(where, int(response["ContentLength"]), limit)
        hasher = Hasher()
        for chunk in self.client.chunks(response, _CHUNK):
            hasher.update(chunk)
        return hasher.hexdigest()

    def exists(self, key: str) -> bool:
        if _DIRECTORY.fullmatch(key):
            return self._has_children(key)
        try:
            self.client.call(self.where(key), "head_object", Key=self.s3_key(key))
        except Missing:
            return False
        return True

    def still_named(self, key: str) -> bool:
        return self.exists(key)  # S3 lookups are strongly consistent

    def _has_children(self, key: str) -> bool:
        prefix = self.s3_key(key) + "/" if key else self._head
        page = self.client.call(self.where(key), "list_objects_v2", Prefix=prefix, MaxKeys=1)
        return int(page.get("KeyCount", 0)) > 0

    def names(self, key: str) -> list[str]:
        return [entry.name for entry in self.scan(key)]

    def names_after(self, key: str, after: str) -> list[str]:
        """The names under `key` after `after`, listed from there (StartAfter): a task's slots
        above its sealed mark cost a page per 1,000 of them, not per 1,000 ever committed."""
        prefix = self.s3_key(key) + "/"
        found = []
        for page in self.client.pages(
            self.where(key), Prefix=prefix, Delimiter="/", StartAfter=prefix + after
        ):
            found += [item["Key"][len(prefix) :] for item in page.get("Contents", ())]
            found += [
                p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", ())
            ]
        return found

    def names_if_small(self, key: str) -> list[str] | None:
        """One ListObjectsV2 page (up to 1,000 names) where it holds every name under `key`."""
        prefix = self.s3_key(key) + "/"
        page = self.client.call(
            self.where(key), "list_objects_v2", Prefix=prefix, Delimiter="/", MaxKeys=1000
        )
        if page.get("IsTruncated"):
            return None
        return [item["Key"][len(prefix) :] for item in page.get("Contents", ())]

    def scan(self, key: str) -> list[Entry]:
        prefix = self.s3_key(key) + "/" if key else self._head
        found = []
        for page in self.client.pages(self.where(key), Prefix=prefix, Delimiter="/"):
            for item in page.get("Contents", ()):
                found.append(
                    Entry(
                        name=item["Key"][len(prefix) :],
                        kind="regular file",
                        size=int(item["Size"]),
                        mtime=item["LastModified"].timestamp(),
                    )
                )
            for common in page.get("CommonPrefixes", ()):
                name = common["Prefix"][len(prefix) :].rstrip("/")
                found.append(Entry(name=name, kind="directory", size=0, mtime=0.0))
        return found

    def walk(self, key: str) -> Iterator[tuple[str, list[str]]]:
        """Every key below `key` in one flat listing, grouped by its "directory" (the part
        before its last slash), parents before children: there are no symlinks to avoid."""
        prefix = self.s3_key(key) + "/" if key else self._head
        below: dict[str, list[str]] = {}
        for page in self.client.pages(self.where(key), Prefix=prefix):
            for item in page.get("Contents", ()):
                parent, _, name = item["Key"][len(prefix) :].rpartition("/")
                below.setdefault(parent, []).append(name)
                while parent:  # each "directory" between, even one holding only directories
                    parent = parent.rpartition("/")[0]
                    below.setdefault(parent, [])
        for relative in sorted(
            below, key=lambda name: (name.count("/"), name) if name else (-1, "")
        ):
            yield (f"{key}/{relative}" if key and relative else key or relative), below[relative]

    def flush_file(self, key: str) -> None:
        del key  # a PUT is durable when it is answered

    def stat(self, key: str) -> Entry:
        name = key.rsplit("/", 1)[-1]
        if _DIRECTORY.fullmatch(key):
            if key == "" or self._has_children(key):
                return Entry(name=name, kind="directory", size=0, mtime=0.0)
            raise FileNotFoundError(2, "no such key", self.where(key))
        try:
            head = self.client.call(self.where(key), "head_object", Key=self.s3_key(key))
        except Missing:
            raise FileNotFoundError(2, "no such key", self.where(key)) from None
        return Entry(
            name=name,
            kind="regular file",
            size=int(head["ContentLength"]),
            mtime=head["LastModified"].timestamp(),
        )

    # -- writing ---------------------------------------------------------------------------
    def create(self, key: str, data: bytes, *, sync_name: bool = True, mode: int = 0o444) -> bool:
        del sync_name, mode  # a PUT is durable when answered; S3 keys have no modes
        return self._create(key, data)

    def _create(self, key: str, data: bytes) -> bool:
        """PUT If-None-Match: *; True if this call made the key. A 412 after an attempt whose
        answer was lost (the retry's own success) is told apart by reading the key back: its
        own bytes mean this call made it."""
        where = self.where(key)
        try:
            self.client.call(where, "put_object", Key=self.s3_key(key), Body=data, IfNoneMatch="*")
        except Exists as exists:
            # Only a retry can meet its own earlier success: then the key holds these bytes.
            return exists.after_retry and self._holds(key, data)
        except StoreIOError as exc:
            return self._after_failure(key, data, exc)
        return True

    def _after_failure(self, key: str, data: bytes, failure: StoreIOError) -> bool:
        """Every attempt of an exclusive create failed without a clear answer: whether one of
        them committed is read back. Its own bytes: it did. Absent: it did not (a request
        still in flight can at most commit these same bytes later, which a writer treats as
        a commit it lost: it rebuilt its snapshot, with other bytes). Unreadable: unknown."""
        where = self.where(key)
        try:
            if self._holds(key, data):
                return True
            present = self.exists(key)
        except StoreIOError as exc:
            raise CommitUncertainError(where, exc, known_written=False) from exc
        if present:
            return False  # another writer's bytes: the caller sees it lost
        raise DurabilityError(where, "creating (S3 PUT If-None-Match)", failure) from failure

    def _holds(self, key: str, data: bytes) -> bool:
        try:
            return self.read(key, limit=len(data) + 1) == data
        except (FileNotFoundError, OversizedFileError):
            return False

    def claim(self, key: str, data: bytes, *, alias_of: str, alias_durable: bool) -> bool:
        del alias_of, alias_durable  # no hard links: the slot alone holds the snapshot
        crashpoints.reach("commit.before_link")
        return self._create(key, data)

    def link(self, source: str, key: str) -> bool:
        """A copy, made exclusively: the bytes read, then PUT If-None-Match (two requests)."""
        return self._create(key, self.read(source))

    def flush_dir(self, key: str) -> None:
        del key  # a PUT is durable when it is answered

    def remove(self, key: str) -> None:
        """One DELETE, never retried. Without an answer it may have removed the key, or may
        still (within s3client.LATE_BOUND_S): the callers handle both, as they handle a key
        removed or not, and `settle` waits until it can no longer land."""
        try:
            self.client.call(self.where(key), "delete_object", Key=self.s3_key(key))
        except Unanswered:
            return  # remembered by the client: `settle` waits it out

    def settle(self) -> None:
        self.client.settle()

    def retire(self, key: str) -> None:
        del key  # the name and its bytes stay, so no writer can create it again

    def set_aside(self, key: str, target: str, still_bad: Judge) -> SetAside:
        return s3aside.set_aside(self, key, target, still_bad)

    def make_dir(self, key: str) -> bool:
        del key
        return False  # a key prefix exists by its keys

    def require_dir(self, key: str) -> None:
        del key  # nothing can be planted in a key prefix's place

    def touch(self, key: str) -> bool:
        """A copy of the key onto itself (new LastModified, same bytes)."""
        s3_key = self.s3_key(key)
        try:
            self.client.call(
                self.where(key),
                "copy_object",
                Key=s3_key,
                CopySource={"Bucket": self.client.bucket, "Key": s3_key},
                MetadataDirective="REPLACE",
                Metadata={"touched": str(int(time.time()))},
            )
        except Missing:
            return False
        return True

    def heal(self, key: str, data: bytes) -> bool:
        """An unconditional PUT of the verified bytes over damaged ones (Medium.heal): where
        the endpoint ignores If-Match on DELETE, fsck copies a damaged key aside and leaves
        it, and without this no writer could store that content again."""
        self.client.call(self.where(key), "put_object", Key=self.s3_key(key), Body=data)
        return True

    def replace(self, key: str, data: bytes) -> None:
        self.client.call(self.where(key), "put_object", Key=self.s3_key(key), Body=data)

    def check_safe(self) -> None:
        require_safe(self)

    # -- locks and the store as a whole ---------------------------------------------------------
    def lock(self, key: str, task_id: str, timeout: float) -> HeldLock | None:
        """The task's lease where one was asked for (`lease_s`), held when this returns;
        else None: no lock, the commit point alone keeps commits apart."""
        if self.lease_s is None:
            return None
        lease = Lease(self, key.rpartition("/")[0], task_id, self.lease_s)
        lease.acquire(timeout)
        return lease

    def init_store(self, marker: bytes) -> None:
        """Check the endpoint refuses a second exclusive create (and record it), then the
        marker, exclusively: an endpoint that ignores If-None-Match never gets a store."""
        exclusive = probe_exclusive_create(self)
        record_verdict(
            self, exclusive, "castore init", delete_if_match=probe_conditional_delete(self)
        )
        if not exclusive:
            raise UnsafeEndpointError(self.url, self.where(VERDICT_KEY))
        self._create(MARKER_KEY, marker)

    def interrupted_init(self, *, but_marker: bool = False) -> str | None:
        for entry in self.scan(""):
            if entry.name in (VERDICT_KEY, PROBE_KEY) or (but_marker and entry.name == MARKER_KEY):
                continue
            if entry.name == MARKER_KEY:
                return f"it has a {MARKER_KEY}"
            return f"it holds {entry.name!r}"
        return None

    def is_void(self) -> bool:
        return not self._has_children("")

    def content_counts(self) -> tuple[int, int]:
        objects = sum(
            int(page.get("KeyCount", 0))
            for page in self.client.pages(
                self.where(OBJECTS_DIR), Prefix=self.s3_key(OBJECTS_DIR) + "/"
            )
        )
        return objects, len(self.names(TASKS_DIR))
