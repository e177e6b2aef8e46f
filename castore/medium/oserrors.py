"""Where an OSError becomes a castore error: every system call of the POSIX medium raises
StoreIOError (DurabilityError on the write path) naming the path, the operation and the
system's reason, and lets only FileNotFoundError through as it is, because callers turn an
absent file into what it means for them (no store, a missing object, no task). `translating`
applies the same rule at the library's public boundary, for what escapes."""

from __future__ import annotations

import errno
import functools
import inspect
import os
import stat
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from castore.errors import CastoreError, StoreIOError, UnsafeFileError

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=type)


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


class translated:  # lower case: used as the function it was, `with translated(...):`
    """Raise `io_error(path, operation, ...)` for an OSError of the block; FileNotFoundError
    goes through unchanged (its caller says what the absence means). A class, not a
    contextlib generator: it wraps most system calls, and costs a third as much (issue 26)."""

    __slots__ = ("operation", "path")

    def __init__(self, path: str, operation: str) -> None:
        self.path, self.operation = path, operation

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, trace: object) -> None:
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            raise io_error(self.path, self.operation, exc) from exc


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
    """`translating` for every public method (and class method) of `cls`, those it inherits
    included (wrapped on `cls`, so its base classes are left as they are)."""
    for name in dir(cls):
        member = inspect.getattr_static(cls, name)
        if name.startswith("_") or isinstance(member, property):
            continue
        if isinstance(member, classmethod | staticmethod):
            setattr(cls, name, type(member)(translating(member.__func__)))
        elif callable(member):
            setattr(cls, name, translating(member))
    return cls
