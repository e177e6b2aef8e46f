"""Walk and verify a task's chain from HEAD back to its plan root."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from castore import codec
from castore.digest import hash_bytes
from castore.effects import ChainClock
from castore.errors import (
    CastoreError,
    ChainError,
    FormatVersionError,
    IllegalHistoryError,
    StoreIOError,
    TaskNotFoundError,
    UnknownVersionError,
)
from castore.fastdecode import decode_canonical
from castore.history import illegal_changes
from castore.layout import missing_seqs, validate_object_id
from castore.objects import ObjectStore
from castore.records import EffectState, Plan, Snapshot, TransitionKind
from castore.refs import TaskSlots


@attrs.frozen
class Outcome:
    """What a finished step or effect left: its result (inline or blob) or its receipt."""

    step: str
    seq: int
    result: Any = None
    result_ref: str | None = None
    receipt: str | None = None


@attrs.frozen
class VerifiedChain:
    """A task's chain after every hash and link was checked."""

    task: str
    head: Snapshot
    head_id: str
    plan: Plan
    plan_id: str
    root_plan_id: str
    outcomes: dict[str, Outcome]
    ids: tuple[str, ...]  # every snapshot id, newest first
    clock: ChainClock = attrs.field(
        factory=ChainClock
    )  # what the chain shows of its writers' clocks

    @property
    def length(self) -> int:
        return len(self.ids)


def decode_snapshot(data: bytes) -> Snapshot:
    """A framed snapshot object as a record (no hash check: the caller verified it)."""
    kind, body = codec.unframe(data)
    if kind != "snapshot":
        raise codec.FrameError(f"a {kind}, not a snapshot", "wrong-kind")
    return codec.from_builtins(codec.decode_value(body), Snapshot)


def named_ids(entry: object) -> Iterator[str]:
    """The object ids a decoded (unverified) snapshot names: plan, parent, result blob.
    gc keeps and fsck checks exactly these, so both read them here."""
    if not isinstance(entry, dict):
        return
    transition = entry.get("transition")
    for value in (
        entry.get("plan"),
        entry.get("parent"),
        transition.get("result_ref") if isinstance(transition, dict) else None,
    ):
        if isinstance(value, str):
            yield value


def _decode_snapshot(task_id: str, object_id: str, data: bytes) -> Snapshot:
    """A snapshot object as its record; ChainError naming what is wrong with it."""
    try:
        kind, body = codec.unframe(data, object_id)
    except codec.FrameError as exc:
        raise ChainError(
            task_id, f"snapshot {object_id}: {exc.reason}", object_id=object_id
        ) from None
    if kind != "snapshot":
        raise ChainError(task_id, f"{object_id} is a {kind}, not a snapshot", object_id=object_id)
    fast = decode_canonical(body, Snapshot)  # every body castore writes takes this path
    if fast is not None:
        return fast
    try:
        decoded = codec.decode_value(body)
    except ValueError:
        raise ChainError(
            task_id, f"snapshot {object_id} does not decode", object_id=object_id
        ) from None
    if not isinstance(decoded, dict):
        raise ChainError(task_id, f"snapshot {object_id} is not a record", object_id=object_id)
    for name, types in _LINK_FIELDS.items():
        if name not in decoded or type(decoded[name]) not in types:
            raise ChainError(
                task_id, f"snapshot {object_id} lacks a valid {name!r} field", object_id=object_id
            )
    try:
        return codec.from_builtins(decoded, Snapshot)
    except Exception as exc:
        raise ChainError(
            task_id,
            f"snapshot {object_id} is not a valid snapshot record: {exc}",
            object_id=object_id,
        ) from exc


def _read_snapshot(objects: ObjectStore, task_id: str, object_id: object, seq: int) -> bytes:
    try:
        # objects.read validates the id before it becomes a path (once, not twice per walk).
        return objects.read(object_id if isinstance(object_id, str) else repr(object_id))
    except CastoreError as exc:
        if isinstance(exc, FormatVersionError | StoreIOError):
            raise
        raise ChainError(
            task_id,
            f"snapshot of sequence {seq} ({object_id}): {exc}",
            object_id=str(object_id),
            seq=seq,
        ) from exc


