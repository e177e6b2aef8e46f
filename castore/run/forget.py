"""Forgetting a task: a tombstone committed at HEAD + 1 through the ordinary commit point.

The tombstone is a snapshot like any other (kind `forget`, who and why), so it wins or loses
by the same exclusive link as every commit: a writer racing it loses with ConflictError,
and nothing may follow it (history.py). After it, start, resume and open_task refuse the
task with TaskForgottenError; gc may then reclaim its history (reclaim.py).
"""

from __future__ import annotations

from castore.chain.objects import ObjectStore
from castore.chain.refs import TaskSlots
from castore.chain.verify import VerifiedHead, verify_head
from castore.errors import (
    ChainError,
    ConflictError,
    ForgetRefusedError,
    TaskForgottenError,
    TaskNotFoundError,
    UsageError,
)
from castore.format import codec
from castore.format.effects import when_text
from castore.format.model import attrs
from castore.format.records import EffectState, Snapshot, Transition, TransitionKind, Writer
from castore.run.settings import RunSettings, encode_snapshot

# A forget that loses the link to a live writer tries again on the new HEAD this often.
_TRIES = 3
_IN_FLIGHT = (EffectState.SUBMITTED, EffectState.UNRESOLVED)


@attrs.frozen
class Forgotten:
    """The tombstone a forget committed (or found: forgetting twice changes nothing)."""

    task: str
    seq: int
    id: str
    time_ms: int
    who: str | None
    why: str | None
    already: bool = False


def is_tombstone(snapshot: Snapshot) -> bool:
    return snapshot.transition.kind is TransitionKind.FORGET


def forgotten_error(task_id: str, tombstone: Snapshot) -> TaskForgottenError:
    transition = tombstone.transition
    return TaskForgottenError(task_id, when_text(tombstone.time_ms), transition.who, transition.why)


def tombstone_head(slots: TaskSlots) -> VerifiedHead | None:
    """The task's HEAD if it is a tombstone (HEAD checked as status checks it); None if the
    task does not exist or its HEAD is not a tombstone."""
    try:
        verified = verify_head(slots)
    except TaskNotFoundError:
        return None
    return verified if is_tombstone(verified.head) else None


def refuse_forgotten(slots: TaskSlots) -> None:
    """TaskForgottenError if the task ends with a tombstone. A HEAD that does not verify is
    left to the caller's own checks (ChainError from the walk, TaskExistsError from start)."""
    try:
        found = tombstone_head(slots)
    except ChainError:
        return
    if found is not None:
        raise forgotten_error(slots.task_id, found.head)


def as_v2(data: bytes) -> bytes:
    """A framed snapshot under header version 2: it records what only a v2 reader knows (a
    tombstone, a fork), so a v1 reader must refuse it as a version, not call it corrupt."""
    kind, body = codec.unframe(data)
    return codec.frame(kind, body, version=2)


def _required(text: str, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"forget needs {what}: say who forgets the task and why, for the audit")
    return text.strip()


def forget(
    objects: ObjectStore,
    slots: TaskSlots,
    settings: RunSettings,
    *,
    who: str,
    why: str,
    force_in_flight: bool = False,
    only_if_head: str | None = None,
) -> Forgotten:
    """Commit the tombstone of `slots`' task at HEAD + 1 (see the module docstring). With
    `only_if_head`, ConflictError instead if HEAD is not (or no longer) that snapshot."""
    who, why = _required(who, "who"), _required(why, "why")
    for attempt in range(_TRIES):
        verified = verify_head(slots)  # TaskNotFoundError without slot 0
        head = verified.head
        if only_if_head is not None and verified.head_id != only_if_head:
            raise ConflictError(slots.task_id, only_if_head, verified.head_id, head.seq)
        if is_tombstone(head):
            transition = head.transition
            return Forgotten(
                slots.task_id,
                head.seq,
                verified.head_id,
                head.time_ms,
                transition.who,
                transition.why,
                already=True,
            )
        if not force_in_flight:
            for record in head.effects:
                if record.state in _IN_FLIGHT:
                    raise ForgetRefusedError(
                        slots.task_id, record.step, record.state.value, record.key
                    )
        tombstone = attrs.evolve(
            head,
            seq=head.seq + 1,
            parent=verified.head_id,
            transition=Transition(TransitionKind.FORGET, who=who, why=why),
            time_ms=settings.clock(),
            writer=Writer.new_run(),
            fork=None,  # only a fork's first snapshot says where it came from
        )
        data = as_v2(encode_snapshot(tombstone, settings))
        # HEAD may be a link its writer never synced: the tombstone must not outlive it.
        slots.medium.flush_dir(slots.chain_key)
        try:
            snapshot_id = slots.commit(data, tombstone.seq, verified.head_id)
        except ConflictError:
            if attempt == _TRIES - 1:
                raise
            continue  # a writer committed first: judge its HEAD and try again
        return Forgotten(slots.task_id, tombstone.seq, snapshot_id, tombstone.time_ms, who, why)
    raise AssertionError("not reached")  # the loop returns or raises
