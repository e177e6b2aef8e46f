"""What a resume brief is made from, read at the cost of the tail: HEAD, the plan object, what
the chain shows of its writers' clocks, and the few newest outcomes.

A run and a verified chain already hold all of it (the newest outcomes are looked up in the
tail, then in the newest packs). The CLI reads HEAD as `castore status` does and walks back
from it at most RECENT_WALK snapshots, then into the newest packs, so a 100,000-step task
briefs as fast as a 10-step one, however often it was sealed.
"""

from __future__ import annotations

from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcome, Outcomes, outcome_of
from castore.chain.packwalk import read_pack
from castore.chain.planread import read_plan
from castore.chain.refs import TaskSlots
from castore.chain.snapshotread import read_snapshot
from castore.chain.verify import VerifiedChain, check_walked_link, verify_head
from castore.errors import CastoreError, ChainError, FormatVersionError, StoreIOError
from castore.format.effects import ChainClock
from castore.format.fastdecode import plan_facts
from castore.format.layout import validate_object_id
from castore.format.links import decode_snapshot
from castore.format.model import attrs
from castore.format.records import Plan, Snapshot, TransitionKind

RECENT = 5  # the most finished steps a brief shows
RECENT_WALK = 64  # the most tail snapshots the CLI reads back from HEAD to find them


@attrs.frozen
class PlanFacts:
    """What a brief says of the base plan object: its name, its steps, whether it grows."""

    name: str
    steps: int
    grows: bool


def facts(plan: Plan) -> PlanFacts:
    return PlanFacts(plan.name, len(plan.steps), bool(getattr(plan, "grows", None)))


@attrs.frozen
class TaskView:
    """One task as a brief describes it; `recent` are the newest outcomes, newest first."""

    task: str
    head: Snapshot
    head_id: str
    plan: PlanFacts
    clock: ChainClock
    recent: tuple[Outcome, ...]


def view_of(
    task: str, head: Snapshot, head_id: str, plan: Plan, *, clock: ChainClock, outcomes: Outcomes
) -> TaskView:
    """The view of a run or a verified chain (what `Run.brief` passes)."""
    clock = clock.seen(head.seq, head.time_ms)
    return TaskView(task, head, head_id, facts(plan), clock, tuple(outcomes.newest(RECENT)))


def view_of_chain(chain: VerifiedChain) -> TaskView:
    """The view of a fully verified chain."""
    return view_of(
        chain.task,
        chain.head,
        chain.head_id,
        chain.plan,
        clock=chain.clock,
        outcomes=chain.outcomes,
    )


def view_of_head(objects: ObjectStore, slots: TaskSlots) -> TaskView:
    """HEAD checked as `status` checks it, its plan object, and the newest outcomes found by
    walking back from HEAD (each link checked as the full walk checks it), trusting the
    chain below what was read; ChainError if what was read does not verify."""
    verified = verify_head(slots)
    task, head = verified.task, verified.head
    plan = _plan_facts(objects, task, head.plan)
    found: dict[str, Outcome] = {}
    clock = verified.clock
    current_id, snapshot = verified.head_id, head
    floor = head.sealed.through + 1 if head.sealed is not None else 0
    if head.transition.kind is TransitionKind.FORGET:
        # Nothing is read below a tombstone: gc may have reclaimed it (FORMAT.md 9.6).
        return TaskView(task, head, verified.head_id, plan, clock, ())
    for _ in range(RECENT_WALK):
        outcome = outcome_of(snapshot)
        if outcome is not None and outcome.step not in found:
            found[outcome.step] = outcome
        if len(found) >= RECENT or snapshot.seq == floor:
            break
        parent = str(snapshot.parent)  # check_walked_link saw a parent past sequence 0
        older = decode_snapshot(task, parent, _read(objects, slots, parent, snapshot.seq - 1))
        child = (current_id, snapshot)
        clock = check_walked_link(task, parent, older, snapshot.seq - 1, child, clock=clock)
        current_id, snapshot = parent, older
    if len(found) < RECENT and snapshot.seq == floor and head.sealed is not None:
        _from_packs(objects, task, head.sealed.pack, found)
    recent = sorted(found.values(), key=lambda o: o.seq, reverse=True)
    return TaskView(task, head, verified.head_id, plan, clock, tuple(recent))


def _from_packs(
    objects: ObjectStore, task: str, pack_id: str | None, found: dict[str, Outcome]
) -> None:
    """Fill `found` up to RECENT from the newest packs (at most RECENT of them read)."""
    newer: list[dict[str, int]] = []
    for _ in range(RECENT):
        if pack_id is None or len(found) >= RECENT:
            return
        pack = read_pack(objects, task, pack_id)
        if pack.header.task != task:
            raise ChainError(
                task, f"pack {pack.id} is task {pack.header.task!r}'s", object_id=pack.id
            )
        index = pack.index()
        framed: list[bytes] | None = None
        for step, seq in sorted(index.items(), key=lambda item: item[1], reverse=True):
            if len(found) >= RECENT:
                break
            if step in found or any(step in n for n in newer):
                continue
            framed = framed if framed is not None else pack.inflate()
            data = framed[seq - pack.header.first_seq]
            outcome = outcome_of(decode_snapshot(task, pack.id, data))
            if outcome is None or outcome.step != step:
                raise ChainError(
                    task,
                    f"pack {pack.id}: its index puts step {step!r} at {seq}, whose snapshot "
                    "records no outcome of it",
                    object_id=pack.id,
                )
            found[step] = outcome
        newer.append(index)
        pack_id = pack.header.prev


def _plan_facts(objects: ObjectStore, task: str, plan_id: str) -> PlanFacts:
    """The facts of a plan object, hash-checked, its steps counted but not decoded (decoding
    the records of a 100,000-step plan would cost more than all the rest of the brief)."""
    try:
        body = objects.get(validate_object_id(plan_id), "plan")
    except (FormatVersionError, StoreIOError):
        raise
    except CastoreError as exc:
        raise ChainError(task, f"plan {plan_id}: {exc}", object_id=plan_id) from exc
    found = plan_facts(body)
    if found is None:
        # What the brief cannot describe is said as the strict reader says it.
        return facts(read_plan(objects, task, plan_id))
    return PlanFacts(*found)


def _read(objects: ObjectStore, slots: TaskSlots, object_id: str, seq: int) -> bytes:
    task = slots.task_id
    try:
        return read_snapshot(objects, slots, object_id, seq)  # by its name, else its slot
    except (FormatVersionError, StoreIOError):
        raise
    except CastoreError as exc:
        raise ChainError(
            task, f"snapshot of sequence {seq} ({object_id}): {exc}", object_id=object_id, seq=seq
        ) from exc
