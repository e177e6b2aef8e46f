"""Pure path arithmetic: the only module that knows the names of files in a store.

Nothing here touches the filesystem. Every id is validated before it becomes a path, so a
hostile task id or object id is refused before any system call is made.
"""

from __future__ import annotations

import itertools
import os
import re
import unicodedata
from typing import Any

from castore.errors import InvalidObjectIdError, InvalidTaskIdError
from castore.format import identity

MARKER_NAME = "castore.json"
OBJECTS_DIR = "objects"
TASKS_DIR = "tasks"
QUARANTINE_DIR = "quarantine"
CHAIN_DIR = "chain"
LOCK_NAME = "lock"
LEASE_DIR = "lease"  # an S3 task's lease claims (castore.medium.s3lease)
MARKS_DIR = "marks"  # the sealed mark's generations (FORMAT.md 9.7)
LEGACY_MARK_NAME = "sealed"  # the mark as stores before format 2's revision hold it: read only
TMP_PREFIX = ".tmp-"

SEQ_WIDTH = 16
MAX_SEQ = 10**SEQ_WIDTH - 1
MAX_TASK_ID_BYTES = 200
# Directory names must fit NAME_MAX (255 bytes) on every filesystem castore supports.
MAX_TASK_NAME = 240

_OBJECT_ID = re.compile(r"[0-9a-f]{64}")
# Characters kept as they are in a task directory name. Everything else (including '.',
# upper case and '%') is escaped, so names are injective even on case-insensitive
# filesystems and can never be '.', '..' or hidden.
_SAFE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
_ENCODED_TASK = re.compile(r"(?:[a-z0-9_-]|%[0-9A-F]{2})+")
# An id of safe characters only is its own directory name (most ids: `castore status` maps
# every task both ways, ~25 µs a task by the general path).
_PLAIN_TASK = re.compile(rf"[a-z0-9_-]{{1,{MAX_TASK_ID_BYTES}}}")


def validate_object_id(object_id: object) -> str:
    """Return `object_id` if it is 64 lowercase hex digits, else raise."""
    if not isinstance(object_id, str) or not _OBJECT_ID.fullmatch(object_id):
        raise InvalidObjectIdError(object_id)
    return object_id


# Why each Unicode general category that str.isprintable() rejects is refused in a task id:
# every one lets a printed id show something other than what it is.
_UNPRINTABLE = {
    "Cc": "a control character (it can end or rewrite the printed line)",
    "Cf": "a format character (invisible, or reorders the text around it)",
    "Cs": "a lone surrogate (not valid Unicode, so it has no UTF-8 encoding)",
    "Co": "a private-use character (no agreed glyph)",
    "Cn": f"a code point unassigned in Unicode {unicodedata.unidata_version} (its look is unknown)",
    "Zl": "a line separator (it starts a new line in output)",
    "Zp": "a paragraph separator (it starts a new line in output)",
    "Zs": "a space other than U+0020 (it looks like a plain space)",
}


def _why_unprintable(task_id: str) -> str:
    """Which character of `task_id` (one that is not printable) is its first unprintable one."""
    index, ch = next((i, c) for i, c in enumerate(task_id) if not c.isprintable())
    name = unicodedata.name(ch, "")
    what = _UNPRINTABLE.get(unicodedata.category(ch), "not printable")
    return f"character {index} is U+{ord(ch):04X}{' ' + name if name else ''}, {what}"


