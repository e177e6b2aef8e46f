"""Walk and verify a task's chain from HEAD back to its plan root."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcome, Outcomes, PackRef, outcome_of
from castore.chain.packwalk import verify_sealed
from castore.chain.planread import check_plan_bytes, read_plan
from castore.chain.refs import TaskSlots
from castore.chain.snapshotread import read_snapshot
from castore.errors import (
    CastoreError,
    ChainError,
    FormatVersionError,
    StoreIOError,
    TaskNotFoundError,
    UnknownVersionError,
)
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.effects import ChainClock
from castore.format.fastdecode import decode_canonical
from castore.format.layout import missing_seqs
from castore.format.links import check_anchor
from castore.format.links import check_history as _check_history
from castore.format.links import check_link as _check_link
from castore.format.links import decode_snapshot as _decode_snapshot
from castore.format.model import attrs
from castore.format.records import Plan, Sealed, Snapshot


@attrs.frozen
class VerifiedChain:
    """A task's chain after every hash and link was checked: the tail link by link, the
    sealed history (if any) through its packs. Holds no list of every snapshot: what it keeps
    costs the tail, and `outcomes` looks sealed steps up in their packs."""

    task: str
    head: Snapshot
    head_id: str
    plan: Plan
    plan_id: str
    root_plan_id: str
    outcomes: Outcomes
    length: int  # snapshots 0..HEAD
    clock: ChainClock = attrs.field(factory=ChainClock)  # what it shows of writers' clocks
    # The tail's framed snapshots, oldest first (only when asked for: the sealer uses them),
    # and the newest pack's last snapshot, the parent of the tail's oldest.
    tail: tuple[bytes, ...] = ()
    sealed_last: bytes | None = None


def decode_snapshot(data: bytes) -> Snapshot:
    """A framed snapshot object as a record (no hash check: the caller verified it)."""
    kind, body = codec.unframe(data)
    if kind != "snapshot":
        raise codec.FrameError(f"a {kind}, not a snapshot", "wrong-kind")
    return codec.from_builtins(codec.decode_value(body), Snapshot)


def named_ids(entry: object) -> Iterator[str]:
    """The object ids a decoded (unverified) snapshot names: plan, parent, result blob, pack.
    gc keeps and fsck checks exactly these, so both read them here."""
    if not isinstance(entry, dict):
        return
    transition = entry.get("transition")
    sealed = entry.get("sealed")
    for value in (
        entry.get("plan"),
        entry.get("parent"),
        transition.get("result_ref") if isinstance(transition, dict) else None,
        sealed.get("pack") if isinstance(sealed, dict) else None,
    ):
        if isinstance(value, str):
            yield value


def _read_snapshot(objects: ObjectStore, slots: TaskSlots, object_id: object, seq: int) -> bytes:
    """Snapshot `object_id`, verified, by its object name or else from its slot `seq` (a
    power loss may have taken the name, snapshotread.py); ChainError naming the slot if not."""
    task_id = slots.task_id
    try:
        # objects.read validates the id before it becomes a path (once, not twice per walk).
        name = object_id if isinstance(object_id, str) else repr(object_id)
        return read_snapshot(objects, slots, name, seq)
    except CastoreError as exc:
        if isinstance(exc, FormatVersionError | StoreIOError):
            raise
        raise ChainError(
            task_id,
            f"snapshot of sequence {seq} ({object_id}): {exc}",
            object_id=str(object_id),
            seq=seq,
        ) from exc


# A reader that meets a slot or object gone mid-walk (its writer sealed and pruned meanwhile)
# starts over from the new HEAD, this many times, before calling the chain broken.
_RESTARTS = 2


def verify_chain(
    objects: ObjectStore,
    slots: TaskSlots,
    expected_plan: tuple[str, Plan] | None = None,
    *,
    keep_tail: bool = False,
) -> VerifiedChain:
    """Every hash, parent link, sequence number and the plan root of one task, or ChainError
    (UnknownVersionError for an object of a format version this castore does not read): the
    tail link by link, the sealed history by its packs' digests. `keep_tail`: keep the tail's
    bytes in the result (a run seals from them)."""
    try:
        for attempt in range(_RESTARTS + 1):
            through = mark_through(slots)
            try:
                return _verify(objects, slots, expected_plan, keep_tail)
            except ChainError:
                # The mark only moves after a seal is durable, and moves before any prune:
                # unmoved, nothing was pruned under this walk and the damage is real.
                if attempt == _RESTARTS or mark_through(slots) == through:
                    raise
        raise AssertionError("not reached")
    except FormatVersionError as exc:
        raise UnknownVersionError(slots.task_id, exc) from exc


def mark_through(slots: TaskSlots) -> int | None:
    """The task's sealed mark (`through`), None without one; ChainError if it is damaged."""
    mark = slots.mark()
    return None if mark is None else mark.through


@attrs.define
class _Tail:
    """What the walk of the tail gathers."""

    outcomes: dict[str, Outcome] = attrs.field(factory=dict)
    anchors: set[Sealed] = attrs.field(factory=set)
    framed: list[bytes] = attrs.field(factory=list)
    clock: ChainClock = attrs.field(factory=ChainClock)


