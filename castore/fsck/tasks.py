"""fsck of one task: its directory, its chain slots, links, plan, frontier and effect history."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable

import attrs

from castore import codec
from castore.digest import hash_bytes
from castore.effects import ALLOWED
from castore.errors import CastoreError
from castore.fastdecode import decode_canonical
from castore.fsck.findings import Finding
from castore.fsck.objects import check_data, read_with_stat
from castore.fsck.tree import temp_finding
from castore.fsio import file_kind
from castore.layout import CHAIN_DIR, LOCK_NAME, TASKS_DIR, parse_slot_name, parse_temp_name
from castore.records import EffectState, Plan, Snapshot, TransitionKind


@attrs.frozen
class PlanShape:
    """What the chain checks need of a plan: its step ids in order, and which are effects."""

    steps: tuple[str, ...]
    effects: frozenset[str]

    @classmethod
    def of(cls, plan: Plan) -> PlanShape:
        return cls(tuple(s.id for s in plan.steps), frozenset(s.id for s in plan.steps if s.effect))


PlanReader = Callable[[str], PlanShape | None]  # a plan by id, or None if missing or damaged


class TaskCheck:
    """Checks one task directory; collects the object ids its chain refers to.

    Findings are appended to one list rather than yielded through nested generators: the
    per-slot path runs for every snapshot of the store and is fsck's hot loop.
    """

    def __init__(
        self,
        root: str,
        *,
        name: str,
        task_id: str,
        read_plan: PlanReader,
        known: set[str],
        present: set[str],
        kinds: dict[str, str],
        deferred: dict[str, tuple[str, int]],
        now_ms: int,
        stuck_after_ms: int,
    ) -> None:
        self.root, self.task_id = root, task_id
        self.rel = f"{TASKS_DIR}/{name}"
        self.read_plan, self.known, self.present = read_plan, known, present
        self.kinds = kinds
        self.deferred = deferred
        self.checked: set[str] = set()  # deferred snapshot objects checked through a slot
        self.now_ms, self.stuck_after_ms = now_ms, stuck_after_ms
        self.refs: set[str] = set()
        self.unreadable = False  # a slot that could not be read or decoded
        self.found: list[Finding] = []

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
        if not slots:
            self.add("no-chain", f"{self.rel}/{CHAIN_DIR}", "no slot 0")
            return self.found
        head = max(slots)
        gaps = sorted(set(range(head + 1)) - set(slots))
        if gaps:
            self.add("slot-gap", f"{self.rel}/{CHAIN_DIR}", f"missing slots {gaps[:10]}")
        self._walk(chain_dir, head, set(slots))
        return self.found

    def _directory_entries(self, directory: str) -> None:
        for entry in os.scandir(directory):
            relpath = f"{self.rel}/{entry.name}"
            mode = entry.stat(follow_symlinks=False).st_mode
            if entry.name == LOCK_NAME:
                if not stat.S_ISREG(mode):
                    self.add("unsafe-file", relpath, f"a {file_kind(mode)} as lock file")
                elif _lock_held(entry.path):
                    self.add("lock-held", relpath, "a worker is running this task now")
            elif entry.name != CHAIN_DIR and not entry.name.startswith(".filelock"):
                self.add("unknown-file", relpath, "not part of a task directory")

    def _slots(self, chain_dir: str) -> list[int]:
        slots: list[int] = []
        for entry in os.scandir(chain_dir):
            relpath = f"{self.rel}/{CHAIN_DIR}/{entry.name}"
            seq = parse_slot_name(entry.name)
            if seq is not None:
                slots.append(seq)
            elif parse_temp_name(entry.name):
                self.found.append(attrs.evolve(temp_finding(self.root, relpath), task=self.task_id))
            else:
                self.add("stray-file", relpath, "not a chain slot")
        return slots

    def _walk(self, chain_dir: str, head: int, present: set[int]) -> None:
        previous: tuple[str, Snapshot] | None = None
        for seq in range(head + 1):
            if seq not in present:
                previous = None
                continue
            name = f"{seq:016d}"
            relpath = f"{self.rel}/{CHAIN_DIR}/{name}"
            loaded = self._load_slot(f"{chain_dir}/{name}", relpath)
            if loaded is None:
                previous = None
                continue
            snapshot_id, snapshot = loaded
            self._check_entry(relpath, seq, snapshot_id, snapshot, previous)
            previous = loaded
            if seq == head:
                self._check_head(relpath, snapshot_id, snapshot)

    def _load_slot(self, path: str, relpath: str) -> tuple[str, Snapshot] | None:
        try:
            data, info = read_with_stat(path)
        except CastoreError as exc:
            self.unreadable = True
            self.add("unsafe-file", relpath, str(exc))
            return None
        except OSError as exc:
            self.unreadable = True
            self.add("read-error", relpath, str(exc))
            return None
        snapshot_id = hash_bytes(data)
        self.refs.add(snapshot_id)
        # A deferred object is judged where its own slot (same inode) is read; a copy of its
        # bytes elsewhere has the same hash, so it counts as intact here.
        deferred = self.deferred.get(snapshot_id)
        intact = deferred is not None or snapshot_id in self.known
        parsed: Snapshot | None = None
        if deferred is not None and info.st_ino == deferred[1]:
            self.checked.add(snapshot_id)
            report = check_data(deferred[0], snapshot_id, data, info, hashed=snapshot_id)
            self.found.extend(report.findings)
            intact = not report.damaged
            if isinstance(report.record, Snapshot):
                parsed = report.record  # decoded once, used twice
        if not intact and snapshot_id in self.present:
            message = "the snapshot object of this slot is damaged (see its own finding)"
            self.add("missing-object", relpath, message, snapshot_id)
        if deferred is None and snapshot_id not in self.present:
            message = "no object of these bytes in objects/"
            self.add("slot-not-published", relpath, message, snapshot_id)
        if parsed is not None:
            return snapshot_id, parsed
        try:
            return snapshot_id, _decode_snapshot(data, relpath)
        except Exception as exc:  # noqa: BLE001 - every decoding failure is the same finding
            reason = (
                "file is empty" if not data else (str(exc) or type(exc).__name__).splitlines()[0]
            )
            self.unreadable = True
            self.add("slot-corrupt", relpath, reason, snapshot_id)
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
        self._check_ref(relpath, snapshot_id, snapshot.plan, "plan")
        if transition.result_ref is not None:
            self._check_ref(relpath, snapshot_id, transition.result_ref, "blob")
        if previous is None:
            if seq == 0 and snapshot.parent is not None:
                bad("broken-link", f"sequence 0 names a parent {snapshot.parent}")
        else:
            parent_id, parent = previous
            if snapshot.parent != parent_id:
                code = "cycle" if snapshot.parent == snapshot_id else "broken-link"
                bad(code, f"parent is {snapshot.parent}, slot {seq - 1} holds {parent_id}")
            if snapshot.plan != parent.plan and not (
                transition.kind is TransitionKind.OVERRIDE and transition.replaced == parent.plan
            ):
                bad(
                    "plan-changed",
                    f"plan {snapshot.plan} follows {parent.plan} without an override",
                )
            for message in effect_changes(parent, snapshot):
                bad("illegal-transition", message)
        self._check_frontier(relpath, snapshot_id, snapshot)

    def _check_ref(self, relpath: str, snapshot_id: str, ref: str, kind: str) -> None:
        """A plan or result blob a snapshot names exists, is intact and is of that kind."""
        self.refs.add(ref)
        if ref not in self.known:
            message = f"names {ref}, which is missing or damaged"
            self.add("missing-object", relpath, message, snapshot_id)
        elif self.kinds.get(ref) != kind:
            message = f"names {ref} as a {kind}; it is a {self.kinds.get(ref)}"
            self.add("missing-object", relpath, message, snapshot_id)

    def _check_frontier(self, relpath: str, snapshot_id: str, snapshot: Snapshot) -> None:
        plan = self.read_plan(snapshot.plan)
        if plan is None:
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


def _decode_snapshot(data: bytes, where: str) -> Snapshot:
    kind, body = codec.unframe(data, where)
    if kind != "snapshot":
        raise ValueError(f"a {kind}, not a snapshot")
    fast = decode_canonical(body, Snapshot)
    return fast or codec.from_builtins(codec.decode_value(body), Snapshot)


_MOVES_AN_EFFECT = (TransitionKind.EFFECT, TransitionKind.RESOLVE)


def effect_changes(parent: Snapshot, child: Snapshot) -> list[str]:
    """Every effect state change from `parent` to `child` that PROTOCOL.md does not allow."""
    transition = child.transition
    moved = transition.step if transition.kind in _MOVES_AN_EFFECT else None
    if moved is None and parent.effects == child.effects:
        return []  # the common case: a plain step, no effect changed
    before = {r.step: r.state for r in parent.effects}
    after = {r.step: r.state for r in child.effects}
    problems = []
    for step in sorted(set(before) | set(after)):
        old, new = before.get(step), after.get(step)
        if step == moved:
            new = new if new is not None else transition.effect_to
            if transition.effect_from != old:
                problems.append(
                    f"{step}: the transition says from {transition.effect_from}, "
                    f"the parent has {old}"
                )
            if old is None or new is None or new not in ALLOWED.get(old, ()):
                problems.append(f"{step}: {old} -> {new} is not allowed")
        elif old != new and not (old is None and new is EffectState.PLANNED):
            problems.append(f"{step}: {old} -> {new} without a transition naming it")
    return problems


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
