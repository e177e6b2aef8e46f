"""The records castore stores: plans, snapshots and their parts, as frozen attrs classes.

Field names and types here are the on-disk schema (docs/FORMAT.md): v1's, plus the v2 fields,
which are omitted from the encoding while None (OMIT_IF_NONE).
"""

from __future__ import annotations

import enum
import functools
import itertools
import os
import typing
from typing import Any

from castore.format import identity, planmemo
from castore.format.model import attrs


class EffectState(enum.StrEnum):
    """Where a side effect stands (docs/explanation/protocol.md)."""

    PLANNED = "PLANNED"
    SUBMITTED = "SUBMITTED"
    CONFIRMED = "CONFIRMED"
    UNRESOLVED = "UNRESOLVED"
    NOT_DONE = "NOT_DONE"


class TransitionKind(enum.StrEnum):
    """What a snapshot records."""

    START = "start"  # the task was created: frontier at the first step
    STEP = "step"  # a plain step finished with a result
    EFFECT = "effect"  # an effect changed state
    RESOLVE = "resolve"  # a person decided an effect's outcome
    OVERRIDE = "override"  # a person accepted plan or environment drift
    SEAL = "seal"  # v2: no step; carries a new `sealed` anchor (a finished task, an upgrade)
    FORGET = "forget"  # v2: a person ended the task for good; nothing may follow it
    DECIDE = "decide"  # v2: a growing plan's next step was decided; the frontier moves to it
    FINISH = "finish"  # v2: a growing task said it is done; only seal or forget may follow


# Transition kinds a v1 reader does not know: a snapshot recording one is framed as version 2.
V2_KINDS = frozenset(
    {TransitionKind.SEAL, TransitionKind.FORGET, TransitionKind.DECIDE, TransitionKind.FINISH}
)
# Field metadata: the field is left out of the encoding while it is None. v2 fields carry it,
# so a snapshot that uses none of them keeps its v1 bytes (and id) exactly.
OMIT_IF_NONE = "castore.omit_if_none"


_NO_EFFECTS = itertools.repeat(False)


@attrs.frozen
class Step:
    """One step of a plan; `effect` steps change the outside world."""

    id: str
    effect: bool = False
    after: tuple[str, ...] = ()


@attrs.frozen
class Plan:
    """A job's steps in execution order (a topological order of their `after` edges).
    `grows` (v2): more steps are decided while the task runs (`Plan.grow`)."""

    name: str
    steps: tuple[Step, ...]
    meta: dict[str, Any] = attrs.field(factory=dict)
    grows: bool | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})

    @classmethod
    def build(cls, name: str, *steps: str | Step, **meta: Any) -> Plan:
        """A plan from step ids (plain steps) and `Step`s, each after the one before."""
        if steps and set(map(type, steps)) == {str}:
            # Step ids alone (a long fixed plan): built in C, and vouched for as plain and
            # chained, so that validating it later checks its ids only (planmemo).
            ids = typing.cast(tuple[str, ...], steps)
            afters = itertools.chain(((),), zip(ids[:-1]))
            plan = cls(name=name, steps=tuple(map(Step, ids, _NO_EFFECTS, afters)), meta=meta)
            if type(plan) is Plan and type(name) is str:  # what a memo needs (plans._memo)
                planmemo.remember(plan).ids = ids
            return plan
        built: list[Step] = []
        for item in steps:
            step = Step(item) if isinstance(item, str) else item
            if not step.after and built and isinstance(item, str):
                step = Step(step.id, step.effect, (built[-1].id,))
            built.append(step)
        return cls(name=name, steps=tuple(built), meta=meta)

    @classmethod
    def grow(cls, name: str, *initial_steps: str | Step, **meta: Any) -> Plan:
        """A growing plan (format v2): `initial_steps` (maybe none) as `build` makes them,
        then the steps the task decides as it runs (`run.at`, `run.append`)."""
        built = cls.build(name, *initial_steps, **meta)
        plan = cls(name=name, steps=built.steps, meta=meta, grows=True)
        memo = planmemo.known(built)
        if memo is not None and memo.chained and type(plan) is Plan:
            planmemo.remember(plan).ids = memo.ids
        return plan

    def index(self, step_id: str) -> int:
        """Position of `step_id` in the plan; KeyError if it is not a step of this plan."""
        for position, step in enumerate(self.steps):
            if step.id == step_id:
                return position
        raise KeyError(step_id)