def encode_task_id(task_id: object) -> str:
    """Map a task id to its directory name: injective, reversible, never a path escape.

    Valid ids are non-empty, printable (str.isprintable: no control, format, separator other
    than U+0020, surrogate, private-use or unassigned character), in Unicode NFC form, at
    most 200 UTF-8 bytes, with a directory name of at most 240 bytes (docs/FORMAT.md, 8.1).
    A printable id prints as one line that shows every character; an NFC id is the only
    spelling of its look, so one visible name is one task. An id that is not NFC is refused,
    never normalised: normalising would move existing tasks to other directories.
    """
    if type(task_id) is str and _PLAIN_TASK.fullmatch(task_id):
        return task_id
    if not isinstance(task_id, str):
        raise InvalidTaskIdError(task_id, "a task id is a str")
    if not task_id:
        raise InvalidTaskIdError(task_id, "it is empty")
    if not task_id.isprintable():
        raise InvalidTaskIdError(task_id, _why_unprintable(task_id))
    if not unicodedata.is_normalized("NFC", task_id):
        nfc = unicodedata.normalize("NFC", task_id)
        raise InvalidTaskIdError(
            task_id,
            f"it is not in Unicode NFC form ({task_id!a}); use its NFC form {nfc!r} "
            f"({nfc!a}), which looks the same",
        )
    raw = task_id.encode("utf-8")  # cannot fail: a lone surrogate is not printable
    if len(raw) > MAX_TASK_ID_BYTES:
        raise InvalidTaskIdError(task_id, f"it is {len(raw)} UTF-8 bytes long")
    out: list[str] = []
    for byte in raw:
        ch = chr(byte)
        out.append(ch if ch in _SAFE_CHARS else f"%{byte:02X}")
    name = "".join(out)
    if len(name) > MAX_TASK_NAME:
        raise InvalidTaskIdError(
            task_id,
            f"its directory name would be {len(name)} bytes (each character other than a-z, "
            f"0-9, '-' and '_' takes 3), over {MAX_TASK_NAME}",
        )
    return name


def decode_task_id(name: str) -> str:
    """Inverse of `encode_task_id`; raises InvalidTaskIdError for a name it never produces."""
    if _PLAIN_TASK.fullmatch(name):
        return name
    if not _ENCODED_TASK.fullmatch(name):
        raise InvalidTaskIdError(name, "not a task directory name written by castore")
    raw = bytearray()
    i = 0
    while i < len(name):
        if name[i] == "%":
            byte = int(name[i + 1 : i + 3], 16)
            if chr(byte) in _SAFE_CHARS:
                raise InvalidTaskIdError(name, "escapes a character that is never escaped")
            raw.append(byte)
            i += 3
        else:
            raw.append(ord(name[i]))
            i += 1
    try:
        task_id = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidTaskIdError(name, "escapes bytes that are not UTF-8") from None
    if encode_task_id(task_id) != name:
        raise InvalidTaskIdError(name, "not the canonical encoding of any task id")
    return task_id


def display_name(name: str) -> str:
    """`name` (a file name, a relative path, an id) as it may be printed: itself if every
    character is printable, else its repr, which escapes each one that is not. A name planted
    by hand can hold a newline or U+2028; printed raw it would forge a line of output."""
    return name if name.isprintable() else repr(name)


def slot_name(seq: int) -> str:
    """The file name of a chain slot: the sequence number, zero-padded decimal."""
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"sequence number {seq} out of range")
    return f"{seq:0{SEQ_WIDTH}d}"


def parse_slot_name(name: str) -> int | None:
    """The sequence number a slot file name stands for, or None if it is not a slot name."""
    # isascii: str.isdigit alone also accepts digits of other scripts.
    return int(name) if len(name) == 16 and name.isascii() and name.isdigit() else None


def missing_seqs(present: list[int], through: int, shown: int = 10) -> tuple[int, list[int]]:
    """How many of the sequence numbers 0 … `through` are not in `present` (sorted), and the
    first `shown` of them. Counted, never listed: one slot named 9999999999999999 leaves ten
    quadrillion out."""
    missing, expected = 0, 0
    first: list[int] = []
    for seq in present:
        if seq > through:
            break
        if seq > expected:
            missing += seq - expected
            first.extend(range(expected, min(seq, expected + shown - len(first))))
        expected = seq + 1
    if through >= expected:
        missing += through + 1 - expected
        first.extend(range(expected, min(through + 1, expected + shown - len(first))))
    return missing, first


def object_relpath(object_id: str) -> str:
    """Where object `object_id` lives, relative to the store root (its id is not checked)."""
    return f"{OBJECTS_DIR}/{object_id[:2]}/{object_id}"


