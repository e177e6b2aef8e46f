"""Errors of the store itself: its directory or S3 prefix, its system calls or requests, its
bytes (castore.errors)."""

from __future__ import annotations

import errno
import os

from castore.errors.usage import CastoreError


class StoreError(CastoreError):
    """A problem with the store as a whole (its directory, or its S3 prefix)."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The path is not a castore store."""

    def __init__(self, path: str, detail: str = "", advice: str = "") -> None:
        self.path = path
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"no castore store at {path}{extra}; "
            + (
                advice
                or f"create one with `castore init {path}` or point --store / $CASTORE_STORE "
                "at an existing store"
            )
        )


class BucketNotFoundError(StoreNotFoundError):
    """The S3 bucket an s3:// store names does not exist at the endpoint asked."""

    def __init__(self, url: str, bucket: str, endpoint: str) -> None:
        self.bucket = bucket
        self.endpoint = endpoint
        super().__init__(
            url,
            f"the bucket {bucket!r} does not exist at {endpoint}",
            "create the bucket, or check its name and the endpoint (--endpoint-url, "
            "$AWS_ENDPOINT_URL_S3; docs/howto/object-storage.md)",
        )


class ReadOnlyStoreError(StoreError):
    """A write was asked of a store opened for reading (a reader never writes)."""

    def __init__(self, url: str, operation: str, key: str) -> None:
        self.path = url
        self.operation = operation
        self.key = key
        super().__init__(
            f"{operation} {key!r} refused: the store {url} was opened read-only, and a reader "
            "never writes; open it with Store.open(...) (not read_only=True) to work on a task"
        )


class StoreExistsError(StoreError, FileExistsError):
    """`init` was asked to create a store where something already is."""

    def __init__(self, path: str, detail: str = "") -> None:
        self.path = path
        extra = f" ({detail})" if detail else ""
        what = "its prefix holds keys already" if on_s3(path) else "is not an empty directory"
        super().__init__(
            f"{path} already exists and {what}{extra}; "
            "choose a new path, or open the existing store instead of initialising it"
        )


def on_s3(path: str) -> bool:
    """True for a place in an S3 store (its URL): its errors speak of keys and requests, not
    of files, directories and fsync."""
    return path.startswith("s3://")


class FormatVersionError(StoreError):
    """Data written by a format version this reader does not understand."""

    def __init__(self, path: str, found: object, supported: tuple[int, ...]) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        super().__init__(
            f"{path} uses castore format version {found!r}; this castore reads "
            f"{', '.join(map(str, supported))}. Upgrade castore to read it; do not edit the store"
        )


# What a person can do about each errno, so that a permission problem never reads as a full
# disk (and the reverse). Everything else is the disk's or the filesystem's health.
_ADVICE = {
    errno.EACCES: "check the permissions: the user running castore needs read and write "
    "access to the store's directories and files (owner, group, mode), or, on S3, its "
    "credentials to the bucket's keys",
    errno.EPERM: "check the permissions and attributes (owner, group, mode, immutable flag) "
    "of the store's directories and files",
    errno.EROFS: "the filesystem is mounted read-only; remount it read-write",
    errno.ENOSPC: "free some space on the store's filesystem",
    errno.EDQUOT: "free some space or raise the disk quota of the user running castore",
    errno.ENOTDIR: "a component of the path is not a directory: check the store path",
    errno.EISDIR: "a directory stands where castore expects a file: inspect it by hand",
    errno.ELOOP: "a symlink stands where castore expects a real file: inspect it by hand",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
    errno.ENFILE: "the system ran out of file descriptors: close other programs or raise it",
    errno.ENAMETOOLONG: "the path is too long for this filesystem: use a shorter store path",
    errno.ETIMEDOUT: "the store's endpoint did not answer: check its address, the network "
    "and that it runs",
    errno.EAGAIN: "the store's endpoint kept failing (5xx, SlowDown): wait for it to recover",
}
_ADVICE[errno.ENOENT] = (
    "it vanished while castore used it: another process or a person removed it; "
    "run `castore fsck` to see what the store lacks"
)
_DISK_ADVICE = "check the disk's health (dmesg) and the filesystem (mount, network)"


def io_advice(code: int | None) -> str:
    """What to do about an OSError with errno `code`: permissions, space, or the disk."""
    return _ADVICE.get(code or 0, _DISK_ADVICE)


class StoreIOError(StoreError, OSError):
    """A system call on a path of the store failed: `operation` on `path`, with `errno`.

    Raised for what the operating system refused or could not do (permissions, I/O errors,
    a path component that is not a directory), read or write; an absent file is reported by
    the error of what was looked for (StoreNotFoundError, ObjectMissingError, ...)."""

    def __init__(
        self, path: str, operation: str, cause: OSError, outcome: str = "", advice: str = ""
    ) -> None:
        self.path = path
        self.operation = operation
        self.reason = _reason(cause)
        done = f"{outcome}; " if outcome else ""
        # `advice`: the medium's own words (an S3 key and endpoint, not a file's owner and mode)
        super().__init__(
            cause.errno,
            f"{operation} {path} failed: {_reason(cause)}; {done}"
            f"{advice or io_advice(cause.errno)}, then retry",
        )