def _record_outcome(outcomes: dict[str, Outcome], snapshot: Snapshot) -> None:
    transition = snapshot.transition
    step = transition.step
    if step is None or step in outcomes:
        return  # the newest outcome of a step wins: the walk goes newest first
    if transition.kind is TransitionKind.STEP:
        outcomes[step] = Outcome(step, snapshot.seq, transition.result, transition.result_ref)
    elif transition.effect_to is EffectState.CONFIRMED:
        outcomes[step] = Outcome(step, snapshot.seq, receipt=transition.receipt)


def verify_chain(
    objects: ObjectStore, slots: TaskSlots, expected_plan: tuple[str, Plan] | None = None
) -> VerifiedChain:
    """Every hash, parent link, sequence number and the plan root of one task, or ChainError
    (UnknownVersionError for an object of a format version this castore does not read)."""
    try:
        return _verify(objects, slots, expected_plan)
    except FormatVersionError as exc:
        raise UnknownVersionError(slots.task_id, exc) from exc


def _verify(
    objects: ObjectStore, slots: TaskSlots, expected_plan: tuple[str, Plan] | None
) -> VerifiedChain:
    task_id = slots.task_id
    head_seq, slot_data = _read_head_slot(slots)
    _check_contiguous(slots, head_seq)
    head_id = hash_bytes(slot_data)
    # The slot and the object are one inode; reading the object proves it is published.
    data = _read_snapshot(objects, task_id, head_id, head_seq)
    outcomes: dict[str, Outcome] = {}
    current_id, expected_seq = head_id, head_seq
    head: Snapshot | None = None
    child: Snapshot | None = None
    clock = ChainClock()
    seen: list[str] = []
    seen_set: set[str] = set()
    while True:
        try:
            snapshot = _decode_snapshot(task_id, current_id, data)
            _check_link(task_id, current_id, snapshot, expected_seq, child)
        except ChainError as exc:
            if exc.seq is not None:
                raise
            raise exc.at_slot(expected_seq) from exc
        clock = clock.seen(snapshot.seq, snapshot.time_ms)
        if child is not None:
            _check_history(task_id, snapshot, child, seen[-1])
            clock = clock.linked(snapshot.time_ms, child.seq, child.time_ms)
        head = head or snapshot
        _record_outcome(outcomes, snapshot)
        seen.append(current_id)
        seen_set.add(current_id)
        parent = snapshot.parent
        if parent is None:  # sequence 0: _check_link saw to it
            break
        if parent in seen_set:  # unreachable while seq strictly decreases; kept as a guard
            raise ChainError(task_id, f"cycle: {current_id} names {parent} again", object_id=parent)
        data = _read_snapshot(objects, task_id, parent, expected_seq - 1)
        child, current_id, expected_seq = snapshot, parent, expected_seq - 1
    return _finish(
        objects,
        task_id=task_id,
        head=head,
        head_id=head_id,
        root_plan=snapshot.plan,
        outcomes=outcomes,
        ids=tuple(seen),
        expected_plan=expected_plan,
        clock=clock,
    )


def _check_head_frame(task_id: str, path: str, data: bytes, seq: int) -> None:
    """A HEAD slot whose own bytes are not a whole object (truncated, emptied) is said to be
    so: its hash names no object, which would otherwise read as a missing object."""
    try:
        codec.unframe(data, path)
    except codec.FrameError as exc:
        raise ChainError(
            task_id, f"HEAD slot {seq} is damaged: {exc.reason}", path, seq=seq
        ) from None


