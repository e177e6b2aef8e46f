"""fsck of one task: its directory, its chain slots, links, plan, frontier and effect history
(the rules of one link: linkrules.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

from castore.chain.sealmark import Mark, newer
from castore.chain.trees import PART_KINDS
from castore.errors import CastoreError
from castore.format.codec import intact_body
from castore.format.digest import hash_bytes
from castore.format.layout import (
    CHAIN_DIR,
    LEASE_DIR,
    LEGACY_MARK_NAME,
    LOCK_NAME,
    MARKS_DIR,
    SEQ_WIDTH,
    TASKS_DIR,
    missing_seqs,
    object_relpath,
    parse_slot_name,
    parse_temp_name,
    slot_name,
)
from castore.format.model import attrs
from castore.format.records import Snapshot
from castore.maintenance.fsck.findings import Finding, Severity
from castore.maintenance.fsck.linkrules import (
    LinkRules,
    decode_clean_snapshot,
    decode_slot,
    named_anyway,
)
from castore.maintenance.fsck.named import NamedObjects
from castore.maintenance.fsck.objects import check_data, read_with_entry
from castore.maintenance.fsck.sealed import check_generations, check_sealed, read_mark
from castore.maintenance.fsck.tree import temp_finding
from castore.maintenance.fsck.vouches import Vouches
from castore.medium.base import Entry, Medium

Read = Callable[[str], tuple[bytes, Entry]]  # a slot's bytes and entry, by its name


@attrs.frozen
class SlotCheck:
    """A chain slot judged as the snapshot object it should be. Whether it *is* that object
    (the same inode as objects/xx/<id>) only the caller can tell, from the store's listing."""

    seq: int
    snapshot_id: str
    inode: int
    findings: tuple[Finding, ...]  # the object's own findings, at its objects/ path
    kind: str | None  # what object it is (a slot may be a plan's or a blob's inode); None: damaged


_SLOT_NAMES = re.compile(f"(?:[0-9]{{{SEQ_WIDTH}}}\n)*")  # lines of slot names


