"""`fsck --quarantine`: move damaged objects aside, with a manifest. Never deletes anything.

Every directory is reached through descriptors opened without following symlinks, from the
store root down: a `quarantine/` (or any directory below it, or a fan-out directory) planted
as a symlink is refused, never written through. Each file is checked again right before it
is moved, and once more after it got its second name in the run directory, before its own
name is removed (a writer may have stored the object again, intact, since fsck looked): an
intact one stays where it belongs.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress

from castore import crashpoints
from castore.errors import CastoreError, StoreIOError, UnsafeFileError
from castore.format import codec
from castore.format.layout import OBJECTS_DIR, QUARANTINE_DIR, is_object_name, temp_name
from castore.maintenance.fsck.findings import Finding
from castore.maintenance.fsck.objects import check_data
from castore.medium.oserrors import file_kind

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
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def quarantine(root: str, findings: Iterable[Finding]) -> tuple[str, list[Finding]]:
    """Move every damaged object file under quarantine/<time>-<pid>/; return (dir, moved).

    UnsafeFileError if `quarantine/` or a directory castore would write in is not a directory
    itself; StoreIOError for any other failure (the message says what was moved by then)."""
    chosen = {
        f.path: f for f in findings if f.code in DAMAGE and f.path.startswith(f"{OBJECTS_DIR}/")
    }
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    relbase = f"{QUARANTINE_DIR}/{stamp}-{os.getpid()}-{secrets.token_hex(3)}"  # never shared
    if not chosen:
        return relbase, []
    moved: list[Finding] = []
    try:
        with ExitStack() as stack:
            root_fd = stack.enter_context(_fd(os.open(root, os.O_RDONLY | os.O_DIRECTORY)))
            quarantine_fd = stack.enter_context(_subdir(root, root_fd, QUARANTINE_DIR))
            base_fd = stack.enter_context(_subdir(root, quarantine_fd, relbase, new=True))
            for relpath, finding in sorted(chosen.items()):
                if _move(root, root_fd, base_fd, relpath, finding):
                    moved.append(finding)
            manifest = [{**f.to_json(), "moved_to": f"{relbase}/{f.path}"} for f in moved]
            _publish(base_fd, "manifest.json", codec.encode_value(manifest) + b"\n")
    except CastoreError:
        raise
    except OSError as exc:
        where = os.path.join(root, str(exc.filename)) if exc.filename else root
        done = f"{len(moved)} file(s) were moved to {relbase} before it" if moved else ""
        raise StoreIOError(where, "quarantining", exc, done) from exc
    return relbase, moved


@contextmanager
def _fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _open_dir(root: str, parent_fd: int, name: str, shown: str) -> int:
    """A directory below `parent_fd`, never through a symlink (UnsafeFileError)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        mode = os.lstat(name, dir_fd=parent_fd).st_mode
        raise UnsafeFileError(os.path.join(root, shown), file_kind(mode), "directory") from None


@contextmanager
def _subdir(root: str, parent_fd: int, relpath: str, *, new: bool = False) -> Iterator[int]:
    """Descriptor of directory `relpath` (relative to `root`, its last part in `parent_fd`),
    created if missing and made durable (its parent fsynced, also when it existed: O7)."""
    name = os.path.basename(relpath)
    try:
        os.mkdir(name, dir_fd=parent_fd)
    except FileExistsError:
        if new:
            raise
    fd = _open_dir(root, parent_fd, name, relpath)
    try:
        os.fsync(parent_fd)
        yield fd
    finally:
        os.close(fd)


def _walk(root: str, root_fd: int, relpath: str, stack: ExitStack) -> int:
    """Descriptor of the directory holding `relpath`, each step refusing a symlink."""
    fd = root_fd
    parts = relpath.split("/")[:-1]
    for depth, part in enumerate(parts):
        fd = stack.enter_context(_fd(_open_dir(root, fd, part, "/".join(parts[: depth + 1]))))
    return fd


def _move(root: str, root_fd: int, base_fd: int, relpath: str, finding: Finding) -> bool:
    """Move one damaged file under the run directory; False if it vanished or is intact."""
    name = os.path.basename(relpath)
    with ExitStack() as stack:
        source_fd = _walk(root, root_fd, relpath, stack)
        if not _damaged(source_fd, name, relpath, finding):
            return False  # stored again, intact, since fsck looked (or gone)
        target_fd = base_fd
        parts = relpath.split("/")[:-1]
        for depth in range(len(parts)):
            shown = "/".join(parts[: depth + 1])
            target_fd = stack.enter_context(_subdir(root, target_fd, shown))
        try:
            if stat.S_ISDIR(os.lstat(name, dir_fd=source_fd).st_mode):
                # A directory cannot be linked: renamed, the only rename castore makes (O1).
                os.rename(name, name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
                os.fsync(source_fd)
                os.fsync(target_fd)
                return True
            # A second name first, made durable, and only then the first one removed: a
            # rename is two directory changes a power loss may split, losing both names.
            os.link(name, name, src_dir_fd=source_fd, dst_dir_fd=target_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False  # gone since fsck looked; nothing to move
        _sync_second_name(target_fd)
        crashpoints.reach("quarantine.moved")
        moved = os.lstat(name, dir_fd=target_fd)
        if not _damaged(target_fd, name, relpath, finding):
            # A writer stored it again between the look and the link: the store keeps it.
            os.unlink(name, dir_fd=target_fd)
            os.fsync(target_fd)
            return False
        with suppress(FileNotFoundError):
            if os.lstat(name, dir_fd=source_fd).st_ino == moved.st_ino:  # else replaced since
                os.unlink(name, dir_fd=source_fd)
        os.fsync(source_fd)
        return True


def _sync_second_name(dir_fd: int) -> None:
    """Make the run directory's new name durable before the file's own name goes (the
    power-loss self-test removes exactly this step, tests/test_power_loss_gc.py)."""
    os.fsync(dir_fd)


def _damaged(dir_fd: int, name: str, relpath: str, finding: Finding) -> bool:
    """Whether the file `name` in `dir_fd` is still damaged (False if it vanished)."""
    if finding.code == "misplaced-object" or not is_object_name(name):
        return _exists(dir_fd, name)  # damaged by where it is, or by its name
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return True  # a symlink under an object's name
        raise
    with _fd(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return True
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    report = check_data(relpath, name, b"".join(chunks), info)
    return any(f.code in DAMAGE for f in report.findings)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _publish(dir_fd: int, name: str, data: bytes) -> None:
    """Durably create `name` in `dir_fd` with `data` (temp file, fsync, link, fsync)."""
    temp = temp_name()
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    try:
        with _fd(fd):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        os.fsync(dir_fd)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
