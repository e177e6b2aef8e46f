"""A task being worked on: its verified HEAD, and commits that advance it one step at a time."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcome
from castore.chain.refs import TaskSlots
from castore.chain.seal import Sealer, SealReport
from castore.chain.snapshotread import name_is_lost, restore_name
from castore.chain.trees import load_result, parts_reached
from castore.chain.verify import VerifiedChain, mark_through
from castore.errors import (
    CastoreError,
    CommitUncertainError,
    ConflictError,
    UsageError,
)
from castore.format.digest import hash_bytes
from castore.format.effects import ChainClock
from castore.format.links import decode_snapshot
from castore.format.model import attrs
from castore.format.plans import head_digest
from castore.format.records import (
    EffectRecord,
    EffectState,
    Frontier,
    Grown,
    Plan,
    Sealed,
    Snapshot,
    Transition,
    TransitionKind,
    Writer,
    snapshot_version,
)
from castore.medium.tasklock import HeldLock
from castore.run import gate, inflight
from castore.run.replay import Replay
from castore.run.settings import (
    RunSettings,
    effect_key,
    encode_snapshot,
    planned_record,
    refuse_recorded_secrets,
)

if TYPE_CHECKING:
    pass

_REACHED_KEPT = 1 << 16  # object ids remembered as reached by this run's commits


class RunCore:
    """A run's state and its commits: HEAD, the outcomes, the commit of a step or an effect
    transition, sealing, and the lifetime of the task lock. castore.run.run.Run adds what an
    agent calls (replay, journaled calls, the effect protocol, the brief)."""

    # The replay cursor, made by Run (it drives the whole Run): commits here move it on.
    _replay: Replay

    def __init__(
        self,
        objects: ObjectStore,
        slots: TaskSlots,
        chain: VerifiedChain,
        settings: RunSettings,
        lock: HeldLock | None,
    ) -> None:
        self.task_id = chain.task
        self.plan: Plan = chain.plan
        self.plan_id = chain.plan_id
        self.head: Snapshot = chain.head
        self.head_id = chain.head_id
        self._objects = objects
        self._slots = slots
        self._outcomes = chain.outcomes.copy()  # sealed steps are looked up in their packs
        # Every time the chain holds, as far as a retention decision must know them.
        self.chain_clock: ChainClock = chain.clock.seen(chain.head.seq, chain.head.time_ms)
        self._settings = settings
        self._lock = lock
        self._stale: CastoreError | None = None
        # HEAD may be a link whose directory fsync never happened (its writer was killed, or
        # got CommitUncertainError): a successor linked before it is durable could survive a
        # power loss without it, a gap no resume gets past. The first commit syncs it first.
        self._head_durable = False
        self._reached: set[str] = set()  # objects this run's acknowledged commits reach
        self._writer = Writer.new_run()
        # Set by resume when the environment check was deferred until in-flight effects settle.
        self.env_unverified = False
        self._sealer: Sealer | None = None
        self._prune_due = False
        self._base_ids: dict[str, int] | None = None  # the plan's step ids, when first needed
        if settings.seal_every is not None:
            self._sealer = Sealer(
                objects,
                slots,
                tail=chain.tail,
                anchor=chain.head.sealed,
                sealed_last=chain.sealed_last,
                every=settings.seal_every,
            )
            through = mark_through(slots)
            # A crash came between a seal's commit and its prune: the first commit of this run
            # finishes it, not the resume, so a run that only reads never writes (FORMAT.md
            # §12: a reader never writes; the chain reads the same either way).
            self._prune_due = chain.head.sealed is not None and (
                through is None or through < chain.head.sealed.through
            )

    # -- reading -------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """True when every step is done: a fixed plan's last, or a growing plan's FINISH."""
        if self.head.grown is not None:
            return self.head.grown.finished
        return self.head.frontier.step is None and not self.head.effects

    @property
    def grows(self) -> bool:
        """True if the task's plan grows as it runs (`Plan.grow`)."""
        return bool(self.plan.grows)

    @property
    def plan_digest(self) -> str:
        """The plan digest at HEAD: a growing plan's covers every step decided so far."""
        return head_digest(self.head)

    def done(self, step_id: str) -> bool:
        return step_id in self._outcomes

    def outcome(self, step_id: str) -> Outcome:
        """What step `step_id` left behind; KeyError if it is not done."""
        try:
            return self._outcomes[step_id]
        except KeyError:
            raise KeyError(f"step {step_id!r} of task {self.task_id!r} is not done") from None

    def result(self, step_id: str) -> Any:
        """The result of a finished plain step (loaded from its blob if stored by reference)."""
        found = self.outcome(step_id)
        if found.result_ref is not None:
            return load_result(self._objects, found.result_ref)
        return found.result

    def receipt(self, step_id: str) -> str | None:
        """The receipt a confirmed effect recorded."""
        return self.outcome(step_id).receipt

    def planned(self, step_id: str) -> EffectRecord:
        """The PLANNED record of effect `step_id` decided now, with its key."""
        key = effect_key(self.task_id, self.plan, self.plan_id, step_id)
        return EffectRecord(step_id, key, EffectState.PLANNED, self._settings.clock())

    def snapshot_at(self, seq: int) -> Snapshot | None:
        """The snapshot of this task at `seq`, from its slot or the sealed pack holding it;
        None when neither is there any more (a look-back for an error message)."""
        data: bytes | None
        try:
            data = self._slots.read(seq)
        except (OSError, CastoreError):
            data = self._outcomes.snapshot_bytes(seq)
        if data is None:
            return None
        snapshot = decode_snapshot(self.task_id, hash_bytes(data), data)
        return snapshot if snapshot.seq == seq else None

    def advance(
        self,
        transition: Transition,
        effects: tuple[EffectRecord, ...],
        *,
        move_frontier: bool = False,
        frontier: Frontier | None = None,
        plan_id: str | None = None,
        sealed: Sealed | None = None,
        packs_written: tuple[str, ...] = (),
        grown: Grown | None = None,
    ) -> str:
        """Commit one transition as the successor of HEAD. Any loss makes this run stale.
        The snapshot carries `sealed`, else a pack the sealer published since the last
        commit, else HEAD's anchor (v2: an anchor is carried forward, never dropped);
        `packs_written`: the older packs `sealed` reaches through prev that no commit names."""
        if self._stale is not None:
            raise self._stale
        self._finish_prune_if_due()
        # Until an in-flight effect is settled, a changed environment is unexplained: keep the
        # old anchor rather than adopt the new one silently. (live_env may hash a whole tree:
        # it is computed once per commit.)
        anchor = self.head.env if self.env_unverified else self._settings.live_env()
        if self.env_unverified and not gate.in_flight(self.head):
            anchor = self._settings.live_env()
            gate.check_environment(self.task_id, self.head, anchor)
            self.env_unverified = False
        if anchor != self.head.env:  # a new anchor; the one already recorded is not re-judged
            refuse_recorded_secrets(None, anchor, self._settings)
        if frontier is None:
            frontier = self.head.frontier
            if move_frontier:
                frontier = self._frontier_at(frontier.index + 1)
                effects = self._plan_effect(effects, frontier)
        snapshot = Snapshot(
            task=self.task_id,
            seq=self.head.seq + 1,
            parent=self.head_id,
            plan=plan_id or self.plan_id,
            frontier=frontier,
            effects=tuple(sorted(effects, key=lambda r: r.step)),
            transition=transition,
            env=anchor,
            time_ms=self._settings.clock(),
            writer=self._writer,
            sealed=sealed or self._next_anchor(),
            grown=grown or self.head.grown,
        )
        version = snapshot_version(snapshot)
        if version > self._settings.version:
            raise UsageError(
                f"task {self.task_id!r}: this commit writes format-2 records into a "
                f"format-{self._settings.version} store; run `castore upgrade` first"
            )
        data = encode_snapshot(snapshot, self._settings, version)
        if not self._head_durable:
            if self._settings.version >= 2 and name_is_lost(self._objects, self.head_id):
                # A power loss took HEAD's object name (v2 commits leave it unsynced): back
                # before a successor names HEAD (FORMAT.md §13, "A lost snapshot name").
                restore_name(self._objects, self._slots.key(self.head.seq), self.head_id)
            self._slots.medium.flush_dir(self._slots.chain_key)
            self._head_durable = True
        # What no earlier slot names: gc could remove it before it sees this commit (refs.py).
        # Trees an acknowledged commit of this run reached are kept by gc as long as that
        # slot is there: not opened again, so a result naming a long history costs its news.
        reached = (
            parts_reached(self._objects, transition.result_ref, self._reached)
            if transition.result_ref
            else []
        )
        relies_on = [*reached, *([plan_id] if plan_id is not None else [])]
        if snapshot.sealed is not None and snapshot.sealed != self.head.sealed:
            # A pack published a while ago is unreferenced until this commit names it.
            relies_on += [snapshot.sealed.pack, *packs_written]
        try:
            snapshot_id = self._slots.commit(data, snapshot.seq, self.head_id, relies_on)
        except (ConflictError, CommitUncertainError) as exc:
            self._stale = exc  # the run no longer knows HEAD: it must stop and resume
            raise
        if len(self._reached) > _REACHED_KEPT:
            self._reached.clear()
        self._reached.update(reached)
        self.chain_clock = self.chain_clock.linked(
            self.head.time_ms, snapshot.seq, snapshot.time_ms
        )
        self.head, self.head_id = snapshot, snapshot_id
        if self._sealer is not None:
            self._sealer.committed(data, snapshot)
        return snapshot_id

    def _finish_prune_if_due(self) -> None:
        """A seal's prune a crash cut short (see __init__): done before this run's first commit."""
        if self._prune_due and self._sealer is not None:
            self._prune_due = False
            self._sealer.finish_prune()

    def _next_anchor(self) -> Sealed | None:
        return self._sealer.next_anchor() if self._sealer is not None else self.head.sealed

    # -- sealing (format v2) --------------------------------------------------------------
    def sealed_through_head(self) -> bool:
        """True if HEAD is a SEAL commit whose anchor holds everything before it."""
        head = self.head
        return (
            head.transition.kind is TransitionKind.SEAL
            and head.sealed is not None
            and head.sealed.through == head.seq - 1
        )

    def seal_now(self) -> SealReport:
        """Seal everything up to HEAD (packs built now), then commit a SEAL snapshot naming
        the newest pack; its mark and prune follow before this returns."""
        if self._sealer is None:
            raise UsageError(
                f"task {self.task_id!r} is in a format v1 store, which has no packs: "
                "run `castore upgrade` first"
            )
        if self.sealed_through_head():
            return SealReport(self.task_id, (), self.head.sealed, None)
        anchor, written = self._sealer.seal_all()
        snapshot_id = self.advance(
            Transition(TransitionKind.SEAL),
            self.head.effects,
            sealed=anchor,
            packs_written=tuple(pack for pack in written if pack != anchor.pack),
        )
        self._sealer.drain()
        if self._sealer.error is not None:
            raise self._sealer.error
        return SealReport(self.task_id, tuple(written), anchor, snapshot_id)

    def now_ms(self) -> int:
        return self._settings.clock()

    def live_env(self) -> str | None:
        return self._settings.live_env()

    def record_outcome(self, outcome: Outcome) -> None:
        """An outcome HEAD just recorded (its index: the frontier it moved from)."""
        if outcome.index is None:
            outcome = attrs.evolve(outcome, index=self.head.frontier.index - 1)
        self._outcomes.record(outcome)
        if outcome.index is not None:
            self._replay.passed(outcome.index)

    def carry_outcome(self, outcome: Outcome) -> None:
        """An outcome from elsewhere than HEAD (a fork's carried ones): the cursor stays."""
        self._outcomes.record(outcome)

    @property
    def objects(self) -> ObjectStore:
        """The store's objects (a journaled call puts a large result there before its commit)."""
        return self._objects

    @property
    def allow_fields(self) -> Collection[str]:
        """The fields this run's caller vouched for (the secret guard skips them)."""
        return self._settings.allow_fields

    @functools.cached_property
    def task_place(self) -> str:
        """The task as the medium names it (the store's identity and the chain's key): what
        identifies the task in this process, however and from wherever the store was opened
        (castore.run.inflight). Never a path string: `os.path.realpath` of an s3:// URL is
        relative to the working directory, which a process may change between two runs."""
        return f"{self._slots.medium.identity}/{self._slots.chain_key}"

    @property
    def run_id(self) -> str:
        """This run's random id, the `writer.run` of the snapshots it commits."""
        return self._writer.run

    @property
    def writes_v2(self) -> bool:
        """True in a format-2 store (raw and tree objects may be written)."""
        return self._settings.seal_every is not None

    def _frontier_at(self, index: int) -> Frontier:
        """The frontier at `index`: a plan step there, else None (done, or a growing plan
        waiting for its next decision)."""
        steps = self.plan.steps
        return Frontier(index, steps[index].id if index < len(steps) else None)

    def _plan_effect(
        self, effects: tuple[EffectRecord, ...], frontier: Frontier
    ) -> tuple[EffectRecord, ...]:
        """Persist the key of the effect the frontier reaches, before anyone may submit it."""
        now = self._settings.clock()
        planned = planned_record(self.task_id, self.plan, self.plan_id, frontier.index, now)
        return effects if planned is None else (*effects, planned)

    @property
    def stale(self) -> bool:
        """True once a commit of this run lost: it must stop and the task be resumed anew."""
        return self._stale is not None

    # -- lifetime --------------------------------------------------------------------------
    def close(self, *, finish: bool = True) -> None:
        """Release the task's local lock (the run may not commit afterwards): at once, or,
        while a send or call of the run still runs in a pool thread, when it has ended
        (castore.run.inflight). In a v2 store, a finished task is first sealed whole (one SEAL
        commit) and the sealing thread joined; an error it met is raised here.
        `finish=False` (an exception is in flight): no seal."""
        try:
            if self._sealer is not None:
                self._close_sealer(self._sealer, finish)
        finally:
            if self._lock is not None:
                lock, self._lock = self._lock, None
                # A send or call of this run still running (in a pool thread, its await
                # cancelled) keeps the task: whoever takes the lock next knows it has ended.
                inflight.after_sends(self, lock.release)
            if self._stale is None:
                self._stale = UsageError(
                    f"the run of task {self.task_id!r} is closed; resume the task"
                )

    def _close_sealer(self, sealer: Sealer, finish: bool) -> None:
        try:
            due = self.finished and not self.sealed_through_head() and sealer.worth_finishing()
            if finish and self._stale is None and due:
                # Another writer moved HEAD on: this run is stale now, and that one seals.
                with contextlib.suppress(ConflictError):
                    self.seal_now()
        finally:
            self._sealer = None
            sealer.close()
        if sealer.error is not None and finish:
            raise sealer.error
