"""fsck of one task: its directory, its chain slots, links, plan, frontier and effect history."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Generator, Iterator
from typing import Any

import attrs

from castore import codec
from castore.digest import hash_bytes
from castore.effects import ALLOWED
from castore.errors import CastoreError
from castore.fsck.findings import Finding
from castore.fsck.objects import check_data, read_with_stat
from castore.fsck.tree import temp_finding
from castore.fsio import file_kind
from castore.layout import CHAIN_DIR, LOCK_NAME, TASKS_DIR, parse_slot_name, parse_temp_name
from castore.records import EffectState, Plan, Snapshot, TransitionKind

PlanReader = Callable[[str], Plan | None]  # a plan by id, or None if missing or damaged
_STATES = {state.value: state for state in EffectState}


class TaskCheck:
    """Checks one task directory; collects the object ids its chain refers to."""

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

    def finding(
        self, code: str, relpath: str, message: str, object_id: str | None = None
    ) -> Finding:
        return Finding(code, relpath, message, object_id, self.task_id)

    def run(self) -> Iterator[Finding]:
        directory = os.path.join(self.root, self.rel)
        chain_dir = os.path.join(directory, CHAIN_DIR)
        for path, rel in ((directory, self.rel), (chain_dir, f"{self.rel}/{CHAIN_DIR}")):
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                yield self.finding("no-chain", rel, "no chain directory")
                return
            if not stat.S_ISDIR(mode):
                kind = file_kind(mode)
                self.unreadable = True  # whatever it holds is not read, so not known
                yield self.finding("unsafe-file", rel, f"a {kind} where a directory belongs")
                return
        yield from self._directory_entries(directory)
        slots = yield from self._slots(chain_dir)
        if not slots:
            yield self.finding("no-chain", f"{self.rel}/{CHAIN_DIR}", "no slot 0")
            return
        head = max(slots)
        gaps = sorted(set(range(head + 1)) - set(slots))
        if gaps:
            yield self.finding("slot-gap", f"{self.rel}/{CHAIN_DIR}", f"missing slots {gaps[:10]}")
        yield from self._walk(chain_dir, head, set(slots))

    def _directory_entries(self, directory: str) -> Iterator[Finding]:
        for entry in os.scandir(directory):
            relpath = f"{self.rel}/{entry.name}"
            mode = entry.stat(follow_symlinks=False).st_mode
            if entry.name == LOCK_NAME:
                if not stat.S_ISREG(mode):
                    yield self.finding("unsafe-file", relpath, f"a {file_kind(mode)} as lock file")
                elif _lock_held(entry.path):
                    yield self.finding("lock-held", relpath, "a worker is running this task now")
            elif entry.name != CHAIN_DIR and not entry.name.startswith(".filelock"):
                yield self.finding("unknown-file", relpath, "not part of a task directory")

    def _slots(self, chain_dir: str) -> Generator[Finding, None, list[int]]:
        slots: list[int] = []
        for entry in os.scandir(chain_dir):
            relpath = f"{self.rel}/{CHAIN_DIR}/{entry.name}"
            seq = parse_slot_name(entry.name)
            if seq is not None:
                slots.append(seq)
            elif parse_temp_name(entry.name):
                yield attrs.evolve(temp_finding(self.root, relpath), task=self.task_id)
            else:
                yield self.finding("stray-file", relpath, "not a chain slot")
        return slots

    def _walk(self, chain_dir: str, head: int, present: set[int]) -> Iterator[Finding]:
        previous: tuple[str, dict[str, Any]] | None = None
        for seq in range(head + 1):
            if seq not in present:
                previous = None
                continue
            loaded = yield from self._load_slot(chain_dir, seq)
            if loaded is None:
                previous = None
                continue
            snapshot_id, entry, snapshot = loaded
            yield from self._check_entry(seq, snapshot_id, entry, snapshot, previous)
            previous = (snapshot_id, entry)
            if seq == head:
                yield from self._check_head(seq, snapshot_id, snapshot)

    def _load_slot(
        self, chain_dir: str, seq: int
    ) -> Generator[Finding, None, tuple[str, dict[str, Any], Snapshot] | None]:
        relpath = f"{self.rel}/{CHAIN_DIR}/{seq:016d}"
        try:
            data, info = read_with_stat(os.path.join(chain_dir, f"{seq:016d}"))
        except CastoreError as exc:
            self.unreadable = True
            yield self.finding("unsafe-file", relpath, str(exc))
            return None
        except OSError as exc:
            self.unreadable = True
            yield self.finding("read-error", relpath, str(exc))
            return None
        snapshot_id = hash_bytes(data)
        self.refs.add(snapshot_id)
        # A deferred object is judged where its own slot (same inode) is read; a copy of its
        # bytes elsewhere has the same hash, so it counts as intact here.
        intact = snapshot_id in self.known or snapshot_id in self.deferred
        parsed = None
        if snapshot_id in self.deferred and info.st_ino == self.deferred[snapshot_id][1]:
            self.checked.add(snapshot_id)
            report = check_data(self.deferred[snapshot_id][0], snapshot_id, data, info)
            yield from report.findings
            intact = not report.damaged
            if isinstance(report.record, Snapshot):
                parsed = (report.value, report.record)  # decoded once, used twice
        if snapshot_id in self.present and not intact:
            message = "the snapshot object of this slot is damaged (see its own finding)"
            yield self.finding("missing-object", relpath, message, snapshot_id)
        if snapshot_id not in self.present:
            yield self.finding(
                "slot-not-published", relpath, "no object of these bytes in objects/", snapshot_id
            )
        try:
            entry, snapshot = parsed or _decode_snapshot(data, relpath)
        except Exception as exc:  # noqa: BLE001 - every decoding failure is the same finding
            reason = (
                "file is empty" if not data else (str(exc) or type(exc).__name__).splitlines()[0]
            )
            self.unreadable = True
            yield self.finding("slot-corrupt", relpath, reason, snapshot_id)
            return None
        return snapshot_id, entry, snapshot

    def _check_entry(
        self,
        seq: int,
        snapshot_id: str,
        entry: dict[str, Any],
        snapshot: Snapshot,
        previous: tuple[str, dict[str, Any]] | None,
    ) -> Iterator[Finding]:
        relpath = f"{self.rel}/{CHAIN_DIR}/{seq:016d}"

        def bad(code: str, message: str) -> Finding:
            return self.finding(code, relpath, message, snapshot_id)

        if snapshot.seq != seq:
            yield bad("seq-mismatch", f"slot {seq} holds sequence {snapshot.seq}")
        if snapshot.task != self.task_id:
            yield bad("foreign-snapshot", f"a snapshot of task {snapshot.task!r}")
        if (snapshot.transition.kind is TransitionKind.START) != (seq == 0):
            yield bad(
                "root-not-start", f"sequence {seq} records a {snapshot.transition.kind.value}"
            )
        if snapshot.parent is not None:
            self.refs.add(snapshot.parent)  # named, so never "unreachable" (gc keeps it too)
        yield from self._check_refs(relpath, snapshot_id, snapshot)
        if previous is None:
            if seq == 0 and snapshot.parent is not None:
                yield bad("broken-link", f"sequence 0 names a parent {snapshot.parent}")
            yield from self._check_frontier(relpath, snapshot_id, snapshot)
            return
        parent_id, parent = previous
        if snapshot.parent != parent_id:
            code = "cycle" if snapshot.parent == snapshot_id else "broken-link"
            yield bad(code, f"parent is {snapshot.parent}, slot {seq - 1} holds {parent_id}")
        if snapshot.plan != parent["plan"] and not (
            snapshot.transition.kind is TransitionKind.OVERRIDE
            and snapshot.transition.replaced == parent["plan"]
        ):
            yield bad(
                "plan-changed", f"plan {snapshot.plan} follows {parent['plan']} without an override"
            )
        for message in effect_changes(parent, entry):
            yield bad("illegal-transition", message)
        yield from self._check_frontier(relpath, snapshot_id, snapshot)

    def _check_refs(self, relpath: str, snapshot_id: str, snapshot: Snapshot) -> Iterator[Finding]:
        """The plan and result blob a snapshot names exist, are intact and of that kind."""
        for ref, kind in ((snapshot.plan, "plan"), (snapshot.transition.result_ref, "blob")):
            if ref is None:
                continue
            self.refs.add(ref)
            if ref not in self.known:
                message = f"names {ref}, which is missing or damaged"
                yield self.finding("missing-object", relpath, message, snapshot_id)
            elif self.kinds.get(ref) != kind:
                message = f"names {ref} as a {kind}; it is a {self.kinds.get(ref)}"
                yield self.finding("missing-object", relpath, message, snapshot_id)

    def _check_frontier(
        self, relpath: str, snapshot_id: str, snapshot: Snapshot
    ) -> Iterator[Finding]:
        plan = self.read_plan(snapshot.plan)
        if plan is None:
            return
        index, step = snapshot.frontier.index, snapshot.frontier.step
        expected = plan.steps[index].id if 0 <= index < len(plan.steps) else None
        if not 0 <= index <= len(plan.steps) or step != expected:
            yield self.finding(
                "bad-frontier",
                relpath,
                f"frontier ({index}, {step!r}) does not fit the plan",
                snapshot_id,
            )
        effect_steps = {s.id for s in plan.steps if s.effect}
        for record in snapshot.effects:
            if record.step not in effect_steps:
                yield self.finding(
                    "bad-frontier",
                    relpath,
                    f"record for {record.step!r}, not an effect of the plan",
                    snapshot_id,
                )

    def _check_head(self, seq: int, snapshot_id: str, snapshot: Snapshot) -> Iterator[Finding]:
        relpath = f"{self.rel}/{CHAIN_DIR}/{seq:016d}"
        for record in snapshot.effects:
            age_ms = self.now_ms - record.since_ms
            if record.state is not EffectState.PLANNED and not record.key:
                yield self.finding(
                    "keyless-effect",
                    relpath,
                    f"effect {record.step!r} is {record.state.value} without a key",
                    snapshot_id,
                )
            if record.state is EffectState.UNRESOLVED:
                yield self.finding(
                    "effect-unresolved",
                    relpath,
                    f"effect {record.step!r} (key {record.key}): {record.reason}",
                    snapshot_id,
                )
            elif record.state is EffectState.SUBMITTED and age_ms > self.stuck_after_ms:
                yield self.finding(
                    "effect-stuck",
                    relpath,
                    f"effect {record.step!r} SUBMITTED {age_ms / 3_600_000:.1f} h ago",
                    snapshot_id,
                )


def _decode_snapshot(data: bytes, where: str) -> tuple[dict[str, Any], Snapshot]:
    kind, body = codec.unframe(data, where)
    if kind != "snapshot":
        raise ValueError(f"a {kind}, not a snapshot")
    entry = codec.decode_value(body)
    return entry, codec.from_builtins(entry, Snapshot)


def effect_changes(parent: dict[str, Any], child: dict[str, Any]) -> list[str]:
    """Every effect state change from `parent` to `child` that PROTOCOL.md does not allow."""
    before = {r["step"]: r["state"] for r in parent["effects"]}
    after = {r["step"]: r["state"] for r in child["effects"]}
    transition = child["transition"]
    moved = transition.get("step") if transition["kind"] in ("effect", "resolve") else None
    problems = []
    for step in sorted(set(before) | set(after)):
        old, new = before.get(step), after.get(step)
        if step == moved:
            new = new if new is not None else transition.get("effect_to")
            if transition.get("effect_from") != old:
                problems.append(
                    f"{step}: the transition says from {transition.get('effect_from')}, "
                    f"the parent has {old}"
                )
            if (
                old is None
                or new is None
                or _STATES.get(new) not in ALLOWED.get(_STATES.get(old, EffectState.CONFIRMED), ())
            ):
                problems.append(f"{step}: {old} -> {new} is not allowed")
        elif old != new and not (old is None and new == "PLANNED"):
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
