"""Durable file I/O: the only code that writes bytes, fsyncs, links or unlinks in a store.

Publishing follows one rule: bytes are durable (file fsync) before any name points at them,
and a name is durable (directory fsync) before anything that depends on it is written.
A failed fsync is never retried: its temp file is removed and the error raised.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from castore import crashpoints
from castore.errors import DurabilityError, UnsafeFileError
from castore.layout import temp_name

OBJECT_MODE = 0o444
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def file_kind(mode: int) -> str:
    """A human name for what a stat mode says a path is."""
    if stat.S_ISREG(mode):
        return "regular file"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device or special file"


def open_regular(path: str) -> int:
    """Open `path` for reading, refusing symlinks, FIFOs, devices and directories."""
    return open_regular_with_stat(path)[0]


def open_regular_with_stat(path: str) -> tuple[int, os.stat_result]:
    """`open_regular`, and the fstat it had to make anyway."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(path, "symlink") from exc
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFileError(path, file_kind(info.st_mode))
    return fd, info


def read_regular_with_stat(path: str) -> tuple[bytes, os.stat_result]:
    """The whole content of a regular file and its fstat, in one read() when the size it
    stats is the size it reads (object files never change once published)."""
    fd, info = open_regular_with_stat(path)
    try:
        return _read_sized(fd, info), info
    finally:
        os.close(fd)


def open_directory(path: str) -> int:
    """A descriptor of the directory `path` (never through a symlink), to read names in it."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def read_in(dir_fd: int, name: str) -> tuple[bytes, os.stat_result]:
    """Content and fstat of the regular file `name` in directory `dir_fd`, never following a
    symlink or blocking on a FIFO (UnsafeFileError for anything else). No path walk from the
    root for each name: fsck reads every slot of a chain this way."""
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a device may never end, a FIFO never start
            raise UnsafeFileError(name, file_kind(info.st_mode))
        return _read_sized(fd, info), info
    finally:
        os.close(fd)


def _read_sized(fd: int, info: os.stat_result) -> bytes:
    """All bytes of `fd`, in one read() when the size fstat gave is the size there is."""
    data = os.read(fd, info.st_size + 1)  # one byte more: a file that grew shows it
    return data if len(data) == info.st_size else _read_rest(fd, data)


def _read_rest(fd: int, data: bytes) -> bytes:
    """`data` and the rest of `fd` to its end (a short read, or a file that changed)."""
    chunks = [data]
    while chunk := os.read(fd, _CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def read_regular(path: str) -> bytes:
    """The whole content of a regular file, never following a link or blocking on a FIFO."""
    fd = open_regular(path)
    try:
        chunks = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_temp(directory: str, data: bytes, mode: int = OBJECT_MODE) -> str:
    """Write `data` to a new temp file in `directory` and fsync it; return its path.

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
        os.fsync(fd)
    except OSError as exc:
        try:
            os.close(fd)
        except OSError:
            pass  # the write or fsync error is the one to report; the temp file goes anyway
        finally:
            remove_if_present(path)
        raise DurabilityError(path, "writing and syncing a temp file", exc) from exc
    try:
        os.close(fd)
    except OSError as exc:  # NFS reports deferred write errors at close
        remove_if_present(path)
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
        raise DurabilityError(directory, "syncing a directory", exc) from exc
    finally:
        os.close(fd)


def remove_if_present(path: str) -> None:
    """Unlink `path`; a missing file is fine (a crash or a peer may have removed it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def require_real_directory(path: str) -> None:
    """Raise UnsafeFileError unless `path` is a directory itself (not a symlink to one)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return  # created on first use
    if not stat.S_ISDIR(mode):
        raise UnsafeFileError(path, file_kind(mode), "directory")


def make_dir_durable(path: str) -> bool:
    """Create directory `path` (if needed) and make its name durable; True if created."""
    try:
        os.mkdir(path)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise UnsafeFileError(path, file_kind(os.lstat(path).st_mode)) from None
        # It may be the name of a writer that crashed before its fsync: make it durable now.
        fsync_dir(os.path.dirname(path))
        return False
    except OSError as exc:
        raise DurabilityError(path, "creating a directory", exc) from exc
    fsync_dir(os.path.dirname(path))
    return True


def make_dirs_durable(path: str) -> None:
    """`make_dir_durable` for `path` and every missing parent (like mkdir -p)."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        make_dirs_durable(parent)
    make_dir_durable(path)


def publish_file(directory: str, name: str, data: bytes, mode: int = OBJECT_MODE) -> bool:
    """Durably create `directory/name` with `data`, never overwriting; True if created."""
    temp = write_temp(directory, data, mode)
    try:
        created = link_new(temp, os.path.join(directory, name))
        crashpoints.reach("object.linked")
        # Also when the name existed: it may be a crashed writer's name that no fsync covered.
        fsync_dir(directory)
    finally:
        remove_if_present(temp)
    crashpoints.reach("object.published")
    return created
