"""Durable file I/O on POSIX: the only code that writes bytes, fsyncs, links or unlinks in a
store (reading is castore.medium.fsread; errors are castore.medium.oserrors').

Publishing follows one rule: bytes are durable (file fsync) before any name points at them,
and a name is durable (directory fsync) before anything that depends on it is written.
A failed fsync is never retried: its temp file is removed and the error raised.

It is also where an OSError becomes a castore error (`io_error`): every function here
raises StoreIOError (DurabilityError on the write path) naming the path, the operation and
the system's reason, and lets only FileNotFoundError through as it is, because callers
turn an absent file into what it means for them (no store, a missing object, no task).
`translating` applies the same rule at the library's public boundary, for what escapes.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from castore import crashpoints
from castore.errors import (
    DurabilityError,
    UnsafeFileError,
)
from castore.format.layout import temp_name
from castore.medium.oserrors import file_kind, io_error, translated

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)

OBJECT_MODE = 0o444
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
# A network filesystem's client may answer ESTALE for a handle the server no longer has (a name
# another client renamed over: GlusterFS with its default caches, for about a second); a fresh
# open looks the name up again. Bounded: a handle that stays stale is an error to report.
_ESTALE_RETRIES = 2


def rename(source: str, target: str) -> None:
    """Rename `source` to `target` (FileNotFoundError if `source` is gone)."""
    with translated(source, f"renaming to {target}:"):
        os.rename(source, target)


def refresh_mtime(path: str) -> bool:
    """Set `path`'s mtime to now; False if the file is gone. A store shared by a group
    refuses it to whoever is not the owner: best effort then (FORMAT.md, gc)."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    except PermissionError:
        return True
    except OSError as exc:
        raise io_error(path, "refreshing the modification time of", exc) from exc
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# How a caller makes a file's bytes durable: fsync of its descriptor, or a shared flush
# (groupflush.py) that calls it for a lone caller and a syncfs for a round of them.
FileSync = Callable[[int, str], None]


def fsync_file(fd: int, path: str) -> None:
    """Make the bytes written to `fd` durable (OSError if not); `path` names it for callers
    that report."""
    del path
    os.fsync(fd)