def effect(step_id: str, *after: str) -> Step:
    """Shorthand for an effect step."""
    return Step(step_id, effect=True, after=tuple(after))


@attrs.frozen
class Writer:
    """Who wrote a snapshot: host, process, and a random id per run, so that two runs never
    write identical bytes (the commit point tells runs apart by snapshot id)."""

    host: str
    pid: int
    run: str

    @classmethod
    def new_run(cls) -> Writer:
        """This host and process, and a fresh random run id (8 bytes, as hex)."""
        return cls(identity.host_name(), os.getpid(), identity.token_hex(8))


@attrs.frozen
class Frontier:
    """How far the task got: `index` steps are done; `step` is the next one (None: finished)."""

    index: int
    step: str | None


@attrs.frozen
class EffectRecord:
    """An effect that is not CONFIRMED yet, as HEAD knows it."""

    step: str
    key: str | None
    state: EffectState
    since_ms: int
    attempts: int = 0
    first_submitted_ms: int | None = None
    idempotent: bool = False
    retention_s: int | None = None
    reconcilable: bool = False
    reason: str | None = None


@attrs.frozen
class Transition:
    """What changed between a snapshot and its parent."""

    kind: TransitionKind
    step: str | None = None
    result: Any = None
    result_ref: str | None = None
    effect_from: EffectState | None = None
    effect_to: EffectState | None = None
    receipt: str | None = None
    who: str | None = None
    why: str | None = None
    replaced: str | None = None
    # v2, growing plans: the step this transition decides (DECIDE, or a STEP that decides
    # and records at once), and the argument digest of a journaled call.
    decided: Step | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    args: str | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})


@attrs.frozen
class Sealed:
    """v2: the anchor of a task's sealed history: the newest pack, and the last sequence
    number it holds (docs/FORMAT.md 7.6)."""

    pack: str
    through: int


@attrs.frozen
class Fork:
    """v2: where a forked task's first snapshot came from. `id` is the source snapshot (for
    the record: the source may since be forgotten); `outcomes` is the tree object holding the
    outcomes the fork carries, the one part the fork needs and gc keeps."""

    task: str
    seq: int
    id: str
    outcomes: str


@attrs.frozen
class Grown:
    """v2: how far a growing plan has grown. `steps` decided at run time so far (beyond the
    base plan), `digest` the rolling plan digest over them (docs/FORMAT.md 7.9), `finished`
    once a FINISH transition said the task is done."""

    steps: int
    digest: str
    finished: bool = False


@attrs.frozen
class Snapshot:
    """One transition of a task; its object id is the blake3 of its framed bytes."""

    task: str
    seq: int
    parent: str | None
    plan: str
    frontier: Frontier
    effects: tuple[EffectRecord, ...]
    transition: Transition
    env: str | None
    time_ms: int
    writer: Writer
    sealed: Sealed | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    # v2, seq 0 of a fork only; omitted from the encoding when None
    fork: Fork | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})
    # v2, every snapshot of a task with a growing plan; omitted when None (a fixed plan)
    grown: Grown | None = attrs.field(default=None, metadata={OMIT_IF_NONE: True})

    def effect(self, step_id: str) -> EffectRecord | None:
        """The open record of effect `step_id`, or None if it has none."""
        for record in self.effects:
            if record.step == step_id:
                return record
        return None


@functools.cache  # a record class's fields never change; every commit asks twice
def omitted_fields(cls: type) -> tuple[str, ...]:
    """The fields of record class `cls` left out of its encoding while None (v2 fields)."""
    return tuple(f.name for f in attrs.fields(cls) if f.metadata.get(OMIT_IF_NONE))


def snapshot_version(snapshot: Snapshot) -> int:
    """The lowest format version whose readers understand `snapshot`: 2 if it uses a v2
    field or transition kind, else 1 (the same bytes a v1 writer would write)."""
    if snapshot.transition.kind in V2_KINDS:
        return 2
    if any(getattr(snapshot, name) is not None for name in omitted_fields(Snapshot)):
        return 2
    transition = snapshot.transition
    if transition.decided is not None or transition.args is not None:
        return 2
    return 1


@attrs.frozen
class BlobRef:
    """A reference to a blob object, as recorded in place of a large result."""

    blob: str
