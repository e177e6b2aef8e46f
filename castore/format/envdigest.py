"""Environment digests: what a task's world looked like, so a resume can notice it changed."""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterable

from castore.errors import UsageError
from castore.format import codec
from castore.format.digest import Hasher, hash_bytes

_CHUNK = 1 << 20


def env_digest(value: object) -> str:
    """The digest of any JSON-able value (canonical encoding, so key order does not matter)."""
    return "value:" + hash_bytes(codec.encode_value(value))


def _ignored(relative: str, patterns: tuple[str, ...]) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(relative, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def tree_digest(root: str | os.PathLike[str], ignore: Iterable[str] = ()) -> str:
    """The digest of a directory tree: every path, its type, its executable bit, and each
    file's bytes or link's target (links are not followed). `ignore` takes glob patterns
    matched against the relative path and the base name (e.g. "*.pyc", ".git", "logs/*")."""
    base = os.fspath(root)
    if not os.path.isdir(base):
        raise UsageError(f"{base} is not a directory; tree_digest needs the root of a tree")
    patterns = tuple(ignore)
    hasher = Hasher()
    for relative, path, mode in _walk(base, "", patterns):
        hasher.update(relative.encode("utf-8", "surrogateescape") + b"\0")
        if stat.S_ISLNK(mode):
            hasher.update(b"L" + os.readlink(path).encode("utf-8", "surrogateescape") + b"\0")
        elif stat.S_ISDIR(mode):
            hasher.update(b"D\0")
        elif stat.S_ISREG(mode):
            hasher.update(b"X" if mode & 0o111 else b"F")
            hasher.update(os.stat(path, follow_symlinks=False).st_size.to_bytes(8, "big"))
            with open(path, "rb") as handle:
                while chunk := handle.read(_CHUNK):
                    hasher.update(chunk)
        else:
            hasher.update(b"O\0")  # FIFOs, sockets, devices: their presence is what counts
    return "tree:" + hasher.hexdigest()


def _walk(base: str, prefix: str, patterns: tuple[str, ...]) -> Iterable[tuple[str, str, int]]:
    """(relative path, path, lstat mode) of every entry, depth first, names sorted bytewise."""
    directory = os.path.join(base, prefix) if prefix else base
    for name in sorted(os.listdir(directory), key=lambda n: n.encode("utf-8", "surrogateescape")):
        relative = f"{prefix}/{name}" if prefix else name
        if _ignored(relative, patterns):
            continue
        path = os.path.join(base, relative)
        mode = os.lstat(path).st_mode
        yield relative, path, mode
        if stat.S_ISDIR(mode):
            yield from _walk(base, relative, patterns)
