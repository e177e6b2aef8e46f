"""`castore doctor s3://bucket/prefix`: does this S3 endpoint give castore what it relies on?

The commit point on S3 is `PUT If-None-Match: *`. Some S3-compatible servers have been
reported to accept the header and ignore it (Ceph tracker 68183 before its fix, other
reports): two writers would then both "create" a slot and both commit. So the doctor does not
trust a version number; it asks the endpoint, under the store's prefix:

- exclusive-create: a key created twice; the second must be refused (412);
- exclusive-create-race: CLIENTS threads create the same new key at once, ROUNDS times;
  exactly one must win each round, and the key must hold the winner's bytes (moto 5.2.5's
  server, whose check and store are two steps, had 2 winners in 11 of 2,000 rounds: a race
  inside a server can be rare, so the default is 1,000 rounds, about 2 minutes);
- read-after-write and list-after-write: what one request wrote, the next reads and lists;
- delete-visible: a removed key is gone for the next request (info: gc and forget);
- conditional-delete: a DELETE with a wrong If-Match ETag is refused, with the right one
  obeyed (info: where it is not, fsck --quarantine copies a damaged key aside and leaves it,
  since no request could remove only the damaged bytes; Ceph RGW 16.2 ignores it);
- conditional-put: a PUT with the right If-Match ETag replaces the key (info: castore never
  replaces a key it relies on, so nothing rests on it; RGW 16.2 answers 412).

The verdict is recorded in the store (`castore-medium.json`), which `Store.open` reads: a store
whose endpoint failed a required check is refused.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import threading
from collections.abc import Callable
from typing import Any

from castore.doctor.report import Check, DoctorReport, Verdict
from castore.errors import UsageError
from castore.medium.s3 import S3Medium
from castore.medium.s3client import Exists, Missing, Unanswered
from castore.medium.s3verdict import probe_conditional_delete, record_verdict

ROUNDS = 1000
CLIENTS = 8
_SCRATCH = ".castore-doctor"


def run_s3_doctor(url: str, *, rounds: int = ROUNDS, **options: Any) -> DoctorReport:
    """Probe the endpoint of the store at `url` (options: the S3 client's), `rounds` races
    of CLIENTS creates, record the verdict in the store, and report every check."""
    if rounds < 1:
        raise UsageError(f"--rounds must be at least 1, not {rounds}")
    medium = S3Medium.from_url(url, **options)
    run = f"{_SCRATCH}/{secrets.token_hex(6)}"
    checks: list[tuple[str, bool, Callable[[S3Medium, str], tuple[Verdict, str]]]] = [
        ("exclusive-create", True, _exclusive_create),
        ("exclusive-create-race", True, functools.partial(_exclusive_race, rounds=rounds)),
        ("read-after-write", True, _read_after_write),
        ("list-after-write", True, _list_after_write),
        ("delete-visible", False, _delete_visible),
        ("conditional-delete", False, _conditional_delete),
        ("conditional-put", False, _conditional_put),
    ]
    found = []
    try:
        for name, required, probe in checks:
            try:
                verdict, detail = probe(medium, f"{run}/{name}")
            except Exception as exc:  # noqa: BLE001 - a probe that fails is the finding
                verdict, detail = "fail", f"{type(exc).__name__}: {exc}"
            found.append(Check(name, verdict, detail, required))
    finally:
        _clean(medium, run)
    report = DoctorReport(url, None, found)
    facts = {c.name: c.verdict for c in found}
    record_verdict(
        medium,
        report.safe,
        "castore doctor",
        checks=facts,
        rounds=rounds,
        delete_if_match=facts.get("conditional-delete") == "ok",
    )
    return report


def _put_new(medium: S3Medium, key: str, data: bytes) -> bool:
    try:
        medium.client.call(
            medium.where(key), "put_object", Key=medium.s3_key(key), Body=data, IfNoneMatch="*"
        )
    except Exists:
        return False
    return True


def _exclusive_create(medium: S3Medium, key: str) -> tuple[Verdict, str]:
    first, second = _put_new(medium, key, b"first"), _put_new(medium, key, b"second")
    held = medium.read(key)
    if first and not second and held == b"first":
        return "ok", "a second PUT If-None-Match of a key is refused (412)"
    return "fail", (
        f"first create {'made' if first else 'refused'}, second {'made' if second else 'refused'}"
        f", the key holds {held!r}: the endpoint ignores If-None-Match"
    )


def _exclusive_race(medium: S3Medium, prefix: str, *, rounds: int) -> tuple[Verdict, str]:
    bad = []
    for round_ in range(rounds):
        key = f"{prefix}/{round_}"
        won: list[bytes] = []
        barrier = threading.Barrier(CLIENTS)

        def contend(
            n: int, key: str = key, won: list[bytes] = won, barrier: threading.Barrier = barrier
        ) -> None:
            data = f"client {n}".encode()
            barrier.wait()
            if _put_new(medium, key, data):
                won.append(data)

        threads = [threading.Thread(target=contend, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if len(won) != 1 or medium.read(key) != won[0]:
            bad.append(f"round {round_}: {len(won)} winners")
    if bad:
        return "fail", f"{len(bad)}/{rounds} rounds without exactly one winner ({bad[0]}, ...)"
    # A pass is evidence, not proof: a race inside the server may need more rounds to show.
    return "ok", (
        f"{rounds}/{rounds} rounds of {CLIENTS} concurrent creates: one winner each; "
        f"{rare_race(rounds)}"
    )


def rare_race(rounds: int) -> str:
    """How rare a race these rounds could have missed: with none seen in N rounds, a race in
    more than 3 of every N rounds would have shown with 95% confidence (the rule of three)."""
    return (
        f"a race rarer than 1 in {max(1, rounds // 3):,} rounds could have slipped through "
        "(95% confidence)"
    )


def _read_after_write(medium: S3Medium, key: str) -> tuple[Verdict, str]:
    data = secrets.token_bytes(64)
    medium.replace(key, data)
    if medium.read(key) != data:
        return "fail", "a key just written reads other bytes"
    return "ok", "a key just written reads back at once"


def _list_after_write(medium: S3Medium, prefix: str) -> tuple[Verdict, str]:
    names = [f"k{n}" for n in range(5)]
    for name in names:
        medium.replace(f"{prefix}/{name}", b"x")
    listed = sorted(medium.names(prefix))
    if listed != names:
        return "fail", f"a listing right after the writes shows {listed}, not {names}"
    return "ok", "keys just written are listed at once"


def _delete_visible(medium: S3Medium, key: str) -> tuple[Verdict, str]:
    medium.replace(key, b"x")
    medium.remove(key)
    try:
        medium.client.call(medium.where(key), "head_object", Key=medium.s3_key(key))
    except Missing:
        return "ok", "a removed key is gone for the next request"
    return "warn", "a removed key is still found right after"


def _conditional_delete(medium: S3Medium, key: str) -> tuple[Verdict, str]:
    del key  # the probe names its own key (castore.medium.s3)
    if probe_conditional_delete(medium):
        return "ok", "a DELETE with a wrong If-Match ETag is refused: quarantine removes"
    return "warn", (
        "a DELETE with a wrong If-Match ETag is not refused: fsck --quarantine will copy "
        "damaged keys aside and leave them in place"
    )


def _conditional_put(medium: S3Medium, key: str) -> tuple[Verdict, str]:
    put = medium.client.call(medium.where(key), "put_object", Key=medium.s3_key(key), Body=b"1")
    try:
        medium.client.call(
            medium.where(key),
            "put_object",
            Key=medium.s3_key(key),
            Body=b"2",
            IfMatch=str(put.get("ETag", "")),
        )
    except Exists:
        return "warn", "a PUT with the right If-Match ETag is refused (nothing relies on it)"
    return "ok", "a PUT with the right If-Match ETag replaces the key"


def _clean(medium: S3Medium, run: str) -> None:
    prefix = medium.s3_key(run) + "/"
    for page in medium.client.pages(medium.where(run), Prefix=prefix):
        for item in page.get("Contents", ()):
            # A scratch key of this run alone: an unanswered DELETE leaves at most a leftover.
            with contextlib.suppress(Unanswered):
                medium.client.call(medium.where(run), "delete_object", Key=item["Key"])
