"""Packs (format v2, kind `pack`): a sealed range of one task's chain in one object.

Body, in this order (docs/FORMAT.md 7.5): a header line (canonical JSON), the framed snapshot
of `last_seq` verbatim, the index (canonical JSON: each step's newest outcome in the range),
and a zlib stream of the framed snapshots `first_seq .. last_seq - 1`. A pack is trusted only
because a verified snapshot's `sealed` anchor (or a trusted pack's `prev`) names its id;
`build` checks every link inside before the bytes exist, so a pack castore wrote chains.

`parse` checks everything a reader can check without inflating the data; every way a pack
can be malformed is an ObjectCorruptError naming the pack and what is wrong (the verifier
turns it into a ChainError of the task).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

from castore.errors import ChainError, ObjectCorruptError
from castore.format import codec, limits
from castore.format.digest import hash_bytes
from castore.format.effects import ChainClock
from castore.format.layout import validate_object_id
from castore.format.links import check_anchor, check_history, check_link, decode_snapshot
from castore.format.model import attrs
from castore.format.records import EffectState, Snapshot, TransitionKind

KIND = "pack"
VERSION = 2  # packs exist only in format v2: a v1 reader refuses them by their header
MAX_SNAPSHOTS = 4096  # the most snapshots one pack holds (SEAL_EVERY)
COMPRESSION = "zlib"
_LEVEL = 6
# A framed snapshot inside the data: its header gives its length (docs/FORMAT.md 6.1).
_SNAPSHOT_HEADER = re.compile(rb"castore ([12]) snapshot (0|[1-9][0-9]{0,9})\n")


@attrs.frozen
class PackHeader:
    """The first line of a pack (field meanings: docs/FORMAT.md 7.5)."""

    task: str
    first_seq: int
    last_seq: int
    prev: str | None
    first_parent: str | None
    last_id: str
    last_size: int
    plans: tuple[str, ...]
    refs: tuple[str, ...]
    clock: ChainClock
    index_size: int
    data_size: int
    raw_size: int
    compression: str

    @property
    def count(self) -> int:
        return self.last_seq - self.first_seq + 1


def outcome_step(snapshot: Snapshot) -> str | None:
    """The step whose outcome `snapshot` records (a STEP result or a CONFIRMED receipt)."""
    transition = snapshot.transition
    if transition.step is None:
        return None
    if transition.kind is TransitionKind.STEP or transition.effect_to is EffectState.CONFIRMED:
        return transition.step
    return None


def named_refs(snapshot: Snapshot) -> list[str]:
    """The objects a snapshot names besides its parent, its plan and packs (its result)."""
    ref = snapshot.transition.result_ref
    return [ref] if ref is not None else []


def build(
    snapshots: Sequence[bytes],
    *,
    prev: str | None,
    parent: bytes | None,
    encoded: Sequence[Snapshot | None] = (),
) -> bytes:
    """The framed bytes of the pack holding `snapshots` (framed, oldest first, at most
    MAX_SNAPSHOTS). `prev` is the pack holding the first one's parent and `parent` that
    parent's framed bytes (both None when the first is sequence 0). Every link is checked as
    the verifier checks a tail (ChainError if one does not hold): only a chain is sealed.

    `encoded`, if given, runs beside `snapshots`: the record a snapshot's bytes were encoded
    from in this process (the writer's own commits), or None (bytes read back: decoded here).
    A record stands for its bytes in the checks, which compare ids, numbers, enums and
    strings only (a result, the one free-form field, is never compared)."""
    if not 1 <= len(snapshots) <= MAX_SNAPSHOTS:
        raise ValueError(f"a pack holds 1 to {MAX_SNAPSHOTS} snapshots, not {len(snapshots)}")
    if encoded and len(encoded) != len(snapshots):
        raise ValueError(f"{len(encoded)} records given for {len(snapshots)} snapshots")
    ids = [hash_bytes(data) for data in snapshots]
    given = list(encoded or (None,) * len(snapshots))
    first = given[0] or decode_snapshot("?", ids[0], snapshots[0])
    given[0], task = first, first.task
    records = [
        record or decode_snapshot(task, oid, data)
        for oid, data, record in zip(ids, snapshots, given, strict=True)
    ]
    first_seq = records[0].seq
    if (first_seq == 0) != (prev is None) or (prev is None) != (parent is None):
        raise ValueError("prev and parent are given exactly when the first seq is not 0")
    # The parent is decoded once: its link into the range and its time both count.
    linked_parent: tuple[str, Snapshot] | None = None
    if parent is not None:
        parent_id = hash_bytes(parent)
        linked_parent = (parent_id, decode_snapshot(task, parent_id, parent))
    _check_range(task, ids, records, prev, linked_parent)
    clock, index = ChainClock(), {}
    for position in range(len(records) - 1, -1, -1):  # newest first, as the verifier walks
        record = records[position]
        clock = clock.seen(record.seq, record.time_ms)
        if position + 1 < len(records):
            above = records[position + 1]
            clock = clock.linked(record.time_ms, above.seq, above.time_ms)
        step = outcome_step(record)
        if step is not None and step not in index:
            index[step] = record.seq
    if linked_parent is not None:  # the link into the range counts in its clock (V2)
        clock = clock.linked(linked_parent[1].time_ms, records[0].seq, records[0].time_ms)
    raw = b"".join(snapshots[:-1])
    data = zlib.compress(raw, _LEVEL)
    index_bytes = codec.encode_value({"steps": index})
    header = PackHeader(
        task=task,
        first_seq=first_seq,
        last_seq=records[-1].seq,
        prev=prev,
        first_parent=None if linked_parent is None else linked_parent[0],
        last_id=ids[-1],
        last_size=len(snapshots[-1]),
        plans=tuple(sorted({record.plan for record in records})),
        refs=tuple(sorted({ref for record in records for ref in named_refs(record)})),
        clock=clock,
        index_size=len(index_bytes),
        data_size=len(data),
        raw_size=len(raw),
        compression=COMPRESSION,
    )
    line = codec.encode_value(codec.to_builtins(header)) + b"\n"
    return codec.frame(KIND, line + snapshots[-1] + index_bytes + data, VERSION)


def _check_range(
    task: str,
    ids: list[str],
    records: list[Snapshot],
    prev: str | None,
    parent: tuple[str, Snapshot] | None,
) -> None:
    """Every link of the range, the one into it from `parent` (its id and record) included,
    as a tail is checked."""
    first_seq = records[0].seq
    older = parent
    for position, (oid, record) in enumerate(zip(ids, records, strict=True)):
        seq = first_seq + position
        check_link(task, oid, record, seq, None)
        if older is not None:
            if record.parent != older[0]:
                raise ChainError(
                    task,
                    f"snapshot {oid} names parent {record.parent}, not {older[0]}",
                    object_id=oid,
                    seq=seq,
                )
            check_link(task, older[0], older[1], seq - 1, record)
            check_history(task, older[1], record, oid)
            check_anchor(task, older[1], record, oid)
        sealed = record.sealed
        # An anchor inside the range names a pack that ends before it: prev, or an older one.
        if sealed is not None and (
            sealed.through >= first_seq or (sealed.through == first_seq - 1 and sealed.pack != prev)
        ):
            raise ChainError(
                task,
                f"snapshot {oid} names pack {sealed.pack} through {sealed.through}; the range "
                f"being sealed starts at {first_seq} after pack {prev}",
                object_id=oid,
                seq=seq,
            )
        older = (oid, record)


class Pack:
    """A parsed pack: its header and last snapshot checked; index and data read on demand."""

    def __init__(self, pack_id: str, header: PackHeader, body: bytes, path: str) -> None:
        self.id = pack_id
        self.header = header
        self.path = path
        self._body = body
        start = len(body) - header.last_size - header.index_size - header.data_size
        self._last = (start, start + header.last_size)
        self._index_end = self._last[1] + header.index_size
        self.last = decode_snapshot(header.task, header.last_id, self.last_bytes())
        self._index: dict[str, int] | None = None

    def _corrupt(self, reason: str) -> ObjectCorruptError:
        return ObjectCorruptError(self.id, self.path, f"pack: {reason}")

    def last_bytes(self) -> bytes:
        """The framed snapshot of `last_seq`, verbatim (section 2)."""
        return self._body[self._last[0] : self._last[1]]

    def index(self) -> dict[str, int]:
        """step id -> sequence number of its newest outcome within the range (section 3)."""
        if self._index is None:
            self._index = self._read_index()
        return self._index

    def _read_index(self) -> dict[str, int]:
        raw = self._body[self._last[1] : self._index_end]
        try:
            value = codec.decode_value(raw)
        except ValueError as exc:
            raise self._corrupt(f"its index does not decode: {exc}") from None
        steps = value.get("steps") if isinstance(value, dict) and len(value) == 1 else None
        if not isinstance(steps, dict):
            raise self._corrupt('its index is not {"steps": {step: seq}}')
        low, high = self.header.first_seq, self.header.last_seq
        for step, seq in steps.items():
            if type(seq) is not int or not low <= seq <= high:
                raise self._corrupt(
                    f"its index puts step {step!r} at {seq!r}, outside {low}..{high}"
                )
        return steps

    def inflate(self) -> list[bytes]:
        """Every framed snapshot of the range, oldest first (the data, then section 2)."""
        header = self.header
        raw = self._inflate(header.raw_size)
        found, offset = [], 0
        while offset < len(raw):
            match = _SNAPSHOT_HEADER.match(raw, offset)
            end = match.end() + int(match[2]) if match else -1
            if match is None or end > len(raw):
                raise self._corrupt(f"its data holds no whole snapshot at byte {offset}")
            found.append(raw[offset:end])
            offset = end
        if len(found) != header.count - 1:
            raise self._corrupt(f"its data holds {len(found)} snapshots, not {header.count - 1}")
        found.append(self.last_bytes())
        return found

    def first_bytes(self) -> bytes:
        """The framed snapshot of `first_seq`, inflating no more of the data than it takes."""
        if self.header.count == 1:
            return self.last_bytes()
        inflater = zlib.decompressobj()
        data = self._body[self._index_end :]
        try:
            head = inflater.decompress(data, limits.MAX_HEADER)
            match = _SNAPSHOT_HEADER.match(head)
            if match is None:
                raise self._corrupt("its data does not start with a snapshot")
            size = match.end() + int(match[2])
            first = head + inflater.decompress(inflater.unconsumed_tail, size - len(head))
        except zlib.error as exc:
            raise self._corrupt(f"its data does not inflate: {exc}") from None
        if len(first) != size:
            raise self._corrupt("its data ends inside its first snapshot")
        return first

    def _inflate(self, size: int) -> bytes:
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(self._body[self._index_end :], size + 1)
        except zlib.error as exc:
            raise self._corrupt(f"its data does not inflate: {exc}") from None
        if len(raw) != size or not inflater.eof or inflater.unused_data:
            raise self._corrupt(f"its data inflates to other than {size} bytes")
        return raw


def parse(pack_id: str, data: bytes, path: str = "") -> Pack:
    """A pack from its framed bytes (already hash-checked by the caller): header, sizes, ids
    and its last snapshot checked; ObjectCorruptError naming what is wrong otherwise."""
    where = path or pack_id

    def corrupt(reason: str) -> ObjectCorruptError:
        return ObjectCorruptError(pack_id, where, f"pack: {reason}")

    try:
        kind, body = codec.unframe(data, where)
    except codec.FrameError as exc:
        raise corrupt(exc.reason) from None
    if kind != KIND or not data.startswith(b"castore %d " % VERSION):
        raise corrupt(f"a version-{data[8:9].decode('ascii', 'replace')} {kind}, not a pack")
    newline = body.find(b"\n")
    if newline < 0:
        raise corrupt("no header line")
    header = _header(body[:newline], corrupt)
    expected = newline + 1 + header.last_size + header.index_size + header.data_size
    if expected != len(body):
        raise corrupt(f"its sections add up to {expected} bytes, its body has {len(body)}")
    if hash_bytes(body[newline + 1 : newline + 1 + header.last_size]) != header.last_id:
        raise corrupt(f"its last snapshot does not hash to last_id {header.last_id}")
    try:
        pack = Pack(pack_id, header, body, where)
    except ChainError as exc:
        raise corrupt(f"its last snapshot: {exc.reason}") from None
    last = pack.last
    if last.task != header.task or last.seq != header.last_seq:
        raise corrupt(
            f"its last snapshot is seq {last.seq} of task {last.task!r}, the header says "
            f"seq {header.last_seq} of {header.task!r}"
        )
    if last.plan not in header.plans:
        raise corrupt(f"its last snapshot names plan {last.plan}, not in its plans")
    return pack


def _header(line: bytes, corrupt: Any) -> PackHeader:
    try:
        value = codec.decode_value(line)
        header = codec.from_builtins(value, PackHeader)
    except ValueError as exc:  # SchemaError is a ValueError
        raise corrupt(f"its header is not a pack header: {exc}") from None
    if codec.encode_value(codec.to_builtins(header)) != line:
        raise corrupt("its header is not canonical JSON")
    for name in ("prev", "first_parent", "last_id"):
        value = getattr(header, name)
        if value is not None and not _is_id(value):
            raise corrupt(f"its {name} {value!r} is not an object id")
    for name in ("plans", "refs"):
        ids = getattr(header, name)
        if not all(map(_is_id, ids)) or list(ids) != sorted(set(ids)):
            raise corrupt(f"its {name} are not sorted, unique object ids")
    if not header.plans:
        raise corrupt("it names no plan")
    first, last = header.first_seq, header.last_seq
    if not 0 <= first <= last or last - first >= MAX_SNAPSHOTS:
        raise corrupt(f"its range {first}..{last} is not 1 to {MAX_SNAPSHOTS} sequence numbers")
    if (header.prev is None) != (first == 0) or (header.first_parent is None) != (first == 0):
        raise corrupt("prev and first_parent are null exactly when first_seq is 0; they are not")
    sizes = (header.last_size, header.index_size, header.data_size, header.raw_size)
    if min(sizes) < 0 or header.raw_size > limits.MAX_BODY_SIZE:
        raise corrupt(f"its section sizes {sizes} are out of range")
    if header.compression != COMPRESSION:
        raise corrupt(f"compression {header.compression!r} is not {COMPRESSION!r}")
    return header


def _is_id(value: object) -> bool:
    try:
        validate_object_id(value)
    except ValueError:
        return False
    return True
