"""fsck of a task's sealed history (format v2): its sealed mark, the packs its HEAD's anchor
names (newest to oldest through `prev`), and how they join the slots that are still there.
Read-only; each pack's own contents are checked as an object (packcheck.py)."""

from __future__ import annotations

from typing import Protocol

from castore.chain import sealmark
from castore.chain.references import FORGET
from castore.chain.sealmark import Mark
from castore.errors import CastoreError, ChainError
from castore.format.digest import hash_bytes
from castore.format.layout import (
    CHAIN_DIR,
    is_object_name,
    object_relpath,
    parse_slot_name,
    parse_temp_name,
    slot_name,
)
from castore.format.links import check_anchor, check_history, check_link, decode_snapshot
from castore.format.model import attrs
from castore.format.records import Sealed, Snapshot
from castore.maintenance.fsck.named import NamedObjects
from castore.maintenance.fsck.packcheck import PackFacts
from castore.medium.base import Medium


class TaskCheck(Protocol):
    """What the sealed-history checks need of the task being checked (tasks.TaskCheck)."""

    medium: Medium
    rel: str
    task_id: str
    named: NamedObjects
    refs: set[str]

    def add(self, code: str, relpath: str, message: str, object_id: str | None = None) -> None: ...

    def slot_relpath(self, seq: int) -> str: ...


def read_mark(medium: Medium, task_id: str, key: str) -> Mark | None:
    """The mark file `key` (None if there is none), as every reader reads it; ValueError
    naming what is wrong (a mark that cannot be read is never ignored: every reader fails
    closed on it)."""
    try:
        return sealmark.read_file(medium, task_id, key)
    except ChainError as exc:
        raise ValueError(exc.reason) from None
    except (OSError, CastoreError) as exc:
        raise ValueError(f"cannot be read: {exc}") from None


@attrs.define
class MarkGenerations:
    """What fsck read of a task's `marks/` directory: the newest readable generation and
    what is wrong with the rest (relpath, code, message)."""

    newest: tuple[str, Mark] | None = None  # (relpath, mark)
    damaged: bool = False
    problems: list[tuple[str, str, str]] = attrs.field(factory=list)


def check_generations(medium: Medium, task_id: str, rel: str) -> MarkGenerations:
    """Each generation of the mark (the directory `rel`): a canonical mark file, numbered
    0, 1, … without a gap, each letting more be pruned than the one before (marks only move
    forward)."""
    found = MarkGenerations()
    numbers: list[int] = []
    for name in sorted(medium.names(rel)):
        number = parse_slot_name(name)
        if number is not None:
            numbers.append(number)
        elif parse_temp_name(name):
            found.problems.append((f"{rel}/{name}", "temp-file", ""))
        else:
            found.problems.append((f"{rel}/{name}", "stray-file", "not a mark generation"))
    previous: Mark | None = None
    for expected, number in enumerate(numbers):
        path = f"{rel}/{slot_name(number)}"
        if number != expected:
            found.damaged = True
            message = f"generation {expected} is missing (the mark's history has a gap)"
            found.problems.append((path, "sealed-mark-damaged", message))
            return found
        try:
            mark = read_mark(medium, task_id, path)
        except ValueError as exc:
            found.damaged = True
            found.problems.append((path, "sealed-mark-damaged", str(exc)))
            return found
        assert mark is not None  # noqa: S101 - listed a moment ago; a removal raises above
        if previous is not None and mark.through <= previous.through:
            found.damaged = True
            message = (
                f"says through {mark.through}, not past generation {number - 1}'s "
                f"{previous.through}: a mark only moves forward"
            )
            found.problems.append((path, "sealed-mark-damaged", message))
            return found
        previous, found.newest = mark, (path, mark)
    return found


def check_sealed(
    check: TaskCheck,
    head: tuple[str, Snapshot],
    mark: tuple[str, Mark] | None,
    slot_ids: dict[int, str],
) -> None:
    """The mark against HEAD's anchor, then each pack of the anchor's chain: of this task,
    holding the range the chain needs, joining what follows it, agreeing with the slots
    still present in its range; the objects the packs name are referred to and checked."""
    snapshot = head[1]
    if snapshot.transition.kind == FORGET or (mark is not None and mark[1].pack is None):
        return  # a forgotten task: its packs age out with what only it named
    anchor = snapshot.sealed
    ends = _check_packs(check, head, anchor, slot_ids) if anchor is not None else {}
    if mark is not None:
        _check_mark(check, mark[0], mark[1], anchor, ends)


