"""Which objects fsck has checked, and how: through a clean slot, through a slot with
something to report, as a plan or blob a chain names, or directly; and the findings of slots
that only the whole listing of objects/ can make (is this slot its object, or a copy?)."""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterable, Iterator

from castore.format.layout import CHAIN_DIR, TASKS_DIR, object_relpath, slot_name
from castore.maintenance.fsck.findings import Finding, Severity
from castore.maintenance.fsck.objects import ObjectReport
from castore.maintenance.fsck.tree import Inventory
from castore.maintenance.fsck.workers import TaskResult


class Coverage:
    """Every object's report, gathered from the task pass and then from direct checks, and
    the findings of slots that only the whole store's listing can make."""

    def __init__(
        self, inventory: Inventory, *, names_may_be_lost: bool = False, aliases: bool = True
    ) -> None:
        self.inventory = inventory
        # POSIX: a slot is a second name of its snapshot's object; where it is not (S3), a
        # slot is its snapshot's only copy, and objects/ holds no name of it to miss.
        self._aliases = aliases
        # v2: a commit leaves its snapshot's object name unsynced (FORMAT.md §13, "A lost
        # snapshot name"), so a vouched slot without one is a lost name; in v1 it never is.
        self._names_may_be_lost = names_may_be_lost
        self.reports: dict[str, ObjectReport] = {}  # objects checked, with what they found
        self.clean: set[str] = set()  # snapshot objects checked through a clean slot
        # What chains refer to, besides the objects in self.clean (every one of which some
        # chain refers to): see refers_to.
        self.referenced: set[str] = set()
        self._copies: list[tuple[str, str, int, str]] = []  # (name, task id, seq, object id)

    def add_task(self, result: TaskResult) -> Iterator[Finding]:
        """Take one task's slots and named objects; yield, in slot order, what its slots say
        of objects/."""
        self.referenced |= result.refs
        if self._aliases:
            odd = self._clean_slots(result) + self._slots(result)
        else:
            odd = self._only_copies(result)
        for seq, snapshot_id, what in sorted(odd):
            if what:
                yield _slot_finding(result.name, result.task_id, seq, snapshot_id, what)
            else:  # a copy of the object's bytes: judged once the object itself is checked
                self._copies.append((result.name, result.task_id, seq, snapshot_id))
        self.clean.update(self.inventory.inodes.keys() & result.named_clean)
        self.add_reports(result.named)

    def _clean_slots(self, result: TaskResult) -> list[tuple[int, str, str]]:
        """The clean slots that are not their object: (seq, snapshot id, what to say)."""
        inodes, ids = self.inventory.inodes, result.clean_ids
        # The common case in one pass: every clean slot is its object, listed.
        if all(map(operator.eq, map(inodes.get, ids), array("Q", result.clean_inodes))):
            self.clean.update(ids)
            return []
        self.referenced.update(ids)
        odd = []
        for seq, snapshot_id, slot_inode in result.clean_slots():
            inode = inodes.get(snapshot_id)
            if inode == slot_inode:
                self.clean.add(snapshot_id)
            else:
                odd.append((seq, snapshot_id, self._nameless(result, seq) if inode is None else ""))
        return odd

    def _only_copies(self, result: TaskResult) -> list[tuple[int, str, str]]:
        """Slots that are their snapshots' only copies (no aliases): checked through the slot,
        its report the snapshot's own; one found in objects/ too is a copy there, judged
        once that object is checked."""
        odd = []
        listed = self.inventory.inodes
        for seq, snapshot_id, _ in result.clean_slots():
            if snapshot_id in listed:
                self.referenced.add(snapshot_id)
                odd.append((seq, snapshot_id, ""))
            else:
                self.clean.add(snapshot_id)
        for slot in result.slots:
            self.referenced.add(slot.snapshot_id)
            if slot.snapshot_id in listed:
                odd.append((slot.seq, slot.snapshot_id, ""))
            elif not slot.findings:
                self.clean.add(slot.snapshot_id)
            elif slot.snapshot_id not in self.reports:
                path = _slot_path(result.name, slot.seq)
                self.reports[slot.snapshot_id] = ObjectReport(
                    slot.snapshot_id, path, slot.kind, slot.findings
                )
        return odd

    def _slots(self, result: TaskResult) -> list[tuple[int, str, str]]:
        """The slots with findings of their own: their reports are their objects' (if they
        are their objects), and what to say of the others."""
        odd = []
        for slot in result.slots:
            self.referenced.add(slot.snapshot_id)
            inode = self.inventory.inodes.get(slot.snapshot_id)
            if inode == slot.inode:  # the slot is the object: its report is the object's
                if slot.snapshot_id not in self.reports:
                    path = object_relpath(slot.snapshot_id)
                    self.reports[slot.snapshot_id] = ObjectReport(
                        slot.snapshot_id, path, slot.kind, slot.findings
                    )
                if slot.kind is None:
                    odd.append((slot.seq, slot.snapshot_id, _DAMAGED))
            elif inode is not None:
                odd.append((slot.seq, slot.snapshot_id, ""))
            else:
                whole = slot.kind == "snapshot" and not any(
                    f.severity is Severity.ERROR for f in slot.findings
                )
                code = self._nameless(result, slot.seq) if whole else _UNPUBLISHED
                odd.append((slot.seq, slot.snapshot_id, code))
        return odd

    def _nameless(self, result: TaskResult, seq: int) -> str:
        """What to say of a slot whose snapshot has no object name in objects/."""
        if self._names_may_be_lost and seq not in result.doubted:
            return _LOST  # its bytes verify: the next slot names them, or it is a clean HEAD
        return _UNPUBLISHED

    def add_reports(self, reports: Iterable[ObjectReport]) -> None:
        for report in reports:
            if report.object_id in self.inventory.inodes:
                self.reports.setdefault(report.object_id, report)

    def refers_to(self) -> set[str]:
        """Every object id some chain refers to."""
        return self.referenced | self.clean

    @property
    def checked(self) -> int:
        """How many objects have been checked, one way or the other."""
        return len(self.reports) + len(self.clean.difference(self.reports))

    def unchecked(self, wanted: set[str] | None) -> list[tuple[str, str]]:
        """(path, id) of every object (of `wanted`, if given) that has no report yet."""
        left = self.inventory.inodes.keys() - self.clean - self.reports.keys()
        return [(object_relpath(i), i) for i in sorted(left if wanted is None else left & wanted)]

    def slot_findings(self) -> Iterator[Finding]:
        """Slots that are copies of a damaged object say so (once every report is in)."""
        for name, task_id, seq, object_id in self._copies:
            report = self.reports.get(object_id)
            if report is not None and report.damaged and object_id not in self.clean:
                yield _slot_finding(name, task_id, seq, object_id, _DAMAGED)


_DAMAGED = "missing-object"
_UNPUBLISHED = "slot-not-published"
_LOST = "snapshot-name-lost"
_SAYS = {
    _DAMAGED: "the snapshot object of this slot is damaged (see its own finding)",
    _UNPUBLISHED: "no object of these bytes in objects/",
    _LOST: "a power loss took the object name of this slot's snapshot; gc restores it",
}


def _slot_path(name: str, seq: int) -> str:
    return f"{TASKS_DIR}/{name}/{CHAIN_DIR}/{slot_name(seq)}"


def _slot_finding(name: str, task_id: str, seq: int, object_id: str, code: str) -> Finding:
    return Finding(code, _slot_path(name, seq), _SAYS[code], object_id, task_id)
