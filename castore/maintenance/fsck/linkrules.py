"""fsck's rules for one link of a chain: what a snapshot must say of itself, of the slot
before it and of the plan it names (TaskCheck applies them to every slot it reads)."""

from __future__ import annotations

from castore.chain import references
from castore.chain.trees import PART_KINDS
from castore.errors import CastoreError
from castore.format import codec
from castore.format.fastdecode import canonical_view, decode_canonical
from castore.format.growth import frontier_problems
from castore.format.history import illegal_changes
from castore.format.records import EffectState, Snapshot, TransitionKind
from castore.maintenance.fsck.findings import Finding
from castore.maintenance.fsck.named import NamedObjects, PlanShape


class LinkRules:
    """The checks of one snapshot as a link of its chain, for TaskCheck; findings go to
    `found`, every id named to `refs`."""

    def __init__(self, task_id: str, named: NamedObjects, now_ms: int, stuck_after_ms: int) -> None:
        self.task_id, self.named = task_id, named
        self.now_ms, self.stuck_after_ms = now_ms, stuck_after_ms
        self.refs: set[str] = set()  # every id the chain names or is made of
        self.found: list[Finding] = []
        self._plan_id: str | None = None  # the plan of the last clean slot, and its shape
        self._plan: PlanShape | None = None

    def add(self, code: str, relpath: str, message: str, object_id: str | None = None) -> None:
        self.found.append(Finding(code, relpath, message, object_id, self.task_id))

    def fits_chain(
        self, seq: int, snapshot: Snapshot, previous: tuple[str, Snapshot] | None
    ) -> bool:
        """check_entry and _check_frontier would find nothing to say of `snapshot`."""
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

    def check_entry(
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

    def check_head(self, relpath: str, snapshot_id: str, snapshot: Snapshot) -> None:
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


# A view, not a Snapshot (see canonical_view): the clean path and the chain checks only
# read its attributes, and never keep it beyond this task.
decode_clean_snapshot = canonical_view(Snapshot)


def named_anyway(data: bytes) -> list[str]:
    """The ids a slot that is no Snapshot record still names, read as gc reads them."""
    try:
        return list(references.named_by("snapshot", codec.unframe(data)[1]))
    except (CastoreError, ValueError):
        return []


def decode_slot(data: bytes, where: str) -> Snapshot:
    kind, body = codec.unframe(data, where)
    if kind != "snapshot":
        raise ValueError(f"a {kind}, not a snapshot")
    fast = decode_canonical(body, Snapshot)
    return fast or codec.from_builtins(codec.decode_value(body), Snapshot)


def _links_cleanly(snapshot: Snapshot, previous: tuple[str, Snapshot] | None) -> bool:
    """`snapshot` follows `previous` (id, snapshot) as check_entry wants: the root starts
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
