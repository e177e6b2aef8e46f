"""Forking a task: a new task whose first snapshot starts where an earlier snapshot of another
task stood, sharing that task's objects.

The fork's seq 0 is a START snapshot with the source's plan, frontier and environment anchor
and a `fork` field {task, seq, id, outcomes}. `outcomes` names a tree object whose `data`
holds every outcome the source had at `seq` (step -> [seq, result, receipt, result_ref]) and
whose `refs` name the result objects among them: the fork needs nothing else of the source,
so gc keeps what a live fork names even once the source is forgotten and reclaimed.

Effects: an effect CONFIRMED at the fork point is carried as done (its receipt). Any other
effect record must be PLANNED or NOT_DONE (ForkError for SUBMITTED or UNRESOLVED: whether it
happened is not known); it is carried as PLANNED with a key derived from the new task id,
so an effect after the fork point runs again in the fork, as a new request the service
cannot take for the source's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcome, outcome_of
from castore.chain.packwalk import read_pack
from castore.chain.refs import TaskSlots
from castore.chain.verify import VerifiedChain, decode_snapshot
from castore.errors import (
    CastoreError,
    ChainError,
    ConflictError,
    ForkError,
    FormatVersionError,
    StoreIOError,
    TaskExistsError,
    UsageError,
)
from castore.format import codec
from castore.format.layout import validate_object_id
from castore.format.model import attrs
from castore.format.records import (
    EffectRecord,
    EffectState,
    Fork,
    Snapshot,
    Transition,
    TransitionKind,
    Writer,
)
from castore.run.forget import as_v2, is_tombstone, refuse_forgotten
from castore.run.run import Run
from castore.run.settings import RunSettings, derive_key, derive_step_key, encode_snapshot

TREE_VERSION = 2  # the header version of a tree object (format v2)


@attrs.frozen
class Forked:
    """What a fork wrote: the new task's seq 0 and the tree of its carried outcomes."""

    task: str
    snapshot: str
    outcomes: str
    source: str
    seq: int
    carried: int  # how many outcomes the fork carries


def parse_ref(ref: str) -> tuple[str, int]:
    """("task", seq) from "task@seq" (the last '@' splits: a task id may hold one)."""
    task, at, seq = ref.rpartition("@")
    if not at or not task or not (seq.isascii() and seq.isdigit()):
        raise UsageError(f"{ref!r}: name the snapshot to fork as TASK@SEQ, as in invoice/42@3")
    return task, int(seq)


def fork(
    objects: ObjectStore,
    source: list[tuple[str, Snapshot]],
    seq: int,
    new_slots: TaskSlots,
    settings: RunSettings,
) -> Forked:
    """Write task `new_slots.task_id` as a fork at `seq` of the source task whose verified
    history (id, snapshot), newest first, is `source` (Store.history)."""
    snapshot_id, snapshot = _fork_point(source, seq)
    outcomes = carried_outcomes(objects, source, seq)
    tree_id, result_refs = _put_outcomes(objects, outcomes)
    new_task = new_slots.task_id
    now = settings.clock()
    start = Snapshot(
        task=new_task,
        seq=0,
        parent=None,
        plan=snapshot.plan,
        frontier=snapshot.frontier,
        effects=tuple(_replanned(new_task, snapshot, r, now) for r in snapshot.effects),
        transition=Transition(TransitionKind.START),
        env=snapshot.env,
        time_ms=now,
        writer=Writer.new_run(),
        fork=Fork(snapshot.task, seq, snapshot_id, tree_id),
        # A growing plan's decisions come along; a fork goes on, so it is not finished.
        grown=None if snapshot.grown is None else attrs.evolve(snapshot.grown, finished=False),
    )
    data = as_v2(encode_snapshot(start, settings))
    if new_slots.medium.exists(new_slots.chain_key):
        refuse_forgotten(new_slots)  # a forgotten id is never reused
    new_slots.medium.make_dir(new_slots.task_key)
    new_slots.medium.make_dir(new_slots.chain_key)
    try:
        head_id = new_slots.commit(
            data, 0, "<none: new task>", (snapshot.plan, tree_id, *result_refs)
        )
    except ConflictError:
        refuse_forgotten(new_slots)
        raise TaskExistsError(new_task) from None
    return Forked(new_task, head_id, tree_id, snapshot.task, seq, len(outcomes))


def _fork_point(source: list[tuple[str, Snapshot]], seq: int) -> tuple[str, Snapshot]:
    head = source[0][1]
    if not 0 <= seq <= head.seq:
        raise ForkError(
            head.task,
            seq,
            f"its HEAD is at sequence {head.seq}",
            f"give a sequence from 0 to {head.seq} (`castore log {head.task}` lists them)",
        )
    snapshot_id, snapshot = source[head.seq - seq]
    if is_tombstone(snapshot):
        raise ForkError(
            head.task,
            seq,
            "it is the task's tombstone",
            f"fork from an earlier sequence (0 to {seq - 1})",
        )
    for record in snapshot.effects:
        if record.state in (EffectState.SUBMITTED, EffectState.UNRESOLVED):
            raise ForkError(
                head.task,
                seq,
                f"effect {record.step!r} is {record.state.value} there (key {record.key}): "
                "whether it happened is not known, so the fork could neither skip nor redo it",
                "fork from a sequence before its submission or after it was settled "
                "(`castore log` shows where)",
            )
    return snapshot_id, snapshot


