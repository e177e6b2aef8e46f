"""fsck of one task: its directory, its chain slots, links, plan, frontier and effect history."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat

import attrs

from castore.chain import references
from castore.chain.sealmark import Mark, newer
from castore.chain.trees import PART_KINDS
from castore.errors import CastoreError
from castore.format import codec
from castore.format.codec import intact_body
from castore.format.digest import hash_bytes
from castore.format.fastdecode import canonical_view, decode_canonical
from castore.format.growth import frontier_problems
from castore.format.history import illegal_changes
from castore.format.layout import (
    CHAIN_DIR,
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
from castore.format.records import EffectState, Snapshot, TransitionKind
from castore.maintenance.fsck.findings import Finding, Severity
from castore.maintenance.fsck.named import NamedObjects, PlanShape
from castore.maintenance.fsck.objects import check_data, read_with_stat
from castore.maintenance.fsck.sealed import check_generations, check_sealed, read_mark
from castore.maintenance.fsck.tree import temp_finding
from castore.medium.fsread import open_directory, read_in
from castore.medium.oserrors import file_kind


@attrs.frozen
class SlotCheck:
    """A chain slot judged as the snapshot object it should be. Whether it *is* that object
    (the same inode as objects/xx/<id>) only the caller can tell, from the store's listing."""

    seq: int
    snapshot_id: str
    inode: int
    findings: tuple[Finding, ...]  # the object's own findings, at its objects/ path
    kind: str | None  # what object it is (a slot may be a plan's or a blob's inode); None: damaged


_FILE_TYPE_AND_WRITE_BITS = stat.S_IFMT(0o177777) | 0o222
_SLOT_NAMES = re.compile(f"(?:[0-9]{{{SEQ_WIDTH}}}\n)*")  # lines of slot names