def _check_history(task_id: str, parent: Snapshot, child: Snapshot, child_id: str) -> None:
    """The same rules fsck applies (`illegal-transition`): an intact but forged link (an
    effect back to PLANNED, say) would otherwise make resume send it again."""
    problems = illegal_changes(parent, child)
    if problems:
        raise IllegalHistoryError(task_id, child.seq, child_id, problems)


def _read_head_slot(slots: TaskSlots) -> tuple[int, bytes]:
    """HEAD's sequence number (§9.4) and the bytes of its slot; TaskNotFoundError without
    slot 0, ChainError if the slot cannot be read or is not a whole object."""
    head_seq = slots.head_seq()
    if head_seq is None:
        raise TaskNotFoundError(slots.task_id)
    try:
        slot_data = slots.read(head_seq)
    except StoreIOError:
        raise  # the system could not read it: not a broken chain (and no backup to restore)
    except (OSError, CastoreError) as exc:
        raise ChainError(
            slots.task_id,
            f"HEAD slot {head_seq} unreadable: {exc}",
            slots.path(head_seq),
            seq=head_seq,
        ) from exc
    _check_head_frame(slots.task_id, slots.path(head_seq), slot_data, head_seq)
    return head_seq, slot_data


def _check_contiguous(slots: TaskSlots, head_seq: int) -> None:
    """Slots from the lowest kept (0, or above the sealed mark) to HEAD, no gap, nothing
    beyond. HEAD lookup is a binary search that trusts this; a deleted middle slot would
    otherwise roll HEAD back and let a second successor commit."""
    low = slots.lowest_kept()
    present = [seq for seq in slots.present() if seq >= low]  # sorted
    count, missing = missing_seqs([seq - low for seq in present], head_seq - low, shown=5)
    missing = [seq + low for seq in missing]
    beyond = max(present, default=0) > head_seq + 1
    # A commit racing this walk may add slots past HEAD (a listing may even show head+2
    # before head+1); only a slot still missing below a present one is damage.
    if beyond and not count and not slots.exists(head_seq + 1):
        count, missing = 1, [head_seq + 1]
    if count:
        raise ChainError(
            slots.task_id,
            f"chain slots are not contiguous: {len(present)} slots up to "
            f"{max(present, default=head_seq)}, "
            f"missing {missing}{'...' if count > 5 else ''}",
            slots.directory,
        )


# The fields the walk relies on, with their exact JSON types (full schema checks: fsck).
_LINK_FIELDS: dict[str, tuple[type, ...]] = {
    "task": (str,),
    "seq": (int,),
    "parent": (str, type(None)),
    "plan": (str,),
    "transition": (dict,),
}


def _check_link(
    task_id: str, object_id: str, entry: Snapshot, seq: int, child: Snapshot | None
) -> None:
    is_start = entry.transition.kind is TransitionKind.START
    if is_start != (seq == 0):
        raise ChainError(
            task_id,
            f"snapshot {object_id} at sequence {seq} records "
            f"{'a start' if is_start else 'no start'}; only sequence 0 starts a task",
            object_id=object_id,
        )
    if entry.task != task_id:
        raise ChainError(
            task_id, f"snapshot {object_id} belongs to task {entry.task!r}", object_id=object_id
        )
    if entry.seq != seq:
        raise ChainError(
            task_id,
            f"snapshot {object_id} has sequence {entry.seq}, expected {seq}",
            object_id=object_id,
        )
    if (entry.parent is None) != (seq == 0):
        raise ChainError(
            task_id,
            f"snapshot {object_id} at sequence {seq} has parent {entry.parent}",
            object_id=object_id,
        )
    if child is not None and entry.plan != child.plan:
        transition = child.transition
        if transition.kind is not TransitionKind.OVERRIDE or transition.replaced != entry.plan:
            raise ChainError(
                task_id,
                f"snapshot {object_id} names plan {entry.plan}, its child names {child.plan}",
                object_id=object_id,
            )