def _replanned(task_id: str, snapshot: Snapshot, record: EffectRecord, now_ms: int) -> EffectRecord:
    """An open effect record of the source as the fork's PLANNED record: a new key."""
    if snapshot.grown is not None:
        key = derive_step_key(task_id, record.step)
    else:
        key = derive_key(task_id, snapshot.plan, record.step)
    return EffectRecord(record.step, key, EffectState.PLANNED, now_ms)


def carried_outcomes(
    objects: ObjectStore, source: list[tuple[str, Snapshot]], seq: int
) -> dict[str, Outcome]:
    """Every step's newest outcome at `seq` of the source: its own snapshots 0..seq, and what
    its seq 0 carries if the source is itself a fork."""
    outcomes: dict[str, Outcome] = {}
    for _, snapshot in source[source[0][1].seq - seq :]:  # newest first
        _record(outcomes, snapshot)
    root = source[-1][1]
    if root.fork is not None:
        for step, outcome in read_outcomes(objects, root.task, root.fork).items():
            outcomes.setdefault(step, outcome)
    return outcomes


def _record(outcomes: dict[str, Outcome], snapshot: Snapshot) -> None:
    """The walk's rule (verify.py): the newest outcome of a step wins."""
    outcome = outcome_of(snapshot)
    if outcome is None or outcome.step in outcomes:
        return
    if snapshot.grown is None:  # a fixed plan's carried outcomes keep their v2.0 form
        outcome = attrs.evolve(outcome, index=None, args=None)
    outcomes[outcome.step] = outcome


def _put_outcomes(objects: ObjectStore, outcomes: dict[str, Outcome]) -> tuple[str, list[str]]:
    """Store the tree of carried outcomes; its id and the result objects it names."""
    data = {step: _entry(o) for step, o in sorted(outcomes.items())}
    refs = {step: o.result_ref for step, o in outcomes.items() if o.result_ref is not None}
    body = codec.encode_value({"data": data, "refs": refs})
    tree_id = objects.put_framed(codec.frame("tree", body, version=TREE_VERSION))
    return tree_id, sorted(set(refs.values()))


def _entry(outcome: Outcome) -> list[Any]:
    """A carried outcome as the tree holds it; a growing plan's with its position and
    argument digest too (FORMAT.md 7.2, Fork)."""
    entry = [outcome.seq, outcome.result, outcome.receipt, outcome.result_ref]
    if outcome.index is not None:
        entry += [outcome.index, outcome.args]
    return entry


def read_outcomes(objects: ObjectStore, task_id: str, fork_field: Fork) -> dict[str, Outcome]:
    """The outcomes a fork carries, from its tree object read by id (so hash-checked);
    ChainError naming the fork's task if the tree is missing, damaged or not such a tree."""
    tree_id = fork_field.outcomes
    try:
        value = codec.decode_value(objects.get(validate_object_id(tree_id), "tree"))
    except (FormatVersionError, StoreIOError):
        raise  # not damage: a newer castore's object, or the system failed the read
    except (CastoreError, ValueError) as exc:
        raise ChainError(
            task_id, f"the outcomes tree {tree_id} of the fork: {exc}", object_id=tree_id
        ) from exc
    try:
        return dict(_outcomes_in(value))
    except (TypeError, ValueError, KeyError) as exc:
        raise ChainError(
            task_id,
            f"the outcomes tree {tree_id} of the fork is not a fork's outcomes: {exc}",
            object_id=tree_id,
        ) from exc


def _outcomes_in(value: Any) -> Iterator[tuple[str, Outcome]]:
    data, refs = value["data"], value["refs"]
    if not isinstance(data, dict) or not isinstance(refs, dict):
        raise TypeError("data and refs must be objects")
    for step, entry in data.items():
        if not isinstance(entry, list) or len(entry) not in (4, 6):
            raise TypeError(f"step {step!r}: [seq, result, receipt, result_ref] expected")
        seq, result, receipt, result_ref = entry[:4]
        index, args = entry[4:] if len(entry) == 6 else (None, None)
        if type(seq) is not int or not isinstance(receipt, str | None):
            raise TypeError(f"step {step!r}: [seq, result, receipt, result_ref] expected")
        if not (type(index) is int or index is None) or not isinstance(args, str | None):
            raise TypeError(f"step {step!r}: [..., index, args] expected")
        if result_ref != refs.get(step):
            raise ValueError(f"step {step!r}: its result_ref is not the one the tree's refs name")
        yield step, Outcome(step, seq, result, result_ref, receipt, args=args, index=index)


def carried_by(objects: ObjectStore, chain: VerifiedChain) -> dict[str, Outcome]:
    """The outcomes the task's seq 0 carries if it is a fork (ChainError for a missing or
    damaged tree), else {}. `chain` was verified with its tail kept (`keep_tail`): seq 0 is
    the oldest pack's first snapshot, or the tail's first; both were verified by the walk."""
    packs = chain.outcomes.pack_refs  # newest first
    if packs:
        root_bytes = read_pack(objects, chain.task, packs[-1].id).first_bytes()
    elif len(chain.tail) == chain.length:
        root_bytes = chain.tail[0]
    else:
        raise ValueError("carried_by needs a chain verified with keep_tail=True")
    root = decode_snapshot(root_bytes)
    return {} if root.fork is None else read_outcomes(objects, chain.task, root.fork)


def carry_into(run: Run, carried: dict[str, Outcome]) -> None:
    """Give `run` the carried outcomes of the steps its own snapshots have not recorded
    (theirs are newer)."""
    for step, outcome in carried.items():
        if not run.done(step):
            run.carry_outcome(outcome)