def write_temp(
    directory: str, data: bytes, mode: int = OBJECT_MODE, sync: FileSync = fsync_file
) -> str:
    """Write `data` to a new temp file in `directory` and make it durable (`sync`); return
    its path.

    The file is created read-only: the descriptor that created it may still write, and
    nobody can open the published object for writing afterwards.
    """
    path = os.path.join(directory, temp_name())
    try:
        fd = os.open(path, _CREATE_FLAGS, mode)
    except FileNotFoundError:
        raise  # the directory is missing: the caller may create it and try again
    except OSError as exc:
        raise DurabilityError(path, "creating a temp file", exc) from exc
    try:
        crashpoints.reach("object.temp_created")
        if crashpoints.armed("object.mid_write"):
            _write_all(fd, data[: len(data) // 2])
            crashpoints.reach("object.mid_write")
            _write_all(fd, data[len(data) // 2 :])
        else:
            _write_all(fd, data)
        sync(fd, path)
    except OSError as exc:
        try:
            os.close(fd)
        except OSError:
            pass  # the write or fsync error is the one to report; the temp file goes anyway
        finally:
            discard(path)
        raise DurabilityError(path, "writing and syncing a temp file", exc) from exc
    try:
        os.close(fd)
    except OSError as exc:  # NFS reports deferred write errors at close
        discard(path)
        raise DurabilityError(path, "closing a temp file", exc) from exc
    crashpoints.reach("object.temp_synced")
    return path


def link_new(source: str, target: str) -> bool:
    """Give `source`'s inode the new name `target`; False if `target` already exists.

    link() is an exclusive create on every filesystem castore supports, including network
    filesystems whose locks do not reach other clients: "already exists" is the answer.
    """
    try:
        os.link(source, target, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as exc:
        # SFTP (sshfs) has no "already exists" status: a client that loses a race gets EPERM.
        # Whoever lost, the name now exists; only when it does not did the link truly fail.
        if os.path.lexists(target):
            return False
        raise DurabilityError(target, "linking a new name", exc) from exc
    return True


def fsync_dir(directory: str) -> None:
    """Make the names in `directory` durable."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise DurabilityError(directory, "opening a directory to sync it", exc) from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.close(fd)  # the fsync error is the one to report
        raise DurabilityError(directory, "syncing a directory", exc) from exc
    try:
        os.close(fd)
    except OSError as exc:  # a deferred error of the sync (NFS) is a failed sync
        raise DurabilityError(directory, "closing a synced directory", exc) from exc


def remove_if_present(path: str) -> None:
    """Unlink `path`; a missing file is fine (a crash or a peer may have removed it)."""
    try:  # no context managers: pruning a seal removes 8,192 names
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise io_error(path, "removing", exc) from exc


def discard(path: str) -> None:
    """Unlink the temp file `path` if the system lets us: cleanup after another error (the
    one to report) or after the name it fed was published. A temp file left behind is
    harmless; gc removes it once it is older than its grace period."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def require_real_directory(path: str) -> None:
    """Raise UnsafeFileError unless `path` is a directory itself (not a symlink to one)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return  # created on first use
    except OSError as exc:
        raise io_error(path, "looking up", exc) from exc
    if not stat.S_ISDIR(mode):
        raise UnsafeFileError(path, file_kind(mode), "directory")


def make_dir_durable(path: str) -> bool:
    """Create directory `path` (if needed) and make its name durable; True if created."""
    created = make_dir(path)
    # Also when it existed: it may be the name of a writer that crashed before its fsync.
    fsync_dir(os.path.dirname(path))
    return created


def make_dir(path: str) -> bool:
    """Create directory `path` (if needed), its name not synced (the caller flushes the whole
    filesystem before anything depends on it); True if created. UnsafeFileError if something
    other than a directory is there."""
    try:
        os.mkdir(path)
    except FileExistsError:
        with translated(path, "looking up"):
            mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise UnsafeFileError(path, file_kind(mode)) from None
        return False
    except OSError as exc:
        # A racing creator's directory, where a network filesystem reports another error than
        # EEXIST to the loser (sshfs: EPERM), is the directory this caller wanted.
        if exc.errno != errno.ENOENT and _is_real_directory(path):
            return False
        raise DurabilityError(path, "creating a directory", exc) from exc
    return True


def _is_real_directory(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def make_dirs_durable(path: str) -> None:
    """`make_dir_durable` for `path` and every missing parent (like mkdir -p)."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        make_dirs_durable(parent)
    make_dir_durable(path)


DirSync = Callable[[str], None]


def publish_file(
    directory: str,
    name: str,
    data: bytes,
    mode: int = OBJECT_MODE,
    *,
    sync: FileSync = fsync_file,
    sync_dir: DirSync | None = None,
    name_durable: bool = True,
) -> bool:
    """Durably create `directory/name` with `data`, never overwriting; True if created.
    `sync_dir`: how the name is made durable (default `fsync_dir`); `name_durable` False:
    the bytes are durable but the name need not be (a snapshot, whose chain slot is the
    durable name of the same inode: FORMAT.md 9.3)."""
    temp = write_temp(directory, data, mode, sync)
    try:
        created = link_new(temp, os.path.join(directory, name))
        crashpoints.reach("object.linked")
        # Also when the name existed: it may be a crashed writer's name that no fsync covered.
        if name_durable:
            (sync_dir or fsync_dir)(directory)
    finally:
        discard(temp)
    crashpoints.reach("object.published")
    return created


def replace_file(directory: str, name: str, data: bytes, mode: int = OBJECT_MODE) -> None:
    """Durably make `directory/name` hold `data`, replacing what it held in one step: readers
    see the old bytes or the new, never a mix (rename over; the name itself is never followed)."""
    temp = write_temp(directory, data, mode)
    try:
        with translated(temp, f"renaming over {os.path.join(directory, name)}:"):
            os.replace(temp, os.path.join(directory, name))
    except BaseException:
        discard(temp)
        raise
    fsync_dir(directory)


@functools.cache
def _libc_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs(2), or None where the C library lacks it (glibc before 2.14, non-Linux)."""
    import ctypes  # noqa: PLC0415 -- only group commit needs it, not every import of fsio

    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int

    def call(fd: int) -> int:
        if function(fd) == -1:
            return ctypes.get_errno() or errno.EIO
        return 0

    return call


def syncfs_available() -> bool:
    """True when libc offers syncfs(2), so one call can flush a whole filesystem."""
    return _libc_syncfs() is not None


def syncfs(fd: int) -> None:
    """Flush every dirty file of the filesystem holding `fd` (syncfs(2)); OSError with its errno
    on failure (from Linux 5.8 on that includes write-back errors of files nobody fsynced).
    The only syncfs castore makes (groupflush.py), so the power-loss recorder can see it."""
    function = _libc_syncfs()
    if function is None:
        raise OSError(errno.ENOSYS, "this C library has no syncfs")
    code = function(fd)
    if code:
        raise OSError(code, os.strerror(code))
