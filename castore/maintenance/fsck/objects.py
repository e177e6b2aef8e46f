"""fsck of one object file: name, bytes, header, encoding and schema. Read-only."""

from __future__ import annotations

import errno
import json
from typing import Any

from castore.chain.trees import Tree
from castore.errors import CastoreError, FormatVersionError, UnsafeFileError
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.fastdecode import decode_canonical, decode_canonical_value, too_deep
from castore.format.layout import is_object_name, object_relpath
from castore.format.model import attrs
from castore.format.plans import validate_plan
from castore.format.records import Plan, Snapshot
from castore.maintenance.fsck.findings import Finding
from castore.maintenance.fsck.packcheck import PACK_PREFIX, PackBroken, check_pack, damaged_code
from castore.medium.base import Entry, Medium

_EXPECTED_LINKS = {"snapshot": 2}  # a snapshot object is also its chain slot


@attrs.frozen
class ObjectReport:
    """What checking one object found."""

    object_id: str
    path: str
    kind: str | None = None  # None when the object is damaged
    findings: tuple[Finding, ...] = ()
    actual: str | None = None  # for object-wrong-name: the id the bytes really have
    missing: bool = False  # no file of that name (it vanished, or was never there)
    # The decoded record, for a caller that needs it (the task pass).
    record: Any = attrs.field(default=None, eq=False, repr=False)

    @property
    def damaged(self) -> bool:
        return self.kind is None


def read_with_entry(medium: Medium, key: str) -> tuple[bytes, Entry]:
    """(bytes, entry) of a regular file, refusing links/FIFOs, re-read once on an I/O error."""
    try:
        return medium.read_entry(key)
    except (FileNotFoundError, UnsafeFileError):
        raise
    except OSError:
        return medium.read_entry(key)


def canonical_bytes(value: Any) -> bytes:
    """The canonical encoding of an already decoded (hence JSON-typed) value."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def check_object(medium: Medium, relpath: str, object_id: str) -> ObjectReport:
    """Check the object file at `relpath` named `object_id`."""
    read = _read_object(medium, relpath, object_id)
    if isinstance(read, ObjectReport):
        return read
    return _confirmed(medium, relpath, object_id, check_data(relpath, object_id, *read))


# Findings a stale read from a shared filesystem's client cache can fake (FORMAT.md 11.5).
_STALE_LOOKING = frozenset({"object-empty", "hash-mismatch", "truncated", "bad-header"})


def _confirmed(medium: Medium, relpath: str, object_id: str, report: ObjectReport) -> ObjectReport:
    """`report`, or, when it calls the bytes damaged in a way a stale read can fake, the
    report of the bytes read again past the client's caches (a new open, pages dropped)."""
    if not report.damaged or not any(f.code in _STALE_LOOKING for f in report.findings):
        return report
    try:
        data, info = medium.read_fresh(relpath), medium.stat(relpath)
    except OSError:
        return report  # what the first read found stands
    return check_data(relpath, object_id, data, info)


def check_named(medium: Medium, object_id: str) -> ObjectReport | None:
    """Check the object a record names, by id (a valid one: it becomes a path); None if
    there is no such object file."""
    relpath = object_relpath(object_id)
    read = _read_object(medium, relpath, object_id)
    if isinstance(read, ObjectReport):
        return None if read.missing else read
    data, info = read
    return _intact_blob(relpath, object_id, data, info) or _confirmed(
        medium, relpath, object_id, check_data(relpath, object_id, data, info)
    )


def _read_object(
    medium: Medium, relpath: str, object_id: str
) -> tuple[bytes, Entry] | ObjectReport:
    """The bytes and status of an object file, or the report of why they cannot be read."""
    try:
        return read_with_entry(medium, relpath)
    except FileNotFoundError:
        found = Finding("read-error", relpath, "the file vanished while fsck ran", object_id)
        return ObjectReport(object_id, relpath, None, (found,), missing=True)
    except UnsafeFileError as exc:
        found = Finding("unsafe-file", relpath, f"a {exc.found} where an object belongs", object_id)
        return ObjectReport(object_id, relpath, None, (found,))
    except OSError as exc:
        message = f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror}"
        return ObjectReport(
            object_id, relpath, None, (Finding("read-error", relpath, message, object_id),)
        )


def _intact_blob(relpath: str, object_id: str, data: bytes, info: Entry) -> ObjectReport | None:
    """The report of a blob with nothing to report, in few calls (most objects chains name
    are result blobs); None when in any doubt: check_data then says what there is."""
    if (info.mode or 0) & 0o222 or (info.links or 1) > 1:  # writable, or hard-linked
        return None
    body = codec.intact_body(data, "blob")
    if body is None or decode_canonical_value(body) is None or hash_bytes(data) != object_id:
        return None
    return ObjectReport(object_id, relpath, "blob")