class UnsafeEndpointError(StoreError):
    """An S3 endpoint castore cannot trust with its commit point: it let a second exclusive
    create of one key succeed (two writers could both commit), or the store holds no record
    that it was checked."""

    def __init__(self, url: str, record: str, *, unchecked: bool = False) -> None:
        self.url = url
        self.unchecked = unchecked
        if unchecked:
            what = (
                f"{url}: the store holds no record ({record}) that its endpoint refuses a second "
                "PUT If-None-Match of one key, so castore will not trust it with a commit"
            )
        else:
            what = (
                f"{url}: its endpoint accepted a second PUT If-None-Match of one key ({record} "
                "says so), so two writers could both commit; castore will not use it"
            )
        super().__init__(
            f"{what}. Run `castore doctor {url}`: it checks the endpoint and records what it "
            "finds (use an endpoint that honours conditional writes)"
        )


class DurabilityError(StoreIOError):
    """A write, fsync or publish failed; nothing was published."""

    def __init__(self, path: str, operation: str, cause: OSError) -> None:
        self.path = path
        self.operation = operation
        self.reason = _reason(cause)
        if on_s3(path):
            # No fsync, no temp file: a PUT that was never answered, and is known not to
            # have created the key (it was read back).
            retry = (
                "then retry the call (the key was read back and is absent: nothing was "
                "written, and a new conditional PUT creates it at most once)"
            )
        else:
            retry = (
                "then retry the call (never retry an fsync on the same file: castore starts "
                "over with a new temp file)"
            )
        OSError.__init__(
            self,
            cause.errno,
            f"{operation} failed for {path}: {_reason(cause)}; nothing was published. "
            f"{_capital(io_advice(cause.errno))}, {retry}",
        )


class EndpointAnswer(OSError):
    """What an S3 endpoint answered to a request, or that it did not answer, in those words:
    the cause of that request's StoreIOError, reported as said (the errno alone would read as
    a POSIX failure, "Resource temporarily unavailable")."""


def _reason(cause: OSError) -> str:
    """The operating system's words for `cause` (not the message of a castore error that
    wraps it, which would repeat its own advice): for one of castore's own, the reason it
    gave (an S3 endpoint's answer, not the errno's POSIX words)."""
    if isinstance(cause, EndpointAnswer):
        return str(cause.strerror)
    given = getattr(cause, "reason", None) if isinstance(cause, StoreIOError) else None
    if isinstance(given, str):
        return given
    return os.strerror(cause.errno) if cause.errno else str(cause)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


class CommitUncertainError(DurabilityError):
    """The commit point was taken but could not be made durable: it may or may not survive."""

    def __init__(
        self, path: str, cause: OSError, *, known_written: bool = True, restore: bool = False
    ) -> None:
        self.path = path
        if restore:  # durable, but an object it names could not be stored again
            self.operation = "storing again an object the commit names"
            what = (
                f"the commit {path} was made (its chain slot is durable), but storing again "
                f"an object gc took meanwhile failed ({_reason(cause)}): an object it names "
                "may be missing"
            )
        elif known_written:
            self.operation = "syncing the chain directory after the commit point"
            what = (
                f"the commit {path} was written (its chain slot exists), but syncing the chain "
                f"directory failed ({_reason(cause)}): other workers may already see it, "
                "and a power loss may still undo it"
            )
        else:  # an object store that stopped answering during the commit point
            self.operation = "creating the chain slot (the commit point)"
            what = (
                f"whether the commit {path} was made is unknown: the store stopped answering "
                f"({_reason(cause)})"
            )
        OSError.__init__(
            self,
            cause.errno,
            f"{what}. This run stops; {io_advice(cause.errno)}, then resume the task to see "
            "where it stands",
        )


class IntegrityError(CastoreError):
    """Bytes on disk are not what their name or position says they are."""

    def __init__(self, message: str, path: str = "", object_id: str = "") -> None:
        self.path = path
        self.object_id = object_id
        super().__init__(message)


class ObjectMissingError(IntegrityError, KeyError):
    """A referenced object does not exist."""

    def __init__(self, object_id: str, path: str) -> None:
        super().__init__(
            f"object {object_id} is missing (expected at {path}); run `castore fsck` to see "
            "what else is damaged, and restore the store from a backup",
            path=path,
            object_id=object_id,
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class ObjectCorruptError(IntegrityError):
    """An object whose bytes do not hash to its name, or do not decode."""

    def __init__(self, object_id: str, path: str, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"object {object_id} at {path} is corrupt: {reason}; castore will not use it. "
            "Run `castore fsck --quarantine` and restore the object from a backup",
            path=path,
            object_id=object_id,
        )


class UnsafeFileError(IntegrityError):
    """A symlink, FIFO, device or directory where a regular file belongs."""

    def __init__(self, path: str, found: str, expected: str = "regular file") -> None:
        self.found = found
        super().__init__(
            f"{path} is a {found}, not a {expected}; castore never follows or uses it. "
            "Something outside castore planted it: inspect and remove it by hand",
            path=path,
        )


class OversizedFileError(UnsafeFileError):
    """A file larger than anything castore writes where it lies: never read into memory."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        self.found = f"file of {size} bytes (too large: at most {limit})"
        IntegrityError.__init__(
            self,
            f"{path} is too large: {size} bytes, at most {limit} (no file castore writes there "
            "is larger); castore will not read it. Something outside castore put it there: "
            "inspect it, then move it away (`castore fsck --quarantine` for objects)",
            path=path,
        )