def _check_packs(
    check: TaskCheck, head: tuple[str, Snapshot], anchor: Sealed, slot_ids: dict[int, str]
) -> dict[int, str]:
    """Each pack of the anchor's chain, newest first (see check_sealed); the packs that held
    together, by the last seq each holds."""
    head_id, snapshot = head
    ends: dict[int, str] = {}
    child = _tail_first(check, anchor.through + 1)
    child_at = check.slot_relpath(anchor.through + 1)
    child_object = child[0] if child is not None else None
    pack_id: str | None = anchor.pack
    expected_last, seen = anchor.through, set()
    while pack_id is not None and pack_id not in seen:
        seen.add(pack_id)
        check.refs.add(pack_id)
        facts = _pack_facts(check, pack_id)
        if facts is None:
            if not seen - {pack_id}:  # the anchor's own pack: the slot naming it says so
                message = (
                    f"names pack {pack_id} (sealed through {anchor.through}), which is "
                    "missing or damaged"
                )
                check.add("missing-object", check.slot_relpath(snapshot.seq), message, head_id)
            else:
                message = f"its prev {pack_id} is missing or damaged"
                check.add("pack-chain-broken", child_at, message, child_object)
            return ends
        pack_rel = object_relpath(pack_id)
        header = facts.pack.header
        if header.task != check.task_id:
            check.add("pack-wrong-task", pack_rel, f"a pack of task {header.task!r}", pack_id)
            return ends
        if header.last_seq != expected_last:
            message = (
                f"holds {header.first_seq}..{header.last_seq}; the chain needs it to end at "
                f"{expected_last}"
            )
            check.add("pack-chain-broken", pack_rel, message, pack_id)
            return ends
        ends[header.last_seq] = pack_id
        if child is not None:
            _check_join(check, facts, child, child_at)
        for seq in range(header.first_seq, header.last_seq + 1):
            present = slot_ids.get(seq)
            if present is not None and present != facts.id_at(seq):
                message = f"holds {present}; pack {pack_id} holds {facts.id_at(seq)} there"
                check.add("pack-slot-disagree", check.slot_relpath(seq), message, present)
        _refer(check, facts, pack_rel, pack_id)
        child, child_at, child_object = (facts.ids[0], facts.first), pack_rel, pack_id
        expected_last, pack_id = header.first_seq - 1, header.prev
    if pack_id is not None:  # a prev already seen: packs that name each other
        message = f"its prev {pack_id} is a newer pack of the chain"
        check.add("pack-chain-broken", child_at, message, child_object)
    return ends


def _check_mark(
    check: TaskCheck, mark_rel: str, mark: Mark, anchor: Sealed | None, ends: dict[int, str]
) -> None:
    """The mark says what a durable commit (HEAD's anchor) says, or less (stale: then what
    an older anchor said, a pack of the chain that ends at its `through`)."""
    if anchor is None:
        if mark.pack is not None:
            message = f"names pack {mark.pack} through {mark.through}; HEAD carries no seal"
            check.add("sealed-mark-damaged", mark_rel, message, mark.pack)
        return
    through, pack = anchor.through, anchor.pack
    if mark.through > through:
        message = f"says through {mark.through}; HEAD's seal reaches only {through}"
        check.add("sealed-mark-damaged", mark_rel, message, mark.pack)
    elif mark.through == through and mark.pack != pack:
        message = f"names pack {mark.pack} through {through}; HEAD's seal names {pack}"
        check.add("sealed-mark-damaged", mark_rel, message, mark.pack)
    elif ends and ends.get(mark.through) != mark.pack:
        message = f"names pack {mark.pack} through {mark.through}; no pack of the chain does"
        check.add("sealed-mark-damaged", mark_rel, message, mark.pack)
    elif mark.through < through:
        message = f"says through {mark.through}; HEAD's seal reaches {through}"
        check.add("sealed-mark-stale", mark_rel, message, mark.pack)


def _tail_first(check: TaskCheck, seq: int) -> tuple[str, Snapshot] | None:
    """The snapshot just above the seal, from its slot (None if it cannot be read: the
    slot's own findings say why)."""
    try:
        data = check.medium.read(f"{check.rel}/{CHAIN_DIR}/{slot_name(seq)}")
        snapshot_id = hash_bytes(data)
        return snapshot_id, decode_snapshot(check.task_id, snapshot_id, data)
    except (OSError, CastoreError):
        return None


def _pack_facts(check: TaskCheck, pack_id: str) -> PackFacts | None:
    report = check.named.report(pack_id) if is_object_name(pack_id) else None
    record = report.record if report is not None and not report.damaged else None
    return record if isinstance(record, PackFacts) else None


def _check_join(
    check: TaskCheck, facts: PackFacts, child: tuple[str, Snapshot], child_at: str
) -> None:
    """The snapshot after the pack's range names its last snapshot and follows the rules
    of a link from it (as a resume checks it)."""
    header, last = facts.pack.header, facts.pack.last
    child_id, snapshot = child
    if snapshot.parent != header.last_id:
        message = (
            f"parent is {snapshot.parent}; the pack holding {header.last_seq} ends with "
            f"{header.last_id}"
        )
        code = "broken-link" if child_at.startswith(check.rel) else "pack-chain-broken"
        check.add(code, child_at, message, child_id)
        return
    try:
        check_link(check.task_id, header.last_id, last, header.last_seq, snapshot)
        check_history(check.task_id, last, snapshot, child_id)
        check_anchor(check.task_id, last, snapshot, child_id)
    except ChainError as exc:
        code = "illegal-transition" if child_at.startswith(check.rel) else "pack-chain-broken"
        check.add(code, child_at, exc.reason, child_id)


def _refer(check: TaskCheck, facts: PackFacts, pack_rel: str, pack_id: str) -> None:
    """What the pack's range names is referred to (never unreachable: gc keeps it) and each
    result it names is checked as a slot's result is."""
    header = facts.pack.header
    check.refs.update(header.plans)
    for ref in header.refs:
        check.refs.add(ref)
        report = check.named.report(ref) if is_object_name(ref) else None
        if report is None or report.damaged:
            message = f"names {ref} (a result in its range), which is missing or damaged"
            check.add("missing-object", pack_rel, message, pack_id)