def is_object_name(name: str) -> bool:
    """True for a well-formed object file name (64 lowercase hex digits)."""
    return _OBJECT_ID.fullmatch(name) is not None


def temp_name() -> str:
    """A temp file name that says who wrote it, so fsck and gc can classify leftovers."""
    pid = os.getpid()
    if _temp_names[0] != pid:  # first use in this process (a fork resets it): a new start
        label = _host_label(identity.host_name())
        _temp_names[:] = [
            pid,
            f"{TMP_PREFIX}{label}-{pid}-",
            itertools.count(identity.random_bits(48)),
        ]
    _, prefix, counter = _temp_names
    return f"{prefix}{next(counter) & _MASK48:012x}"


# [pid, name prefix, counter]: one host look-up and one random draw per process, not per file
# (a commit writes one temp file). The counter's next() is atomic under the GIL.
_temp_names: list[Any] = [None, "", None]
_MASK48 = (1 << 48) - 1
# A forked child starts anew even when its pid is its parent's (pid 1 in a new PID namespace,
# a reused pid): else it would write its parent's next names.
os.register_at_fork(after_in_child=lambda: _temp_names.__setitem__(0, None))


def _host_label(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", host)[:64] or "host"


def parse_temp_name(name: str) -> tuple[str, int] | None:
    """(host, pid) of a temp file name written by `temp_name`, or None."""
    match = re.fullmatch(r"\.tmp-([A-Za-z0-9_-]+)-([0-9]+)-[0-9a-f]{12}", name)
    return (match.group(1), int(match.group(2))) if match else None


MARKER_KEY = MARKER_NAME


def object_key(object_id: str) -> str:
    """The key of object `object_id` (validated first: a hostile id never becomes a key)."""
    validate_object_id(object_id)
    return f"{OBJECTS_DIR}/{object_id[:2]}/{object_id}"


def fanout_key(object_id: str) -> str:
    """The key of the fan-out directory object `object_id` lives in."""
    return f"{OBJECTS_DIR}/{validate_object_id(object_id)[:2]}"


def task_key(task_id: str) -> str:
    """The key of task `task_id`'s directory (its id validated and encoded: FORMAT.md §8)."""
    return f"{TASKS_DIR}/{encode_task_id(task_id)}"


def chain_key(task_id: str) -> str:
    return f"{task_key(task_id)}/{CHAIN_DIR}"


def marks_key(task_id: str) -> str:
    return f"{task_key(task_id)}/{MARKS_DIR}"


def slot_key(task_id: str, seq: int) -> str:
    return f"{chain_key(task_id)}/{slot_name(seq)}"


def lock_key(task_id: str) -> str:
    return f"{task_key(task_id)}/{LOCK_NAME}"


class Layout:
    """Where each file of one store lives."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))

    @property
    def marker(self) -> str:
        return os.path.join(self.root, MARKER_NAME)

    @property
    def objects(self) -> str:
        return os.path.join(self.root, OBJECTS_DIR)

    @property
    def tasks(self) -> str:
        return os.path.join(self.root, TASKS_DIR)

    @property
    def quarantine(self) -> str:
        return os.path.join(self.root, QUARANTINE_DIR)

    def fanout_dir(self, object_id: str) -> str:
        return os.path.join(self.objects, validate_object_id(object_id)[:2])

    def object_path(self, object_id: str) -> str:
        # On the resume path for every snapshot: one validation, one string build.
        validate_object_id(object_id)
        return f"{self.objects}{os.sep}{object_id[:2]}{os.sep}{object_id}"

    def task_dir(self, task_id: str) -> str:
        return os.path.join(self.tasks, encode_task_id(task_id))

    def chain_dir(self, task_id: str) -> str:
        return os.path.join(self.task_dir(task_id), CHAIN_DIR)

    def slot_path(self, task_id: str, seq: int) -> str:
        return os.path.join(self.chain_dir(task_id), slot_name(seq))

    def lock_path(self, task_id: str) -> str:
        return os.path.join(self.task_dir(task_id), LOCK_NAME)

    def marks_dir(self, task_id: str) -> str:
        return os.path.join(self.task_dir(task_id), MARKS_DIR)
