"""Packs (format v2): what `build` writes, what `parse` accepts, and every malformed pack."""

from __future__ import annotations

import itertools
import json
import zlib
from collections.abc import Callable
from typing import Any

import pytest

import castore
from castore.chain import packs
from castore.errors import ChainError, ObjectCorruptError
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.links import decode_snapshot
from castore.format.records import Plan, Snapshot


def chain_bytes(store: castore.Store, steps: int, task: str = "t") -> list[bytes]:
    """The framed snapshots 0..steps of a task whose step 2 stores its result in a blob (an
    unfinished task, so the run's finish seal leaves every slot in place)."""
    plan = Plan.build("p", *(f"s{i}" for i in range(steps + 1)))
    with store.start(task, plan) as run:
        for step in run.pending():
            if step == f"s{steps}":
                break
            result = store.put_blob({"big": step}) if step == "s2" else step
            run.commit_step(step, result)
    slots = store._slots(task)
    return [slots.read(seq) for seq in range(steps + 1)]


@pytest.fixture
def snapshots(store: castore.Store) -> list[bytes]:
    return chain_bytes(store, 12)


def test_a_pack_holds_its_range_and_says_what_it_names(
    store: castore.Store, snapshots: list[bytes]
) -> None:
    """build() of seq 0..6: the header names the range, last id, plans, blobs; the data
    inflates back to the same bytes; the index has each step's outcome."""
    data = packs.build(snapshots[:7], prev=None, parent=None)
    pack = packs.parse(hash_bytes(data), data)
    header = pack.header
    chain = store.verify("t")
    assert (0, 6, None, None) == (
        header.first_seq,
        header.last_seq,
        header.prev,
        header.first_parent,
    )
    assert hash_bytes(snapshots[6]) == header.last_id
    assert (chain.plan_id,) == header.plans
    assert (chain.outcomes["s2"].result_ref,) == header.refs
    assert snapshots[:7] == pack.inflate()
    assert snapshots[0] == pack.first_bytes()
    assert {f"s{i}": i + 1 for i in range(6)} == pack.index()
    assert 6 == pack.last.seq
    assert data.startswith(b"castore 2 pack ")


def test_a_pack_clock_is_what_the_walk_sees(store: castore.Store) -> None:
    """The clock of a pack from seq 0 to HEAD equals the clock the full walk computes."""
    clock = itertools.cycle([5000, 100, 200, 150, 9000, 300, 50])  # writers disagreeing
    store._clock = lambda: next(clock)
    snapshots = chain_bytes(store, 5)
    data = packs.build(snapshots, prev=None, parent=None)
    assert store.verify("t").clock == packs.parse(hash_bytes(data), data).header.clock


def test_a_later_pack_names_its_prev_and_the_parent_of_its_first(
    snapshots: list[bytes],
) -> None:
    """The second pack links to the first by prev, and to its last snapshot by first_parent."""
    first = packs.build(snapshots[:5], prev=None, parent=None)
    second = packs.build(snapshots[5:], prev=hash_bytes(first), parent=snapshots[4])
    pack = packs.parse(hash_bytes(second), second)
    assert (5, 12) == (pack.header.first_seq, pack.header.last_seq)
    assert (hash_bytes(first), hash_bytes(snapshots[4])) == (
        pack.header.prev,
        pack.header.first_parent,
    )
    assert snapshots[5] == pack.first_bytes()
    assert snapshots[5:] == pack.inflate()


def test_a_one_snapshot_pack(snapshots: list[bytes]) -> None:
    """A pack of one snapshot has empty data and still parses and inflates."""
    data = packs.build(snapshots[3:4], prev="a" * 64, parent=snapshots[2])
    pack = packs.parse(hash_bytes(data), data)
    assert [snapshots[3]] == pack.inflate()
    assert snapshots[3] == pack.first_bytes()


@pytest.mark.parametrize(
    ("cut", "match"),
    [
        (lambda s: s[:3] + s[4:7], "has sequence 4, expected 3"),  # a gap after seq 2
        (lambda s: [s[0], s[2], s[1]], "has sequence 2, expected 1"),  # out of order
        (lambda s: [s[0], s[1], s[1]], "has sequence 1, expected 2"),  # one twice
    ],
)
def test_build_refuses_snapshots_that_do_not_chain(
    snapshots: list[bytes], cut: Callable[[list[bytes]], list[bytes]], match: str
) -> None:
    """Only a chain is sealed: a gap, a reordering, a repeat is a ChainError before any
    byte of the pack exists."""
    with pytest.raises(ChainError, match=match):
        packs.build(cut(snapshots), prev=None, parent=None)


def test_build_refuses_a_parent_that_is_not_the_first_ones(snapshots: list[bytes]) -> None:
    """The link into the range is checked too: a wrong parent is refused."""
    with pytest.raises(ChainError, match="names parent"):
        packs.build(snapshots[5:8], prev="a" * 64, parent=snapshots[3])


def test_build_refuses_a_range_it_cannot_hold(snapshots: list[bytes]) -> None:
    """No snapshots, or a seq-0 range given a prev, is refused."""
    with pytest.raises(ValueError, match="1 to 4096"):
        packs.build([], prev=None, parent=None)
    with pytest.raises(ValueError, match="exactly when"):
        packs.build(snapshots[:2], prev="a" * 64, parent=snapshots[0])


def sections(data: bytes) -> tuple[dict[str, Any], bytes, bytes, bytes]:
    """(header, last, index, data) of a framed pack."""
    _, body = codec.unframe(data)
    line, rest = body.split(b"\n", 1)
    header = json.loads(line)
    last = rest[: header["last_size"]]
    index = rest[header["last_size"] : header["last_size"] + header["index_size"]]
    return header, last, index, rest[header["last_size"] + header["index_size"] :]


