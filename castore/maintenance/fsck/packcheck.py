"""fsck of one pack object (format v2): everything a pack's own bytes can say, without the
chain that names it. Its header, sections and last snapshot (packs.parse), then every
snapshot inside: each link, the index, the plans and refs the header lists. Read-only."""

from __future__ import annotations

from castore.chain import packs
from castore.errors import ChainError, ObjectCorruptError
from castore.format.digest import hash_bytes
from castore.format.links import decode_snapshot
from castore.format.model import attrs
from castore.format.records import Snapshot

PACK_PREFIX = b"castore 2 pack "


@attrs.frozen
class PackFacts:
    """A pack that holds together on its own: what the chain checks need of it."""

    pack: packs.Pack = attrs.field(eq=False, repr=False)
    ids: tuple[str, ...]  # snapshot ids, first_seq .. last_seq
    first: Snapshot = attrs.field(eq=False, repr=False)  # the snapshot of first_seq

    def id_at(self, seq: int) -> str | None:
        offset = seq - self.pack.header.first_seq
        return self.ids[offset] if 0 <= offset < len(self.ids) else None


class PackBroken(Exception):
    """A hash-valid pack whose contents do not hold together (pack-chain-broken)."""


def damaged_code(data: bytes) -> str:
    """The finding for pack bytes that do not hash to their name: `pack-truncated` when the
    body is shorter than its header says (a partial copy), else `pack-hash-mismatch`."""
    newline = data.find(b"\n", 0, 64)
    declared = data[len(PACK_PREFIX) : newline]
    if newline > 0 and declared.isdigit() and len(data) - newline - 1 < int(declared):
        return "pack-truncated"
    return "pack-hash-mismatch"


def check_pack(object_id: str, data: bytes, path: str) -> PackFacts:
    """The facts of a pack whose bytes hash to `object_id`; PackBroken says what does not
    hold (a pack castore sealed always holds: its writer checked every link first)."""
    try:
        pack = packs.parse(object_id, data, path)
        snapshots = pack.inflate()
    except ObjectCorruptError as exc:
        raise PackBroken(exc.reason.removeprefix("pack: ")) from None
    header = pack.header
    ids = [hash_bytes(snapshot) for snapshot in snapshots]
    try:
        records = [
            decode_snapshot(header.task, oid, snapshot)
            for oid, snapshot in zip(ids, snapshots, strict=True)
        ]
        # The sealer's own check (parent links, seq, task, history, anchors), without the
        # link into the range: its parent is in the previous pack, which the chain check reads.
        # (packs.py keeps it private; it is the one definition of a sealable range.)
        packs._check_range(header.task, ids, records, header.prev, None)
    except ChainError as exc:
        raise PackBroken(f"its snapshots do not chain: {exc.reason}") from None
    _check_listed(pack, records)
    first = records[0]
    if first.parent != header.first_parent:
        raise PackBroken(
            f"its first snapshot names parent {first.parent}, its header {header.first_parent}"
        )
    return PackFacts(pack, tuple(ids), first)


def _check_listed(pack: packs.Pack, records: list[Snapshot]) -> None:
    """The index, plans and refs of the header are those of the snapshots inside."""
    header = pack.header
    index: dict[str, int] = {}
    for record in records:
        step = packs.outcome_step(record)
        if step is not None:
            index[step] = record.seq  # oldest first: the newest outcome wins
    plans = tuple(sorted({record.plan for record in records}))
    refs = tuple(sorted({ref for record in records for ref in packs.named_refs(record)}))
    if plans != header.plans:
        raise PackBroken(
            f"its header lists plans {list(header.plans)}, its snapshots {list(plans)}"
        )
    if refs != header.refs:
        raise PackBroken(f"its header lists refs {list(header.refs)}, its snapshots {list(refs)}")
    try:
        recorded = pack.index()
    except ObjectCorruptError as exc:
        raise PackBroken(exc.reason.removeprefix("pack: ")) from None
    if recorded != index:
        raise PackBroken("its index disagrees with the outcomes of its snapshots")