class TaskCheck:
    """Checks one task directory: its slots (each also as the snapshot object it should be),
    chain links, references, frontier and effect history.

    Findings are appended to one list rather than yielded through nested generators: the
    per-slot path runs for every snapshot of the store and is fsck's hot loop.
    """

    def __init__(
        self,
        root: str,
        *,
        name: str,
        task_id: str,
        named: NamedObjects,
        now_ms: int,
        stuck_after_ms: int,
    ) -> None:
        self.root, self.task_id = root, task_id
        self.rel = f"{TASKS_DIR}/{name}"
        self.named = named
        self.now_ms, self.stuck_after_ms = now_ms, stuck_after_ms
        self.refs: set[str] = set()  # every id the chain names or is made of
        self.unreadable = False  # a slot that could not be read or decoded
        self.found: list[Finding] = []
        self.slots: list[SlotCheck] = []  # slots with something to report, or in doubt
        # The other slots, clean: three columns (cheaper to send than a tuple per slot)
        self.clean_seqs: list[int] = []
        self.clean_ids: list[str] = []  # their snapshot ids
        self.clean_inodes: list[int] = []
        self._plan_id: str | None = None  # the plan of the last clean slot, and its shape
        self._plan: PlanShape | None = None
        self.mark: Mark | None = None  # the sealed mark (v2), if there is a readable one
        self._mark_rel = ""  # the file that says it
        self._mark_damaged = False
        self._head: tuple[str, Snapshot] | None = None
        # Slots read whose bytes nothing vouches for: no next slot names them as its parent
        # (HEAD: it does not decode and link cleanly). Only a vouched slot's missing object
        # name may be a lost name (snapshot-name-lost) rather than damage.
        self.doubted: set[int] = set()

    def add(self, code: str, relpath: str, message: str, object_id: str | None = None) -> None:
        self.found.append(Finding(code, relpath, message, object_id, self.task_id))

    def run(self) -> list[Finding]:
        """Every finding of this task, in path order within each check."""
        directory = os.path.join(self.root, self.rel)
        chain_dir = os.path.join(directory, CHAIN_DIR)
        for path, rel in ((directory, self.rel), (chain_dir, f"{self.rel}/{CHAIN_DIR}")):
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                self.add("no-chain", rel, "no chain directory")
                return self.found
            if not stat.S_ISDIR(mode):
                self.unreadable = True  # whatever it holds is not read, so not known
                self.add("unsafe-file", rel, f"a {file_kind(mode)} where a directory belongs")
                return self.found
        self._directory_entries(directory)
        slots = self._slots(chain_dir)
        sealed = self.mark is not None or self._mark_damaged
        if not slots or (0 not in slots and not sealed):
            self.add(
                "no-chain", f"{self.rel}/{CHAIN_DIR}", "no slot 0" if not sealed else "no slot"
            )
            return self.found
        present = sorted(slots)
        self._gaps(present)
        self._walk(chain_dir, present, slots)
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

    def _directory_entries(self, directory: str) -> None:
        for entry in os.scandir(directory):
            relpath = f"{self.rel}/{entry.name}"
            mode = entry.stat(follow_symlinks=False).st_mode
            if entry.name == LOCK_NAME:
                if not stat.S_ISREG(mode):
                    self.add("unsafe-file", relpath, f"a {file_kind(mode)} as lock file")
                elif _lock_held(entry.path):
                    self.add("lock-held", relpath, "a worker is running this task now")
            elif entry.name == LEGACY_MARK_NAME:
                try:
                    self._take_mark(relpath, read_mark(self.task_id, entry.path))
                except ValueError as exc:
                    self._mark_damaged = True
                    self.add("sealed-mark-damaged", relpath, str(exc))
            elif entry.name == MARKS_DIR:
                self._mark_generations(entry.path, relpath, mode)
            elif parse_temp_name(entry.name):  # a mark write a crash interrupted (v2)
                self.found.append(attrs.evolve(temp_finding(self.root, relpath), task=self.task_id))
            elif entry.name != CHAIN_DIR and not entry.name.startswith(".filelock"):
                self.add("unknown-file", relpath, "not part of a task directory")

    def _take_mark(self, relpath: str, mark: Mark | None) -> None:
        """One file of the mark read: the mark is the one that lets more be pruned."""
        if mark is not None and newer(self.mark, mark) is mark:
            self.mark, self._mark_rel = mark, relpath

    def _mark_generations(self, path: str, relpath: str, mode: int) -> None:
        if not stat.S_ISDIR(mode):
            self._mark_damaged = True
            self.add("unsafe-file", relpath, f"a {file_kind(mode)} where a directory belongs")
            return
        found = check_generations(self.task_id, path, relpath)
        for rel, code, message in found.problems:
            if code == "temp-file":  # a mark generation a crash interrupted
                self.found.append(attrs.evolve(temp_finding(self.root, rel), task=self.task_id))
            else:
                self.add(code, rel, message)
        self._mark_damaged = self._mark_damaged or found.damaged
        if found.newest is not None:
            self._take_mark(*found.newest)

    def _slots(self, chain_dir: str) -> dict[int, str]:
        """seq -> file name of every slot; anything else in the chain directory is reported."""
        names = sorted(os.listdir(chain_dir))
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
                self.found.append(attrs.evolve(temp_finding(self.root, relpath), task=self.task_id))
            else:
                self.add("stray-file", relpath, "not a chain slot")
        return slots

    def _walk(self, chain_dir: str, present: list[int], names: dict[int, str]) -> None:
        """Check the slots `present` (in order); a slot after a gap has no previous link."""
        previous: tuple[str, Snapshot] | None = None
        previous_seq, head = -1, present[-1]
        vouches = _Vouches(self.doubted)
        try:
            dir_fd = open_directory(chain_dir)
        except OSError:
            dir_fd = -1  # every slot then takes the full check, which reports why
        try:
            for seq in present:
                if previous is not None and seq != previous_seq + 1:
                    previous = None
                if previous is None:
                    vouches.broken()  # a gap or an unreadable slot follows the last one read
                previous_seq = seq
                name = names[seq]
                loaded = None
                if dir_fd >= 0 and (previous is not None or seq == 0):
                    loaded = self._clean_slot(dir_fd, name, seq, previous)
                if loaded is None:  # something to report: the full check says what
                    relpath = self.slot_relpath(seq)
                    loaded = self._load_slot(f"{chain_dir}/{name}", seq, relpath)
                    if loaded is None:
                        previous = None
                        continue
                    before = len(self.found)
                    self._check_entry(relpath, seq, loaded[0], loaded[1], previous)
                    self._vouch_head(seq == head, seq, before)
                vouches.read(seq, loaded[1], previous)
                previous = loaded
                if seq == head:
                    self._head = loaded
                    self._check_head(self.slot_relpath(seq), loaded[0], loaded[1])
            vouches.end(head)
        finally:
            if dir_fd >= 0:
                os.close(dir_fd)

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
        self, dir_fd: int, name: str, seq: int, previous: tuple[str, Snapshot] | None
    ) -> tuple[str, Snapshot] | None:
        """The slot's (id, snapshot) if every check of `_load_slot` and `_check_entry` passes
        on it, else None: fsck's hot path, for the slots with nothing to report (so: few
        calls, no findings). It decides nothing the full check would not; on any doubt the
        full check runs from scratch."""
        try:
            data, info = read_in(dir_fd, name)  # an I/O error: the full check retries
        except (CastoreError, OSError):
            return None
        # check_data's findings: not a regular file, writable, an extra hard link, or a body
        # that is not a canonical snapshot.
        if info.st_mode & _FILE_TYPE_AND_WRITE_BITS != stat.S_IFREG or info.st_nlink > 2:
            return None
        body = intact_body(data, "snapshot")
        snapshot = _decode_clean_snapshot(body) if body is not None else None
        if snapshot is None or not self._fits_chain(seq, snapshot, previous):
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
        self.clean_inodes.append(info.st_ino)
        return snapshot_id, snapshot

    def _fits_chain(
        self, seq: int, snapshot: Snapshot, previous: tuple[str, Snapshot] | None
    ) -> bool:
        """_check_entry and _check_frontier would find nothing to say of `snapshot`."""
        if snapshot.seq != seq or snapshot.task != self.task_id:
            return False
        if not _links_cleanly(snapshot, previous):
            return False
        if snapshot.plan != self._plan_id:  # plans rarely change along a chain: keep the last
            self._plan_id, self._plan = snapshot.plan, self.named.plan_shape(snapshot.plan)
            self.refs.add(snapshot.plan)
        plan = self._plan
        if plan is None:
            return False
        if plan.grows or snapshot.grown is not None:
            return not frontier_problems(plan.steps, plan.effects, plan.grows, snapshot)
        steps, index, step = plan.steps, snapshot.frontier.index, snapshot.frontier.step
        fits = (0 <= index < len(steps) and step == steps[index]) or (
            index == len(steps) and step is None
        )
        effects = snapshot.effects
        return fits and (not effects or all(record.step in plan.effects for record in effects))

    def _load_slot(self, path: str, seq: int, relpath: str) -> tuple[str, Snapshot] | None:
        try:
            data, info = read_with_stat(path)
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
        report = check_data(
            object_relpath(snapshot_id), snapshot_id, data, info, hashed=snapshot_id
        )
        self.slots.append(SlotCheck(seq, snapshot_id, info.st_ino, report.findings, report.kind))
        if isinstance(report.record, Snapshot):
            return snapshot_id, report.record  # decoded once, used twice
        try:
            return snapshot_id, _decode_snapshot(data, relpath)
        except Exception as exc:  # noqa: BLE001 - every decoding failure is the same finding
            reason = (
                "file is empty" if not data else (str(exc) or type(exc).__name__).splitlines()[0]
            )
            self.unreadable = True
            self.add("slot-corrupt", relpath, reason, snapshot_id)
            self.refs.update(_named_anyway(data))  # what gc keeps for it, fsck --task checks
            return None

    def _check_entry(
        self,
        relpath: str,
        seq: int,
        snapshot_id: str,
        snapshot: Snapshot,
        previous: tuple[str, Snapshot] | None,
    ) -> None:
        def bad(code: str, message: str) -> None:
            self.add(code, relpath, message, snapshot_id)

        transition = snapshot.transition
        if snapshot.seq != seq:
            bad("seq-mismatch", f"slot {seq} holds sequence {snapshot.seq}")
        if snapshot.task != self.task_id:
            bad("foreign-snapshot", f"a snapshot of task {snapshot.task!r}")
        if (transition.kind is TransitionKind.START) != (seq == 0):
            bad("root-not-start", f"sequence {seq} records a {transition.kind.value}")
        if snapshot.parent is not None:
            self.refs.add(snapshot.parent)  # named, so never "unreachable" (gc keeps it too)
        self._check_ref(relpath, snapshot_id, snapshot.plan, ("plan",))
        if transition.result_ref is not None:
            self._check_ref(relpath, snapshot_id, transition.result_ref, PART_KINDS)
        if snapshot.fork is not None:
            self._check_ref(relpath, snapshot_id, snapshot.fork.outcomes, ("tree",))
        if previous is None:
            if seq == 0 and snapshot.parent is not None:
                bad("broken-link", f"sequence 0 names a parent {snapshot.parent}")
        else:
            parent_id, parent = previous
            linked = snapshot.parent == parent_id
            if not linked:
                code = "cycle" if snapshot.parent == snapshot_id else "broken-link"
                bad(code, f"parent is {snapshot.parent}, slot {seq - 1} holds {parent_id}")
            if snapshot.plan != parent.plan and not (
                transition.kind is TransitionKind.OVERRIDE and transition.replaced == parent.plan
            ):
                bad(
                    "plan-changed",
                    f"plan {snapshot.plan} follows {parent.plan} without an override",
                )
            # A history is judged between a snapshot and its own parent only: across a broken
            # link every difference would be reported again, as noise.
            for message in illegal_changes(parent, snapshot) if linked else ():
                bad("illegal-transition", message)
        self._check_frontier(relpath, snapshot_id, snapshot)

    def _check_ref(self, relpath: str, snapshot_id: str, ref: str, kinds: tuple[str, ...]) -> None:
        """A plan or result a snapshot names exists, is intact and is of one of `kinds`."""
        self.refs.add(ref)
        report = self.named.report(ref, followed=kinds != ("plan",))
        if report is None or report.damaged:
            message = f"names {ref}, which is missing or damaged"
            self.add("missing-object", relpath, message, snapshot_id)
        elif report.kind not in kinds:
            message = f"names {ref} as a {' or '.join(kinds)}; it is a {report.kind}"
            self.add("missing-object", relpath, message, snapshot_id)

    def _check_frontier(self, relpath: str, snapshot_id: str, snapshot: Snapshot) -> None:
        plan = self.named.plan_shape(snapshot.plan)
        if plan is None:
            return
        if plan.grows or snapshot.grown is not None:
            for problem in frontier_problems(plan.steps, plan.effects, plan.grows, snapshot):
                self.add("bad-frontier", relpath, problem, snapshot_id)
            return
        index, step = snapshot.frontier.index, snapshot.frontier.step
        expected = plan.steps[index] if 0 <= index < len(plan.steps) else None
        if not 0 <= index <= len(plan.steps) or step != expected:
            message = f"frontier ({index}, {step!r}) does not fit the plan"
            self.add("bad-frontier", relpath, message, snapshot_id)
        for record in snapshot.effects:
            if record.step not in plan.effects:
                message = f"record for {record.step!r}, not an effect of the plan"
                self.add("bad-frontier", relpath, message, snapshot_id)

    def _check_head(self, relpath: str, snapshot_id: str, snapshot: Snapshot) -> None:
        for record in snapshot.effects:
            age_ms = self.now_ms - record.since_ms
            if record.state is not EffectState.PLANNED and not record.key:
                message = f"effect {record.step!r} is {record.state.value} without a key"
                self.add("keyless-effect", relpath, message, snapshot_id)
            if record.state is EffectState.UNRESOLVED:
                message = f"effect {record.step!r} (key {record.key}): {record.reason}"
                self.add("effect-unresolved", relpath, message, snapshot_id)
            elif record.state is EffectState.SUBMITTED and age_ms > self.stuck_after_ms:
                message = f"effect {record.step!r} SUBMITTED {age_ms / 3_600_000:.1f} h ago"
                self.add("effect-stuck", relpath, message, snapshot_id)