def _finish(
    objects: ObjectStore,
    *,
    task_id: str,
    head: Snapshot | None,
    head_id: str,
    root_plan: str,
    outcomes: dict[str, Outcome],
    ids: tuple[str, ...],
    expected_plan: tuple[str, Plan] | None,
    clock: ChainClock,
) -> VerifiedChain:
    if head is None:
        raise ChainError(task_id, "no snapshot was read", object_id=head_id)  # not reached
    if expected_plan is not None and expected_plan[0] == head.plan:
        # The caller's plan has the same digest: verify the stored bytes, skip decoding them.
        _read_plan_bytes(objects, task_id, head.plan)
        plan = expected_plan[1]
    else:
        plan = read_plan(objects, task_id, head.plan)
    if root_plan != head.plan:
        read_plan(objects, task_id, root_plan)  # the plan root must verify too
    return VerifiedChain(task_id, head, head_id, plan, head.plan, root_plan, outcomes, ids, clock)


def _head_record(
    task_id: str, head_id: str, head_entry: dict[str, Any], data: bytes | None = None
) -> Snapshot:
    if data is not None:
        # A canonical body (what writers write) decodes straight into the record, in C; the
        # strict conversion below decides otherwise, with its error message.
        fast = decode_canonical(codec.unframe(data, head_id)[1], Snapshot)
        if fast is not None:
            return fast
    try:
        return codec.from_builtins(head_entry, Snapshot)
    except Exception as exc:
        raise ChainError(
            task_id, f"HEAD {head_id} is not a valid snapshot record: {exc}", object_id=head_id
        ) from exc


def _read_plan_bytes(objects: ObjectStore, task_id: str, plan_id: str) -> None:
    try:
        objects.get(plan_id, "plan")
    except (FormatVersionError, StoreIOError):
        raise
    except CastoreError as exc:
        raise ChainError(task_id, f"plan {plan_id}: {exc}", object_id=plan_id) from exc


def read_plan(objects: ObjectStore, task_id: str, plan_id: str) -> Plan:
    """A plan object, verified and decoded; ChainError (or FormatVersionError) if it is not."""
    try:
        plan_body = objects.get(validate_object_id(plan_id), "plan")
        return codec.from_builtins(codec.decode_value(plan_body), Plan)
    except (FormatVersionError, StoreIOError):
        raise
    except CastoreError as exc:
        raise ChainError(task_id, f"plan {plan_id}: {exc}", object_id=str(plan_id)) from exc
    except Exception as exc:
        raise ChainError(
            task_id, f"plan {plan_id} is not a valid plan: {exc}", object_id=plan_id
        ) from exc


# -- Reading HEAD alone, and extending a verified HEAD -------------------------------------------
# status and watch must cost what is new, not the whole history. Both reuse the walk's rules
# (_read_head_slot, _read_snapshot, _decode_snapshot_body, _check_link, _head_record) rather
# than restating them; what they do not re-check below HEAD is said in FORMAT.md §11.3.


@attrs.frozen
class VerifiedHead:
    """A task's HEAD after its own slot, object, frame and link fields were checked: what
    status and watch judge a task by. Says nothing of the chain below HEAD unless it came
    from `verified_head(verify_chain(...))` or `extend_head`; `clock` is what the snapshots
    read so far say of the writers' clocks (effects.clock_doubt)."""

    task: str
    head: Snapshot
    head_id: str
    clock: ChainClock = attrs.field(factory=ChainClock)


def verified_head(chain: VerifiedChain) -> VerifiedHead:
    """The HEAD of a fully verified chain."""
    return VerifiedHead(chain.task, chain.head, chain.head_id, chain.clock)


