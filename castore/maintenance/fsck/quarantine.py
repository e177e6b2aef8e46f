"""`fsck --quarantine`: move damaged objects aside, with a manifest. Never deletes anything
but the damaged bytes it judged (on S3, only by a DELETE that carries their ETag).

Each file is moved by the medium's `set_aside` (docs/FORMAT.md §19.1), which never writes
through a symlink (a `quarantine/`, any directory below it, or a fan-out directory planted
as one is refused) and asks this module again, right before the move and once more after
the file got its second name in the run directory, whether it is still damaged (a writer
may have stored the object again, intact, since fsck looked): an intact one stays.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Iterable

from castore.errors import CastoreError, StoreIOError
from castore.format import codec
from castore.format.layout import OBJECTS_DIR, QUARANTINE_DIR, is_object_name
from castore.maintenance.fsck.findings import Finding
from castore.maintenance.fsck.objects import check_data
from castore.medium.base import Entry, Judge, Medium
from castore.medium.select import open_medium

# Findings that mean "this object file must not be used": moved aside. An object of an
# unknown format version is not damaged (a newer castore wrote it) and stays.
DAMAGE = frozenset(
    {
        "unsafe-file",
        "misplaced-object",
        "object-empty",
        "truncated",
        "bad-header",
        "unknown-kind",
        "hash-mismatch",
        "object-wrong-name",
        "undecodable",
        "not-canonical",
        "schema-invalid",
    }
)


def quarantine(
    store: str | os.PathLike[str] | Medium, findings: Iterable[Finding]
) -> tuple[str, list[Finding], list[Finding]]:
    """Move every damaged object file of the store (its directory, or its medium) under
    quarantine/<time>-<pid>/; return (dir, moved, copied): copied ones were copied there and
    left in place, where no request could remove only the damaged bytes (S3 without a
    conditional DELETE, docs/FORMAT.md §19.4).

    UnsafeFileError if `quarantine/` or a directory castore would write in is not a directory
    itself; StoreIOError for any other failure (the message says what was moved by then)."""
    medium = open_medium(store)
    chosen = {
        f.path: f for f in findings if f.code in DAMAGE and f.path.startswith(f"{OBJECTS_DIR}/")
    }
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    relbase = f"{QUARANTINE_DIR}/{stamp}-{os.getpid()}-{secrets.token_hex(3)}"  # never shared
    if not chosen:
        return relbase, [], []
    moved: list[Finding] = []
    copied: list[Finding] = []
    try:
        medium.require_dir(QUARANTINE_DIR)  # a symlink planted there is never written through
        medium.make_dir(QUARANTINE_DIR)
        if not medium.make_dir(relbase) and medium.directories:
            raise FileExistsError(errno.EEXIST, "the run directory exists", relbase)
        for relpath, finding in sorted(chosen.items()):
            result = medium.set_aside(relpath, f"{relbase}/{relpath}", _still_damaged(finding))
            if result == "moved":
                moved.append(finding)
            elif result == "copied":
                copied.append(finding)
        manifest = [{**f.to_json(), "moved_to": f"{relbase}/{f.path}"} for f in moved] + [
            {**f.to_json(), "copied_to": f"{relbase}/{f.path}", "left_in_place": True}
            for f in copied
        ]
        medium.create(f"{relbase}/manifest.json", codec.encode_value(manifest) + b"\n", mode=0o644)
    except CastoreError:
        raise
    except OSError as exc:
        where = medium.where(str(exc.filename)) if exc.filename else medium.url
        done = f"{len(moved)} file(s) were moved to {relbase} before it" if moved else ""
        raise StoreIOError(where, "quarantining", exc, done) from exc
    return relbase, moved, copied


def _still_damaged(finding: Finding) -> Judge:
    """Whether the file of `finding`, as the medium finds it now, must still be moved."""
    name = finding.path.rsplit("/", 1)[-1]

    def judge(data: bytes | None, entry: Entry) -> bool:
        if finding.code == "misplaced-object" or not is_object_name(name):
            return True  # damaged by where it is, or by its name
        if data is None:
            return True  # a symlink, FIFO or directory under an object's name
        report = check_data(finding.path, name, data, entry)
        return any(f.code in DAMAGE for f in report.findings)

    return judge