def _verify(
    objects: ObjectStore, slots: TaskSlots, expected_plan: tuple[str, Plan] | None, keep: bool
) -> VerifiedChain:
    task_id = slots.task_id
    head_seq, slot_data = _read_head_slot(slots)
    _check_contiguous(slots, head_seq)
    head_id = hash_bytes(slot_data)
    # A power loss may have taken the object's name (v2, FORMAT.md §13 "A lost snapshot
    # name"): HEAD is then read from its slot, verified by its frame and links.
    data = _read_snapshot(objects, slots, head_id, head_seq)
    head = _decode_at(task_id, head_id, data, head_seq, None)
    anchor = head.sealed
    floor = anchor.through + 1 if anchor is not None else 0
    tail = _Tail()
    current_id, expected_seq, snapshot = head_id, head_seq, head
    while True:  # HEAD down to the oldest unsealed snapshot, link by link
        tail.clock = tail.clock.seen(snapshot.seq, snapshot.time_ms)
        outcome = outcome_of(snapshot)
        if outcome is not None and outcome.step not in tail.outcomes:
            tail.outcomes[outcome.step] = outcome  # newest first: the newest outcome wins
        if snapshot.sealed is not None:
            tail.anchors.add(snapshot.sealed)
        if keep:
            tail.framed.append(data)
        if expected_seq == floor:
            break
        # _check_link saw that a snapshot past sequence 0 names a parent; sequence numbers
        # strictly decrease, so no walk can cycle.
        parent = str(snapshot.parent)
        data = _read_snapshot(objects, slots, parent, expected_seq - 1)
        older = _decode_at(task_id, parent, data, expected_seq - 1, snapshot)
        _check_history(task_id, older, snapshot, current_id)
        check_anchor(task_id, older, snapshot, current_id)
        tail.clock = tail.clock.linked(older.time_ms, snapshot.seq, snapshot.time_ms)
        current_id, expected_seq, snapshot = parent, expected_seq - 1, older
    root_plan, clock, sealed_last = snapshot.plan, tail.clock, None
    refs: tuple[PackRef, ...] = ()
    if anchor is not None:
        history = verify_sealed(
            objects, task_id, anchor, (current_id, snapshot), clock=tail.clock, named=tail.anchors
        )
        root_plan, refs, clock = history.root_plan, history.packs, history.clock
        sealed_last = history.last_bytes
    plan, plan_id = _plans(objects, task_id, head, root_plan, expected_plan)
    return VerifiedChain(
        task_id,
        head,
        head_id,
        plan,
        plan_id,
        root_plan,
        Outcomes(objects, task_id, tail.outcomes, refs),
        head_seq + 1,
        clock,
        tuple(reversed(tail.framed)),
        sealed_last,
    )


def _decode_at(
    task_id: str, object_id: str, data: bytes, seq: int, child: Snapshot | None
) -> Snapshot:
    """The snapshot at `seq` decoded and its link fields checked, errors naming the slot."""
    try:
        snapshot = _decode_snapshot(task_id, object_id, data)
        _check_link(task_id, object_id, snapshot, seq, child)
    except ChainError as exc:
        if exc.seq is not None:
            raise
        raise exc.at_slot(seq) from exc
    return snapshot


def _check_head_frame(slots: TaskSlots, data: bytes, seq: int) -> None:
    """A HEAD slot whose own bytes are not a whole object (truncated, emptied) is said to be
    so: its hash names no object, which would otherwise read as a missing object."""
    try:
        codec.unframe(data, "")
    # The slot's path only now: status checks thousands of HEADs that are whole.
    except FormatVersionError as exc:
        raise FormatVersionError(slots.path(seq), exc.found, exc.supported) from None
    except codec.FrameError as exc:
        raise ChainError(
            slots.task_id, f"HEAD slot {seq} is damaged: {exc.reason}", slots.path(seq), seq=seq
        ) from None


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
    _check_head_frame(slots, slot_data, head_seq)
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


def _plans(
    objects: ObjectStore,
    task_id: str,
    head: Snapshot,
    root_plan: str,
    expected_plan: tuple[str, Plan] | None,
) -> tuple[Plan, str]:
    """HEAD's plan, verified and decoded, and the plan root verified too."""
    if expected_plan is not None and expected_plan[0] == head.plan:
        # The caller's plan has the same digest: check the stored bytes hash to it (then they
        # are the caller's plan, a framed plan), skip decoding them.
        check_plan_bytes(objects, task_id, head.plan)
        plan = expected_plan[1]
    else:
        plan = read_plan(objects, task_id, head.plan)
    if root_plan != head.plan:
        read_plan(objects, task_id, root_plan)  # the plan root must verify too
    return plan, head.plan


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


def verify_head(slots: TaskSlots) -> VerifiedHead:
    """HEAD alone, checked as the full walk checks it, trusting the chain below (no parent
    read, no check for gaps): ChainError if HEAD itself does not verify, UnknownVersionError
    for a format version this castore does not read, TaskNotFoundError without slot 0."""
    task_id = slots.task_id
    try:
        head_seq, slot_data = _read_head_slot(slots)
        # The slot is a name of HEAD's object (a hard link, FORMAT.md §9.3) and its bytes are
        # HEAD's id by definition: they are what a read by that name would return, verified.
        # Whether the object name is still there (a power loss may take it, §13) is fsck's.
        head_id = hash_bytes(slot_data)
        head = _decode_snapshot(task_id, head_id, slot_data)
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
    data = _read_snapshot(objects, slots, head_id, head_seq)
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
        data = _read_snapshot(objects, slots, snapshot.parent, seq - 1)
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
