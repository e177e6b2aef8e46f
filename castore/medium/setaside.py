"""Setting a damaged file aside on POSIX (`PosixMedium.set_aside`, for `fsck --quarantine`).

Every directory is reached through descriptors opened without following symlinks, from the
store root down: a `quarantine/` (or any directory below it, or a fan-out directory) planted
as a symlink is refused, never written through. The file is judged right before it is moved,
and once more after it got its second name, before its own name is removed (a writer may
have stored the object again, intact, since fsck looked): an intact one stays where it is.
Errors are the system's OSError; the caller says what was moved before one.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress

from castore import crashpoints
from castore.errors import UnsafeFileError
from castore.medium.base import Judge
from castore.medium.fsread import entry_of
from castore.medium.oserrors import file_kind

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def set_aside(root: str, key: str, target: str, still_bad: Judge) -> bool:
    """Move `key` to `target` (both relative to `root`); see Medium.set_aside."""
    name, new_name = os.path.basename(key), os.path.basename(target)
    with ExitStack() as stack:
        root_fd = stack.enter_context(_fd(os.open(root, os.O_RDONLY | os.O_DIRECTORY)))
        source_fd = _walk(root, root_fd, key, stack)
        if not _judged(source_fd, name, still_bad):
            return False  # stored again, intact, since fsck looked (or gone)
        target_fd = root_fd
        parts = target.split("/")[:-1]
        for depth in range(len(parts)):
            shown = "/".join(parts[: depth + 1])
            target_fd = stack.enter_context(_subdir(root, target_fd, shown))
        try:
            if stat.S_ISDIR(os.lstat(name, dir_fd=source_fd).st_mode):
                # A directory cannot be linked: renamed, the only rename castore makes (O1).
                os.rename(name, new_name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
                os.fsync(source_fd)
                os.fsync(target_fd)
                return True
            # A second name first, made durable, and only then the first one removed: a
            # rename is two directory changes a power loss may split, losing both names.
            os.link(
                name, new_name, src_dir_fd=source_fd, dst_dir_fd=target_fd, follow_symlinks=False
            )
        except FileNotFoundError:
            return False  # gone since fsck looked; nothing to move
        _sync_second_name(target_fd)
        crashpoints.reach("quarantine.moved")
        moved = os.lstat(new_name, dir_fd=target_fd)
        if not _judged(target_fd, new_name, still_bad):
            # A writer stored it again between the look and the link: the store keeps it.
            os.unlink(new_name, dir_fd=target_fd)
            os.fsync(target_fd)
            return False
        with suppress(FileNotFoundError):
            if os.lstat(name, dir_fd=source_fd).st_ino == moved.st_ino:  # else replaced since
                os.unlink(name, dir_fd=source_fd)
        os.fsync(source_fd)
        return True


def _sync_second_name(dir_fd: int) -> None:
    """Make the new name durable before the file's own name goes (the power-loss self-test
    removes exactly this step, tests/test_power_loss_gc.py)."""
    os.fsync(dir_fd)


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
def _subdir(root: str, parent_fd: int, relpath: str) -> Iterator[int]:
    """Descriptor of directory `relpath` (relative to `root`, its last part in `parent_fd`),
    created if missing and made durable (its parent fsynced, also when it existed: O7)."""
    name = os.path.basename(relpath)
    with suppress(FileExistsError):
        os.mkdir(name, dir_fd=parent_fd)
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


def _judged(dir_fd: int, name: str, still_bad: Judge) -> bool:
    """`still_bad` of the file `name` in `dir_fd` as it is now (False if it vanished)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):
            raise
        try:  # a symlink (or a socket) under the name: judged as what it is, unread
            return still_bad(None, entry_of(name, os.lstat(name, dir_fd=dir_fd)))
        except FileNotFoundError:
            return False
    with _fd(fd):
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return still_bad(None, entry_of(name, info))
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    return still_bad(b"".join(chunks), entry_of(name, info))