def assemble(header: dict[str, Any], last: bytes, index: bytes, data: bytes) -> bytes:
    line = codec.encode_value(header) + b"\n"
    return codec.frame("pack", line + last + index + data, 2)


def damaged(snapshots: list[bytes], change: Callable[[dict[str, Any], list[bytes]], None]) -> bytes:
    """A pack of seq 0..6 rebuilt after `change` edited its header or [last, index, data]."""
    header, *parts = sections(packs.build(snapshots[:7], prev=None, parent=None))
    change(header, parts)
    last, index, data = parts
    header.update(last_size=len(last), index_size=len(index), data_size=len(data))
    return assemble(header, last, index, data)


def _set(**fields: Any) -> Callable[[dict[str, Any], list[bytes]], None]:
    return lambda header, parts: header.update(fields)


def _part(
    position: int, value: Callable[[bytes], bytes]
) -> Callable[[dict[str, Any], list[bytes]], None]:
    def change(header: dict[str, Any], parts: list[bytes]) -> None:
        parts[position] = value(parts[position])

    return change


def read_all(data: bytes) -> None:
    """Parse a pack and read its lazy parts too."""
    pack = packs.parse(hash_bytes(data), data)
    pack.index()
    pack.inflate()


MALFORMED = {
    "wrong-task": (_set(task="other"), "says seq 6 of 'other'"),
    "prev-at-zero": (_set(prev="a" * 64), "null exactly when"),
    "bad-id": (_set(last_id="xyz"), "not an object id"),
    "plans-unsorted": (_set(plans=["b" * 64, "a" * 64]), "sorted, unique"),
    "no-plans": (_set(plans=[]), "no plan"),
    "range-backwards": (_set(first_seq=7), "range"),
    "range-too-long": (_set(last_seq=5000), "range"),
    "compression": (_set(compression="zstd"), "compression"),
    "extra-field": (_set(color="red"), "not a pack header"),
    "last-swapped": (_part(0, lambda _: b"castore 1 blob 2\n[]"), "does not hash"),
    "index-out-of-range": (_part(1, lambda _: b'{"steps":{"s0":99}}'), "outside"),
    "index-not-json": (_part(1, lambda _: b"{"), "index does not decode"),
    "data-not-zlib": (_part(2, lambda _: b"garbage"), "inflate"),
    "data-short": (_part(2, lambda d: zlib.compress(zlib.decompress(d)[:-5])), "inflate"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_every_malformed_pack_is_refused_with_its_reason(snapshots: list[bytes], name: str) -> None:
    """Each damage a pack can carry is an ObjectCorruptError saying what is wrong, met by
    parse or, for the parts read lazily, by index() / inflate()."""
    change, match = MALFORMED[name]
    data = damaged(snapshots, change)
    with pytest.raises(ObjectCorruptError, match=match):
        read_all(data)


def test_a_truncated_or_mislabelled_pack_is_refused(snapshots: list[bytes]) -> None:
    """A pack cut short, framed as v1, or another kind altogether is refused by parse."""
    data = packs.build(snapshots[:7], prev=None, parent=None)
    for bad, match in [
        (data[:-10], "truncated"),
        (data.replace(b"castore 2 pack", b"castore 1 pack", 1), "version 1 header"),
        (snapshots[0], "not a pack"),
        (codec.frame("pack", b"no newline", 2), "no header line"),
    ]:
        with pytest.raises(ObjectCorruptError, match=match):
            packs.parse(hash_bytes(bad), bad)


def test_a_noncanonical_header_is_refused(snapshots: list[bytes]) -> None:
    """Same header, other bytes (spaces): refused, so one range has one pack id."""
    header, last, index, data = sections(packs.build(snapshots[:7], prev=None, parent=None))
    line = json.dumps(header).encode() + b"\n"
    bad = codec.frame("pack", line + last + index + data, 2)
    with pytest.raises(ObjectCorruptError, match="canonical"):
        packs.parse(hash_bytes(bad), bad)


def test_a_pack_built_from_records_is_the_pack_built_from_their_bytes(
    snapshots: list[bytes],
) -> None:
    """The writer hands the sealer the records it encoded: the pack is the same bytes as one
    built by decoding, whether every record, some or none is given."""
    records = [decode_snapshot("t", hash_bytes(data), data) for data in snapshots]
    first = packs.build(snapshots[:7], prev=None, parent=None)
    assert first == packs.build(snapshots[:7], prev=None, parent=None, encoded=records[:7])
    second = packs.build(snapshots[7:], prev=hash_bytes(first), parent=snapshots[6])
    some: list[Snapshot | None] = [None, None, *records[9:]]
    assert second == packs.build(
        snapshots[7:], prev=hash_bytes(first), parent=snapshots[6], encoded=some
    )


def test_build_checks_the_links_of_records_as_of_bytes(snapshots: list[bytes]) -> None:
    """A record stands for its bytes in every check: records out of order are refused as
    bytes out of order are, and records must run beside the bytes one for one."""
    records = [decode_snapshot("t", hash_bytes(data), data) for data in snapshots]
    with pytest.raises(ChainError, match="has sequence 2, expected 1"):
        packs.build(snapshots[:3], prev=None, parent=None, encoded=[records[0], *records[2:0:-1]])
    with pytest.raises(ValueError, match="2 records given for 3 snapshots"):
        packs.build(snapshots[:3], prev=None, parent=None, encoded=records[:2])