def verify_head(objects: ObjectStore, slots: TaskSlots) -> VerifiedHead:
    """HEAD alone, checked as the full walk checks it, trusting the chain below (no slot
    listing, no parent read): ChainError if HEAD itself does not verify, UnknownVersionError
    for a format version this castore does not read, TaskNotFoundError without slot 0."""
    task_id = slots.task_id
    try:
        head_seq, slot_data = _read_head_slot(slots)
        head_id = hash_bytes(slot_data)
        # The slot and the object are one inode; reading the object proves it is published.
        data = _read_snapshot(objects, task_id, head_id, head_seq)
        head = _decode_snapshot(task_id, head_id, data)
        _check_link(task_id, head_id, head, head_seq, None)
        return VerifiedHead(task_id, head, head_id, ChainClock().seen(head.seq, head.time_ms))
    except FormatVersionError as exc:
        raise UnknownVersionError(task_id, exc) from exc


def extend_head(objects: ObjectStore, slots: TaskSlots, known: VerifiedHead) -> VerifiedHead:
    """`known` (a HEAD verified down to the plan root earlier) followed by the snapshots
    committed since, each checked as the full walk checks it, reading only those. Whatever
    does not fit (HEAD moved back, the remembered slot changed, a new slot missing, any
    check failing) is decided by the full `verify_chain`, which raises if the chain is broken.
    Damage below the remembered HEAD that leaves its slot intact is left to a full check."""
    try:
        extended = _extend(objects, slots, known)
    except (CastoreError, OSError):
        extended = None  # the full walk decides, and names the damage if there is any
    return extended or verified_head(verify_chain(objects, slots))


def check_walked_link(
    task_id: str,
    object_id: str,
    snapshot: Snapshot,
    seq: int,
    child: tuple[str, Snapshot] | None,
    *,
    clock: ChainClock,
) -> ChainClock:
    """Every rule for one link (`snapshot` at `seq`, and the (id, snapshot) after it) that
    the extension applies, as the full walk applies them; the clock with this link seen."""
    _check_link(task_id, object_id, snapshot, seq, child[1] if child else None)
    clock = clock.seen(snapshot.seq, snapshot.time_ms)
    if child is not None:
        _check_history(task_id, snapshot, child[1], child[0])
        clock = clock.linked(snapshot.time_ms, child[1].seq, child[1].time_ms)
    return clock


def _extend(objects: ObjectStore, slots: TaskSlots, known: VerifiedHead) -> VerifiedHead | None:
    task_id, known_seq = slots.task_id, known.head.seq
    head_seq, slot_data = _read_head_slot(slots)
    if head_seq < known_seq:
        return None
    # The cheap check that the chain below is still the one verified: the remembered HEAD's
    # slot still holds the remembered snapshot (its object is read with the full walk).
    known_data = slots.read(known_seq)
    if hash_bytes(known_data) != known.head_id:
        return None
    if head_seq == known_seq:
        return known
    if not all(slots.exists(seq) for seq in range(known_seq + 1, head_seq)):
        return None  # a gap among the new slots: the full walk's contiguity check names it
    head_id = hash_bytes(slot_data)
    data = _read_snapshot(objects, task_id, head_id, head_seq)
    current_id, seq = head_id, head_seq
    child: tuple[str, Snapshot] | None = None
    head: Snapshot | None = None
    clock = known.clock
    while True:  # from the new HEAD down to the oldest new snapshot, as the full walk goes
        snapshot = _decode_snapshot(task_id, current_id, data)
        clock = check_walked_link(task_id, current_id, snapshot, seq, child, clock=clock)
        head = head or snapshot
        if seq == known_seq + 1:
            break
        # _check_link saw that a snapshot past sequence 0 names a parent.
        data = _read_snapshot(objects, task_id, snapshot.parent, seq - 1)
        child = (current_id, snapshot)
        current_id, seq = str(snapshot.parent), seq - 1
    if snapshot.parent != known.head_id:
        return None  # another history than the one verified: the full walk decides
    # The link from the remembered HEAD to its first successor, checked as the walk checks it.
    clock = check_walked_link(
        task_id, known.head_id, known.head, known_seq, (current_id, snapshot), clock=clock
    )
    if head.plan != known.head.plan:
        read_plan(objects, task_id, head.plan)  # an override names a plan not verified yet
    return VerifiedHead(task_id, head, head_id, clock)
