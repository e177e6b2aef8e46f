"""`fsck --quarantine`: move damaged objects aside, with a manifest. Never deletes anything."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterable

from castore import codec, fsio
from castore.fsck.findings import Finding
from castore.layout import OBJECTS_DIR, QUARANTINE_DIR

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


def quarantine(root: str, findings: Iterable[Finding]) -> tuple[str, list[Finding]]:
    """Move every damaged object file under quarantine/<time>-<pid>/; return (dir, moved)."""
    chosen = {
        f.path: f for f in findings if f.code in DAMAGE and f.path.startswith(f"{OBJECTS_DIR}/")
    }
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    relbase = f"{QUARANTINE_DIR}/{stamp}-{os.getpid()}-{secrets.token_hex(3)}"  # never shared
    base = os.path.join(root, relbase)
    if not chosen:
        return relbase, []
    fsio.make_dirs_durable(base)
    moved: list[Finding] = []
    for relpath, finding in sorted(chosen.items()):
        target = os.path.join(base, relpath)
        fsio.make_dirs_durable(os.path.dirname(target))
        try:
            fsio.rename(os.path.join(root, relpath), target)  # same filesystem: atomic, no copy
        except FileNotFoundError:
            continue  # gone since fsck looked; nothing to move
        fsio.fsync_dir(os.path.dirname(os.path.join(root, relpath)))
        fsio.fsync_dir(os.path.dirname(target))
        moved.append(finding)
    manifest = [{**f.to_json(), "moved_to": f"{relbase}/{f.path}"} for f in moved]
    fsio.publish_file(base, "manifest.json", codec.encode_value(manifest) + b"\n", mode=0o644)
    return relbase, moved