@attrs.define
class _Vouches:
    """The walk's record of which slots the next slot names as its parent: those that no
    next slot names go to `doubted` (HEAD is judged on its own, TaskCheck._vouch_head)."""

    doubted: set[int]
    waiting: int | None = None  # the last slot read, until the next one names it

    def broken(self) -> None:
        """The next slot read does not follow the waiting one (a gap, an unreadable slot)."""
        if self.waiting is not None:
            self.doubted.add(self.waiting)
        self.waiting = None

    def read(self, seq: int, snapshot: Snapshot, previous: tuple[str, Snapshot] | None) -> None:
        """Slot `seq` read, `previous` the (id, snapshot) of the slot before it, if read."""
        if self.waiting is not None and (previous is None or snapshot.parent != previous[0]):
            self.doubted.add(self.waiting)
        self.waiting = seq

    def end(self, head: int) -> None:
        """The walk is over: a slot still waiting below HEAD had no readable next slot."""
        if self.waiting != head:
            self.broken()


# A view, not a Snapshot (see canonical_view): the clean path and the chain checks only
# read its attributes, and never keep it beyond this task.
_decode_clean_snapshot = canonical_view(Snapshot)


def _named_anyway(data: bytes) -> list[str]:
    """The ids a slot that is no Snapshot record still names, read as gc reads them."""
    try:
        return list(references.named_by("snapshot", codec.unframe(data)[1]))
    except (CastoreError, ValueError):
        return []


def _decode_snapshot(data: bytes, where: str) -> Snapshot:
    kind, body = codec.unframe(data, where)
    if kind != "snapshot":
        raise ValueError(f"a {kind}, not a snapshot")
    fast = decode_canonical(body, Snapshot)
    return fast or codec.from_builtins(codec.decode_value(body), Snapshot)


def _links_cleanly(snapshot: Snapshot, previous: tuple[str, Snapshot] | None) -> bool:
    """`snapshot` follows `previous` (id, snapshot) as _check_entry wants: the root starts
    the task, every other names its parent, keeps its plan and has a legal history."""
    transition = snapshot.transition
    if previous is None:
        return snapshot.parent is None and transition.kind is TransitionKind.START
    parent_id, parent = previous
    if (
        transition.kind is TransitionKind.START
        or snapshot.parent != parent_id
        or snapshot.plan != parent.plan
    ):
        return False
    return not illegal_changes(parent, snapshot)


def _lock_held(path: str) -> bool:
    """True if a worker holds the lock; asks with a shared, non-blocking flock (no write)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
