"""fsck --quarantine on S3: a damaged key copied aside, and removed only by a DELETE that
carries the ETag of the very bytes judged damaged (docs/FORMAT.md §19.4)."""

from __future__ import annotations

import datetime

from castore import crashpoints
from castore.errors import OversizedFileError
from castore.format.limits import MAX_OBJECT_SIZE
from castore.medium.base import Entry, Judge, SetAside
from castore.medium.s3client import Exists, Missing
from castore.medium.s3verdict import S3Medium


def set_aside(medium: S3Medium, key: str, target: str, still_bad: Judge) -> SetAside:
    """A copy of exactly the bytes judged (CopySourceIfMatch their ETag), judged again as
    the copy, then a DELETE of the original that carries that ETag (If-Match), so that
    it removes only the damaged bytes: another remover may have deleted the key and a
    writer stored it again, intact (other bytes, another ETag), meanwhile. Where the
    endpoint ignores If-Match on DELETE (`conditional_delete` False: Ceph RGW 16), no
    request can carry that condition, so the original is left in place ("copied")."""
    etag = _judged_etag(medium, key, still_bad)
    if etag is None or not _copy_judged(medium, key, target, etag, still_bad):
        return "kept"
    if not medium.conditional_delete:
        return "copied"
    try:
        medium.client.call(medium.where(key), "delete_object", Key=medium.s3_key(key), IfMatch=etag)
    except Exists:
        return "copied"  # stored again, other bytes, since it was judged: it stays
    except Missing:
        pass  # another remover took the same damaged bytes away first
    return "moved"


def _judged_etag(medium: S3Medium, key: str, still_bad: Judge) -> str | None:
    """The ETag of `key`'s bytes if `still_bad` judges them damaged (one GET); else None."""
    where = medium.where(key)
    try:
        response = medium.client.call(where, "get_object", Key=medium.s3_key(key))
        data = medium.client.body(response, where, MAX_OBJECT_SIZE)
    except Missing:
        return None
    except OverflowError as exc:
        raise OversizedFileError(where, int(str(exc)), MAX_OBJECT_SIZE) from None
    etag = str(response.get("ETag", ""))
    modified = response.get("LastModified")
    entry = Entry(key.rsplit("/", 1)[-1], "regular file", len(data), seconds(modified))
    return etag if etag and still_bad(data, entry) else None


def _copy_judged(medium: S3Medium, key: str, target: str, etag: str, still_bad: Judge) -> bool:
    """Copy the bytes of `key` that had `etag` to `target`, judged again as the copy;
    False (nothing left under `target`) if they are gone or intact now."""
    try:
        medium.client.call(
            medium.where(target),
            "copy_object",
            Key=medium.s3_key(target),
            CopySource={"Bucket": medium.client.bucket, "Key": medium.s3_key(key)},
            CopySourceIfMatch=etag,
        )
    except (Missing, Exists):
        return False  # gone, or other bytes, since it was judged: nothing to move
    crashpoints.reach("quarantine.moved")
    try:
        copied = medium.read_entry(target)
    except FileNotFoundError:
        return False  # the copy is ours alone: a lost one leaves the original
    if not still_bad(*copied):
        medium.remove(target)  # a key only this run names: removing it is harmless
        return False
    return True


def seconds(modified: datetime.datetime | None) -> float:
    """An S3 answer's LastModified as seconds since the epoch (0 if it gave none)."""
    return modified.timestamp() if modified is not None else 0.0