class TaskCheck(LinkRules):
    """Checks one task directory: its slots (each also as the snapshot object it should be),
    chain links, references, frontier and effect history.

    Findings are appended to one list rather than yielded through nested generators: the
    per-slot path runs for every snapshot of the store and is fsck's hot loop.
    """

    def __init__(
        self,
        medium: Medium,
        *,
        name: str,
        task_id: str,
        named: NamedObjects,
        now_ms: int,
        stuck_after_ms: int,
    ) -> None:
        super().__init__(task_id, named, now_ms, stuck_after_ms)
        self.medium = medium
        self.rel = f"{TASKS_DIR}/{name}"
        self.unreadable = False  # a slot that could not be read or decoded
        self.slots: list[SlotCheck] = []  # slots with something to report, or in doubt
        # The other slots, clean: three columns (cheaper to send than a tuple per slot)
        self.clean_seqs: list[int] = []
        self.clean_ids: list[str] = []  # their snapshot ids
        self.clean_inodes: list[int] = []
        self.mark: Mark | None = None  # the sealed mark (v2), if there is a readable one
        self._mark_rel = ""  # the file that says it
        self._mark_damaged = False
        self._head: tuple[str, Snapshot] | None = None
        # Slots read whose bytes nothing vouches for: no next slot names them as its parent
        # (HEAD: it does not decode and link cleanly). Only a vouched slot's missing object
        # name may be a lost name (snapshot-name-lost) rather than damage.
        self.doubted: set[int] = set()

    def run(self) -> list[Finding]:
        """Every finding of this task, in path order within each check."""
        chain_key = f"{self.rel}/{CHAIN_DIR}"
        for key in (self.rel, chain_key):
            try:
                kind = self.medium.stat(key).kind
            except FileNotFoundError:
                self.add("no-chain", key, "no chain directory")
                return self.found
            if kind != "directory":
                self.unreadable = True  # whatever it holds is not read, so not known
                self.add("unsafe-file", key, f"a {kind} where a directory belongs")
                return self.found
        self._directory_entries()
        slots = self._slots(chain_key)
        sealed = self.mark is not None or self._mark_damaged
        if not slots or (0 not in slots and not sealed):
            self.add(
                "no-chain", f"{self.rel}/{CHAIN_DIR}", "no slot 0" if not sealed else "no slot"
            )
            return self.found
        present = sorted(slots)
        self._gaps(present)
        self._walk(chain_key, present, slots)
        if self._head is not None and (self._head[1].sealed is not None or self.mark):
            mark = (self._mark_rel, self.mark) if self.mark is not None else None
            check_sealed(self, self._head, mark, self._slot_ids())
        if self.mark is not None:
            # A slot at or below the mark is one pruning has yet to remove: the pack holds its
            # bytes (check_sealed reports a slot that disagrees), so its next slot, maybe
            # pruned already, need not vouch for it.
            self.doubted = {seq for seq in self.doubted if seq > self.mark.through}
        return self.found

    def _gaps(self, present: list[int]) -> None:
        """Slots missing below HEAD; with a sealed mark, only those above its `through` (the
        ones below may have been pruned: the packs hold them)."""
        floor = -1
        if self.mark is not None:
            floor = self.mark.through
        elif self._mark_damaged:
            floor = present[0] - 1  # unknown: the mark's own finding says so
        # Counted from floor + 1 (no copy of the list for the common case: no mark).
        above = present if floor < 0 else [seq - floor - 1 for seq in present if seq > floor]
        missing, first_missing = missing_seqs(above, present[-1] - floor - 1)
        if missing:
            shown = [seq + floor + 1 for seq in first_missing]
            listed = ", ".join(map(str, shown)) + (", ..." if missing > 10 else "")
            message = f"missing slots [{listed}] ({missing} in all)"
            self.add("slot-gap", f"{self.rel}/{CHAIN_DIR}", message)

    def _slot_ids(self) -> dict[int, str]:
        """seq -> snapshot id of every slot read."""
        found = dict(zip(self.clean_seqs, self.clean_ids, strict=True))
        found.update((slot.seq, slot.snapshot_id) for slot in self.slots)
        return found

    def _directory_entries(self) -> None:
        for entry in self.medium.scan(self.rel):
            relpath = f"{self.rel}/{entry.name}"
            if entry.name == LOCK_NAME:
                if not entry.regular:
                    self.add("unsafe-file", relpath, f"a {entry.kind} as lock file")
                elif self.medium.lock_held(relpath):
                    self.add("lock-held", relpath, "a worker is running this task now")
            elif entry.name == LEGACY_MARK_NAME:
                try:
                    self._take_mark(relpath, read_mark(self.medium, self.task_id, relpath))
                except ValueError as exc:
                    self._mark_damaged = True
                    self.add("sealed-mark-damaged", relpath, str(exc))
            elif entry.name == MARKS_DIR:
                self._mark_generations(relpath, entry.kind)
            elif entry.name == LEASE_DIR and self.medium.kind == "s3":
                continue  # a task's lease claims (castore.medium.s3lease): no chain data
            elif parse_temp_name(entry.name):  # a mark write a crash interrupted (v2)
                self._temp_finding(relpath)
            elif entry.name != CHAIN_DIR and not entry.name.startswith(".filelock"):
                self.add("unknown-file", relpath, "not part of a task directory")

    def _take_mark(self, relpath: str, mark: Mark | None) -> None:
        """One file of the mark read: the mark is the one that lets more be pruned."""
        if mark is not None and newer(self.mark, mark) is mark:
            self.mark, self._mark_rel = mark, relpath

    def _temp_finding(self, relpath: str) -> None:
        self.found.append(attrs.evolve(temp_finding(self.medium, relpath), task=self.task_id))

    def _mark_generations(self, relpath: str, kind: str) -> None:
        if kind != "directory":
            self._mark_damaged = True
            self.add("unsafe-file", relpath, f"a {kind} where a directory belongs")
            return
        found = check_generations(self.medium, self.task_id, relpath)
        for rel, code, message in found.problems:
            if code == "temp-file":  # a mark generation a crash interrupted
                self._temp_finding(rel)
            else:
                self.add(code, rel, message)
        self._mark_damaged = self._mark_damaged or found.damaged
        if found.newest is not None:
            self._take_mark(*found.newest)

    def _slots(self, chain_key: str) -> dict[int, str]:
        """seq -> file name of every slot; anything else in the chain directory is reported."""
        names = sorted(self.medium.names(chain_key))
        # The common case in one regex call: every name is a slot name (one line each: a name
        # with a newline in it would make more lines than names), and they are 0 to n - 1.
        joined = "\n".join(names) + "\n" if names else ""
        if len(joined) == (SEQ_WIDTH + 1) * len(names) and _SLOT_NAMES.fullmatch(joined):
            if names and names[-1] == slot_name(len(names) - 1):  # distinct: every seq is there
                return dict(enumerate(names))
            return dict(zip(map(int, names), names, strict=True))
        slots: dict[int, str] = {}
        for name in names:
            seq = parse_slot_name(name)
            if seq is not None:
                slots[seq] = name
                continue
            relpath = f"{self.rel}/{CHAIN_DIR}/{name}"
            if parse_temp_name(name):
                self._temp_finding(relpath)
            else:
                self.add("stray-file", relpath, "not a chain slot")
        return slots

    def _walk(self, chain_key: str, present: list[int], names: dict[int, str]) -> None:
        """Check the slots `present` (in order); a slot after a gap has no previous link."""
        previous: tuple[str, Snapshot] | None = None
        previous_seq, head = -1, present[-1]
        vouches = Vouches(self.doubted)
        with self.medium.reader(chain_key) as read:
            for seq in present:
                if previous is not None and seq != previous_seq + 1:
                    previous = None
                if previous is None:
                    vouches.broken()  # a gap or an unreadable slot follows the last one read
                previous_seq = seq
                name = names[seq]
                loaded = None
                if previous is not None or seq == 0:
                    loaded = self._clean_slot(read, name, seq, previous)
                if loaded is None:  # something to report: the full check says what
                    relpath = self.slot_relpath(seq)
                    loaded = self._load_slot(f"{chain_key}/{name}", seq, relpath)
                    if loaded is None:
                        previous = None
                        continue
                    before = len(self.found)
                    self.check_entry(relpath, seq, loaded[0], loaded[1], previous)
                    self._vouch_head(seq == head, seq, before)
                vouches.read(seq, loaded[1], previous)
                previous = loaded
                if seq == head:
                    self._head = loaded
                    self.check_head(self.slot_relpath(seq), loaded[0], loaded[1])
            vouches.end(head)

    def _vouch_head(self, is_head: bool, seq: int, before: int) -> None:
        """HEAD, taken the full check, is doubted unless its bytes stand on their own
        (FORMAT.md 11.2): a whole snapshot object (its SlotCheck, the last one) and a clean
        link, every finding since `before` a warning at most."""
        if not is_head:
            return
        slot = self.slots[-1]
        findings = (*slot.findings, *self.found[before:])
        if slot.kind != "snapshot" or any(f.severity is Severity.ERROR for f in findings):
            self.doubted.add(seq)

    def slot_relpath(self, seq: int) -> str:
        return f"{self.rel}/{CHAIN_DIR}/{slot_name(seq)}"

    def _clean_slot(
        self, read: Read, name: str, seq: int, previous: tuple[str, Snapshot] | None
    ) -> tuple[str, Snapshot] | None:
        """The slot's (id, snapshot) if every check of `_load_slot` and `check_entry` passes
        on it, else None: fsck's hot path, for the slots with nothing to report (so: few
        calls, no findings). It decides nothing the full check would not; on any doubt the
        full check runs from scratch."""
        try:
            data, info = read(name)  # an I/O error: the full check retries
        except (CastoreError, OSError):
            return None
        # check_data's findings: not a regular file, writable, an extra hard link, or a body
        # that is not a canonical snapshot.
        if not info.regular or (info.mode or 0) & 0o222 or (info.links or 1) > 2:
            return None
        body = intact_body(data, "snapshot")
        snapshot = decode_clean_snapshot(body) if body is not None else None
        if snapshot is None or not self.fits_chain(seq, snapshot, previous):
            return None
        result_ref = snapshot.transition.result_ref
        if result_ref is not None:
            result = self.named.report(result_ref)
            if result is None or result.kind not in PART_KINDS:
                return None
            self.refs.add(result_ref)
        if snapshot.fork is not None:  # the carried outcomes: resume reads them, gc keeps them
            outcomes = self.named.report(snapshot.fork.outcomes)
            if outcomes is None or outcomes.damaged or outcomes.kind != "tree":
                return None
            self.refs.add(snapshot.fork.outcomes)
        # Its own id and its parent's (a slot of this chain) need no entry in self.refs:
        # the caller adds every slot's id to what the chain refers to.
        snapshot_id = hash_bytes(data)
        self.clean_seqs.append(seq)
        self.clean_ids.append(snapshot_id)
        self.clean_inodes.append(info.inode or 0)  # 0: the medium has no inodes
        return snapshot_id, snapshot

    def _load_slot(self, key: str, seq: int, relpath: str) -> tuple[str, Snapshot] | None:
        try:
            data, info = read_with_entry(self.medium, key)
        except OSError as exc:  # StoreIOError included: the system could not read it
            self.unreadable = True
            self.add("read-error", relpath, str(exc))
            return None
        except CastoreError as exc:
            self.unreadable = True
            self.add("unsafe-file", relpath, str(exc))
            return None
        snapshot_id = hash_bytes(data)
        self.refs.add(snapshot_id)
        # Its findings are the object's: at its objects/ path where the slot is a second name
        # of it (POSIX); where a slot is the only copy of its snapshot (S3), at the slot.
        where = object_relpath(snapshot_id) if self.medium.aliases else relpath
        report = check_data(where, snapshot_id, data, info, hashed=snapshot_id)
        slot = SlotCheck(seq, snapshot_id, info.inode or 0, report.findings, report.kind)
        self.slots.append(slot)
        if isinstance(report.record, Snapshot):
            return snapshot_id, report.record  # decoded once, used twice
        try:
            return snapshot_id, decode_slot(data, relpath)
        except Exception as exc:  # noqa: BLE001 - every decoding failure is the same finding
            reason = (
                "file is empty" if not data else (str(exc) or type(exc).__name__).splitlines()[0]
            )
            self.unreadable = True
            self.add("slot-corrupt", relpath, reason, snapshot_id)
            self.refs.update(named_anyway(data))  # what gc keeps for it, fsck --task checks
            return None
