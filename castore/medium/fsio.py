"""Durable file I/O: the only code that writes bytes, fsyncs, links or unlinks in a store.

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
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from castore import crashpoints
from castore.errors import (
    CastoreError,
    DurabilityError,
    OversizedFileError,
    StoreIOError,
    UnsafeFileError,
)
from castore.format.digest import Hasher
from castore.format.layout import temp_name
from castore.format.limits import MAX_OBJECT_SIZE

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


def io_error(path: str, operation: str, exc: OSError) -> CastoreError:
    """The castore error for `exc`, raised by `operation` on `path`: the one translation of
    an OSError (a symlink refused by O_NOFOLLOW is an UnsafeFileError, like any planted file)."""
    if isinstance(exc, CastoreError):
        return exc
    if exc.errno == errno.ELOOP:
        return UnsafeFileError(path, "symlink")
    return StoreIOError(path, operation, exc)


@contextlib.contextmanager
def translated(path: str, operation: str) -> Iterator[None]:
    """Raise `io_error(path, operation, ...)` for an OSError of the block; FileNotFoundError
    goes through unchanged (its caller says what the absence means)."""
    try:
        yield
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise io_error(path, operation, exc) from exc


def _escaped(exc: OSError) -> CastoreError:
    """The castore error for an OSError that reached a public entry point untranslated."""
    path = os.fsdecode(exc.filename) if exc.filename is not None else "a store path"
    return io_error(path, "accessing", exc)


def translating(func: Callable[P, R]) -> Callable[P, R]:
    """`func`, raising a castore error for any OSError that escapes it (FileNotFoundError
    included): the library's public entry points leak no OSError, whatever code raised it."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except CastoreError:
            raise  # an OSError already translated (StoreIOError, DurabilityError, ...)
        except OSError as exc:
            raise _escaped(exc) from exc

    return wrapper


def translating_iterator(func: Callable[P, Iterator[R]]) -> Callable[P, Iterator[R]]:
    """`translating` for a generator function, whose errors come while it is iterated."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Iterator[R]:
        iterator = func(*args, **kwargs)
        try:
            yield from iterator
        except CastoreError:
            raise  # an OSError already translated (StoreIOError, DurabilityError, ...)
        except OSError as exc:
            raise _escaped(exc) from exc

    return wrapper


def translating_methods(cls: C) -> C:
    """`translating` for every public method (and class method) of `cls`."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, classmethod | staticmethod):
            setattr(cls, name, type(member)(translating(member.__func__)))
        elif callable(member):
            setattr(cls, name, translating(member))
    return cls


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
    with contextlib.suppress(FileNotFoundError), translated(path, "removing"):
        os.unlink(path)


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
    try:
        os.mkdir(path)
    except FileExistsError:
        with translated(path, "looking up"):
            mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            raise UnsafeFileError(path, file_kind(mode)) from None
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
