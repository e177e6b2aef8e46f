"""Reading a store's files on POSIX: never through a symlink, never more than a limit, a
stale handle (ESTALE on a network filesystem) opened again, and every error a castore error
naming the path (castore.medium.oserrors)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from typing import TypeVar

from castore.errors import OversizedFileError, StoreIOError, UnsafeFileError
from castore.format.digest import Hasher
from castore.format.limits import MAX_OBJECT_SIZE
from castore.medium.base import Entry
from castore.medium.oserrors import file_kind, io_error, translated

R = TypeVar("R")

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
# A network filesystem's client may answer ESTALE for a handle the server no longer has (a name
# another client renamed over: GlusterFS with its default caches, for about a second); a fresh
# open looks the name up again. Bounded: a handle that stays stale is an error to report.
_ESTALE_RETRIES = 2


def close_read(fd: int) -> None:
    """Close a descriptor opened only to read. Its close cannot lose data, and Linux frees
    the descriptor whatever close() returns, so an error there changes nothing read."""
    try:
        os.close(fd)
    except OSError:
        return  # nothing was lost: see above


def open_regular(path: str, limit: int = MAX_OBJECT_SIZE) -> int:
    """Open `path` for reading, refusing symlinks, FIFOs, devices, directories and files
    larger than `limit` bytes (OversizedFileError: larger than anything castore writes)."""
    return open_regular_with_stat(path, limit)[0]


def open_regular_with_stat(path: str, limit: int = MAX_OBJECT_SIZE) -> tuple[int, os.stat_result]:
    """`open_regular`, and the fstat it had to make anyway."""
    fd = _open_read(path, path)
    try:
        info = _fstat_regular(path, fd, limit)
    except BaseException:
        close_read(fd)
        raise
    return fd, info


# The read path is fsck's hot loop: plain try/except (free unless it raises), not
# `translated`, whose context manager costs a microsecond per call.
def _open_read(path: str, name: str, dir_fd: int | None = None) -> int:
    try:
        return os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise io_error(path, "opening", exc) from exc


def _fstat_regular(path: str, fd: int, limit: int) -> os.stat_result:
    try:
        info = os.fstat(fd)
    except OSError as exc:
        raise io_error(path, "reading the status of", exc) from exc
    _check_regular(path, info, limit)
    return info


def _check_regular(path: str, info: os.stat_result, limit: int) -> None:
    """Refuse what is not a regular file, or too large to read into memory (a sparse file
    planted to exhaust it): the size is checked before a single byte is read."""
    if not stat.S_ISREG(info.st_mode):  # a device may never end, a FIFO never start
        raise UnsafeFileError(path, file_kind(info.st_mode))
    if info.st_size > limit:
        raise OversizedFileError(path, info.st_size, limit)


def read_regular_with_stat(path: str, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, os.stat_result]:
    """The whole content of a regular file and its fstat, in one read() when the size it
    stats is the size it reads (object files never change once published); opened and read
    again after an ESTALE, up to _ESTALE_RETRIES times."""
    try:
        return _read_once(path, limit)
    except StoreIOError as exc:
        if exc.errno != errno.ESTALE:
            raise
    return _after_estale(lambda: _read_once(path, limit))


def _read_once(path: str, limit: int) -> tuple[bytes, os.stat_result]:
    fd, info = open_regular_with_stat(path, limit)
    try:
        return _read_sized(path, fd, info, limit), info
    finally:
        close_read(fd)


def _estale_retried(read: Callable[[], R]) -> R:
    """`read()`, and again after an ESTALE (`_after_estale`)."""
    try:
        return read()
    except StoreIOError as exc:
        if exc.errno != errno.ESTALE:
            raise
    return _after_estale(read)


def _after_estale(read: Callable[[], R]) -> R:
    """`read()` again after a read failed with ESTALE, up to _ESTALE_RETRIES times; the
    last StoreIOError if the handle stays stale."""
    tries = 1
    while True:
        try:
            return read()
        except StoreIOError as exc:
            if exc.errno != errno.ESTALE or tries >= _ESTALE_RETRIES:
                raise
        tries += 1


def read_uncached(path: str, limit: int = MAX_OBJECT_SIZE) -> bytes:
    """The whole content of a regular file read again past the client's caches, for a
    caller about to call what it read first damaged: a fresh open, and the file's cached
    pages dropped before the read (a network filesystem's client may serve bytes it cached
    before another client's write; FORMAT.md 11.5). Slower than `read_regular`: never the
    first read."""
    return _estale_retried(lambda: _read_uncached_once(path, limit))


def _read_uncached_once(path: str, limit: int) -> bytes:
    fd, info = open_regular_with_stat(path, limit)
    try:
        # Advice only: a filesystem may refuse it (and macOS lacks it), the read still happens.
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return _read_sized(path, fd, info, limit)
    finally:
        close_read(fd)


def open_directory(path: str) -> int:
    """A descriptor of the directory `path` (never through a symlink), to read names in it."""
    with translated(path, "opening the directory"):
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def read_in(dir_fd: int, name: str, limit: int = MAX_OBJECT_SIZE) -> tuple[bytes, os.stat_result]:
    """Content and fstat of the regular file `name` in directory `dir_fd`, never following a
    symlink or blocking on a FIFO (UnsafeFileError for anything else). No path walk from the
    root for each name: fsck reads every slot of a chain this way. Read again after an
    ESTALE, like `read_regular_with_stat`."""
    try:
        return _read_in_once(dir_fd, name, limit)
    except StoreIOError as exc:
        if exc.errno != errno.ESTALE:
            raise
    return _after_estale(lambda: _read_in_once(dir_fd, name, limit))


def _read_in_once(dir_fd: int, name: str, limit: int) -> tuple[bytes, os.stat_result]:
    fd = _open_read(name, name, dir_fd)
    try:
        info = _fstat_regular(name, fd, limit)
        return _read_sized(name, fd, info, limit), info
    finally:
        close_read(fd)


def _read_sized(path: str, fd: int, info: os.stat_result, limit: int) -> bytes:
    """All bytes of `fd`, in one read() when the size fstat gave is the size there is."""
    # A FileNotFoundError goes through: a network filesystem may fail the read of a file
    # another client removed after our open, which means what a failed open means.
    with translated(path, "reading"):
        data = os.read(fd, info.st_size + 1)  # one byte more: a file that grew shows it
    return data if len(data) == info.st_size else _read_rest(path, fd, data, limit)


def _read_rest(path: str, fd: int, data: bytes, limit: int) -> bytes:
    """`data` and the rest of `fd` to its end (a short read, or a file that changed)."""
    return b"".join([data, *_chunks_to_end(path, fd, limit, len(data))])


def _chunks_to_end(path: str, fd: int, limit: int, size: int = 0) -> Iterator[bytes]:
    """The rest of `fd`, a megabyte at a time, up to `limit` bytes in all (`size` of them
    read already): a file that keeps growing is refused, not read until memory runs out."""
    while True:
        with translated(path, "reading"):
            chunk = os.read(fd, _CHUNK)
        if not chunk:
            return
        size += len(chunk)
        if size > limit:
            raise OversizedFileError(path, size, limit)
        yield chunk


def hash_regular(path: str, limit: int = MAX_OBJECT_SIZE) -> str:
    """The blake3 digest of a regular file (`read_regular`'s checks), read a megabyte at a
    time: a large object is verified without being held in memory; again after ESTALE."""
    return _estale_retried(lambda: _hash_once(path, limit))


def _hash_once(path: str, limit: int) -> str:
    fd, _ = open_regular_with_stat(path, limit)
    hasher = Hasher()
    try:
        for chunk in _chunks_to_end(path, fd, limit):
            hasher.update(chunk)
    finally:
        close_read(fd)
    return hasher.hexdigest()


def read_regular(path: str, limit: int = MAX_OBJECT_SIZE) -> bytes:
    """The whole content of a regular file, never following a link or blocking on a FIFO."""
    return read_regular_with_stat(path, limit)[0]


def read_prefix(path: str, size: int) -> bytes:
    """At most the first `size` bytes of the regular file `path` (an object's header); read
    again after an ESTALE, like `read_regular_with_stat`."""
    return _estale_retried(lambda: _read_prefix_once(path, size))


def _read_prefix_once(path: str, size: int) -> bytes:
    fd = open_regular(path, limit=1 << 62)  # only `size` bytes are read: any file will do
    try:
        with translated(path, "reading"):
            return os.read(fd, size)
    finally:
        close_read(fd)


def exists(path: str) -> bool:
    """True if `path` names anything (a symlink included, never followed); StoreIOError if
    the system cannot say (os.path.lexists would answer False to EACCES or EIO)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            return False  # a parent is a file: nothing can be there
        raise io_error(path, "looking up", exc) from exc
    return True


def list_names(directory: str) -> list[str]:
    """The names in `directory` (FileNotFoundError if it does not exist)."""
    with translated(directory, "listing the directory"):
        return os.listdir(directory)


def entry_of(name: str, info: os.stat_result) -> Entry:
    """The medium's Entry for a file `name` of status `info` (an lstat or fstat)."""
    return Entry(
        name=name,
        kind=file_kind(info.st_mode),
        size=info.st_size,
        mtime=info.st_mtime,
        mode=stat.S_IMODE(info.st_mode),
        inode=info.st_ino,
        links=info.st_nlink,
    )