def check_data(
    relpath: str,
    object_id: str,
    data: bytes,
    info: Entry,
    found: list[Finding] | None = None,
    *,
    hashed: str | None = None,
) -> ObjectReport:
    """Check an object's bytes and file status, however they were read (directly, or through
    the chain slot that is the same inode); `hashed` is their blake3 if already computed."""
    found = found if found is not None else []

    def report(code: str, message: str) -> ObjectReport:
        found.append(Finding(code, relpath, message, object_id))
        return ObjectReport(object_id, relpath, None, tuple(found))

    mode = info.mode or 0  # a medium without modes (S3) has no writable object
    if mode & 0o222:
        found.append(Finding("writable-object", relpath, f"mode {mode & 0o777:o}", object_id))
    if not data:
        return report("object-empty", "the file is empty")
    actual = hashed or hash_bytes(data)
    if actual != object_id and data.startswith(PACK_PREFIX):
        return report(damaged_code(data), f"its bytes hash to {actual}")
    if actual != object_id:
        # A valid object under another's name; check_store turns this into a hash mismatch
        # unless that other object really exists (else it is bit rot that still decodes).
        if _decodes(data):
            wrong = report("object-wrong-name", f"its bytes are a valid object {actual}")
            return attrs.evolve(wrong, actual=actual)
        return report("hash-mismatch", f"its bytes hash to {actual}")
    return _check_content(relpath, object_id, data, info.links or 1, found)


def _decodes(data: bytes) -> bool:
    try:
        codec.decode_value(codec.unframe(data)[1])
    except (ValueError, CastoreError):
        return False
    return True


def _check_content(
    relpath: str, object_id: str, data: bytes, links: int, found: list[Finding]
) -> ObjectReport:
    def report(code: str, message: str) -> ObjectReport:
        found.append(Finding(code, relpath, message, object_id))
        return ObjectReport(object_id, relpath, None, tuple(found))

    try:
        kind, body = codec.unframe(data, relpath)
    except FormatVersionError as exc:
        return report("unknown-version", f"format version {exc.found}")
    except codec.FrameError as exc:
        code = {"empty": "object-empty", "truncated": "truncated"}.get(exc.code, exc.code)
        return report(code, exc.reason)
    if kind == "pack":
        try:
            record: object = check_pack(object_id, data, relpath)
        except PackBroken as exc:
            return report("pack-chain-broken", str(exc))
        return ObjectReport(object_id, relpath, kind, tuple(found), record=record)
    try:
        record = _decode(kind, body)
        if isinstance(record, Plan):
            validate_plan(record)  # a plan's own rules: step order, ids, `after` edges
    except _Damage as damage:
        return report(damage.code, damage.message)
    except (CastoreError, TypeError, ValueError, KeyError) as exc:  # a plan's own rules
        return report("schema-invalid", f"not a valid {kind}: {_first_line(exc)}")
    if links > _EXPECTED_LINKS.get(kind, 1):
        found.append(Finding("hard-linked-object", relpath, f"{links} names", object_id))
    return ObjectReport(object_id, relpath, kind, tuple(found), record=record)


def _decode(kind: str, body: bytes) -> object:
    """The record of a body (None for a blob or raw bytes), by the fast path where it can
    vouch for the body, else by the strict one; _Damage says why the body is not valid."""
    if kind == "raw":
        return None  # any bytes: a raw object's only check is its hash
    record = _decode_record(kind, body)
    if isinstance(record, Tree):
        _check_tree(record, body)
    return record


def _decode_record(kind: str, body: bytes) -> object:
    record_type = _RECORDS.get(kind)
    if record_type is None:
        if decode_canonical_value(body) is not None:
            return None
    else:
        record = decode_canonical(body, record_type)
        if record is not None:
            return record
    return _decode_strict(kind, body)


class _Damage(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _decode_strict(kind: str, body: bytes) -> object:
    """The record (None for a blob) of a body, by the definition in `codec`."""
    try:
        # Plain parsing is enough here: duplicate keys, NaN and non-canonical forms all make
        # the re-encoding below differ from the body (or fail), and ints are bounded.
        value = json.loads(body.decode("utf-8"), parse_int=codec.bounded_int)
        canonical = canonical_bytes(value)
    except UnicodeEncodeError:
        raise _Damage("undecodable", "a string escapes a lone surrogate, not unicode") from None
    except ValueError as exc:
        raise _Damage("undecodable", str(exc)) from None
    except RecursionError:
        raise _Damage("undecodable", "nested too deeply to decode") from None
    if too_deep(value, codec.MAX_DEPTH):
        raise _Damage("undecodable", f"nested more than {codec.MAX_DEPTH} deep (castore's limit)")
    if canonical != body:
        raise _Damage("not-canonical", "re-encoding the body gives different bytes")
    if kind not in _RECORDS:
        return None
    try:
        return codec.from_builtins(value, _RECORDS[kind])
    except Exception as exc:  # noqa: BLE001 - cattrs' grouped errors: all mean "bad record"
        raise _Damage("schema-invalid", f"not a valid {kind}: {_first_line(exc)}") from None


def _check_tree(tree: Tree, body: bytes) -> None:
    """What a Tree record alone does not say: both fields were written, and every ref is an
    object id (castore writes nothing else, so nothing else can be followed)."""
    whole = b'{"data":%s,"refs":%s}' % (canonical_bytes(tree.data), canonical_bytes(tree.refs))
    if whole != body:  # the body is canonical: only a missing field can make it differ
        raise _Damage("schema-invalid", 'not a valid tree: it lacks "data" or "refs"')
    for name, object_id in tree.refs.items():
        if not is_object_name(object_id):
            raise _Damage("schema-invalid", f"not a valid tree: part {name!r} names {object_id!r}")


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]


_RECORDS: dict[str, type] = {"plan": Plan, "snapshot": Snapshot, "tree": Tree}
