"""A task being worked on: its verified HEAD, and commits that advance it one step at a time."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import socket
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

from castore.chain.briefview import view_of
from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcome
from castore.chain.refs import TaskSlots
from castore.chain.seal import Sealer, SealReport
from castore.chain.snapshotread import name_is_lost, restore_name
from castore.chain.trees import load_result, parts_reached, stored_result
from castore.chain.verify import VerifiedChain, mark_through
from castore.errors import (
    CastoreError,
    CommitUncertainError,
    ConflictError,
    PlanTooLongError,
    StepRepeatedError,
    UsageError,
)
from castore.format import codec, guard, limits
from castore.format.digest import hash_bytes, hash_chunks
from castore.format.effects import ChainClock, NextAction, Service
from castore.format.layout import validate_object_id
from castore.format.links import decode_snapshot
from castore.format.plans import head_digest, roll_digest, validate_step_id
from castore.format.records import (
    EffectRecord,
    EffectState,
    Frontier,
    Grown,
    Plan,
    Sealed,
    Snapshot,
    Step,
    Transition,
    TransitionKind,
    Writer,
    snapshot_version,
)
from castore.medium import fsio
from castore.medium.tasklock import TaskLock
from castore.run import gate, inflight, journal, protocol
from castore.run.brief import Brief, make_brief
from castore.run.replay import Position, Replay

if TYPE_CHECKING:
    from castore.run.protocol import Call

EnvSource = str | Callable[[], str | None] | None
Clock = Callable[[], int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def derive_key(task_id: str, plan_id: str, step_id: str) -> str:
    """The default idempotency key of an effect: stable across restarts, one per task+plan+step."""
    digest = hash_chunks([task_id.encode(), b"\0", plan_id.encode(), b"\0", step_id.encode()])
    return f"cas-{digest[:40]}"


def derive_step_key(task_id: str, step_id: str) -> str:
    """The default idempotency key of an effect of a growing plan: one per task+step, stable
    as the plan grows (never derived from the plan digest, which every decision changes)."""
    digest = hash_chunks([task_id.encode(), b"\0step\0", step_id.encode()])
    return f"cas-{digest[:40]}"


def effect_key(task_id: str, plan: Plan, plan_id: str, step_id: str) -> str:
    """The default key of effect `step_id`: per task+plan+step, or per task+step when the
    plan grows."""
    if plan.grows:
        return derive_step_key(task_id, step_id)
    return derive_key(task_id, plan_id, step_id)


@attrs.define
class RunSettings:
    """How a run commits: payload rules, clock and environment source."""

    env: EnvSource = None
    allow_fields: Collection[str] = ()
    snapshot_budget: int = guard.DEFAULT_SNAPSHOT_BUDGET
    clock: Clock = wall_clock_ms
    seal_every: int | None = None  # format v2: seal every this many commits (None: never)
    version: int = codec.FORMAT_VERSION  # the store's format: no commit may need a later one

    def live_env(self) -> str | None:
        """The environment digest now (calling the source if it is a function)."""
        return self.env() if callable(self.env) else self.env


def encode_snapshot(snapshot: Snapshot, settings: RunSettings) -> bytes:
    """Snapshot bytes after the payload rules: no secrets, within the size budget."""
    builtins = codec.to_builtins(snapshot)
    # Only the transition and effect records carry caller-supplied values; the rest are
    # castore's own ids and numbers, the task id and the env anchor (both judged where they
    # enter: refuse_recorded_secrets).
    guard.refuse_secrets(builtins["transition"], settings.allow_fields, "$.transition")
    guard.refuse_secrets(builtins["effects"], settings.allow_fields, "$.effects")
    data = codec.frame("snapshot", codec.encode_value(builtins), snapshot_version(snapshot))
    parts = {**builtins["transition"], "effects": builtins["effects"]}
    guard.check_size(data, parts, settings.snapshot_budget)
    return data


def planned_record(
    task_id: str, plan: Plan, plan_id: str, index: int, now_ms: int
) -> EffectRecord | None:
    """The PLANNED record of the effect at `index`, if that step is an effect."""
    if index >= len(plan.steps) or not plan.steps[index].effect:
        return None
    step = plan.steps[index].id
    return EffectRecord(step, effect_key(task_id, plan, plan_id, step), EffectState.PLANNED, now_ms)


def refuse_recorded_secrets(task_id: str | None, env: str | None, settings: RunSettings) -> None:
    """Refuse a task id or an environment anchor that looks like a credential: each is written
    in clear into every snapshot of the task (the id into its directory name too), where no
    later commit can take it back. `allow_fields` vouches for them as "$.task" and "$.env"."""
    recorded = {"task": task_id, "env": env}
    guard.refuse_secrets(
        {k: v for k, v in recorded.items() if v is not None}, settings.allow_fields
    )


def initial_snapshot(task_id: str, plan: Plan, plan_id: str, settings: RunSettings) -> Snapshot:
    """Sequence 0 of a new task: its frontier at the first step, its parent the plan root."""
    now = settings.clock()
    env = settings.live_env()
    refuse_recorded_secrets(task_id, env, settings)
    planned = planned_record(task_id, plan, plan_id, 0, now)
    return Snapshot(
        task=task_id,
        seq=0,
        parent=None,
        plan=plan_id,
        frontier=Frontier(0, plan.steps[0].id if plan.steps else None),
        effects=() if planned is None else (planned,),
        transition=Transition(TransitionKind.START),
        env=env,
        time_ms=now,
        writer=Writer(socket.gethostname(), os.getpid(), secrets.token_hex(8)),
        grown=Grown(0, plan_id) if plan.grows else None,
    )


_REACHED_KEPT = 1 << 16  # object ids remembered as reached by this run's commits


class Run:
    """The handle an agent works through. Only a run whose commits keep winning may act."""

    def __init__(
        self,
        objects: ObjectStore,
        slots: TaskSlots,
        chain: VerifiedChain,
        settings: RunSettings,
        lock: TaskLock | None,
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
        self._writer = Writer(socket.gethostname(), os.getpid(), secrets.token_hex(8))
        # Set by resume when the environment check was deferred until in-flight effects settle.
        self.env_unverified = False
        self._sealer: Sealer | None = None
        self._replay = Replay(self)
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
            if chain.head.sealed is not None and (
                through is None or through < chain.head.sealed.through
            ):
                self._sealer.finish_prune()  # a crash came between a seal's commit and prune

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

    @property
    def position(self) -> int:
        """The replay cursor: how many positions the agent's code has passed (via `at`,
        `decide`, `append`) in this process; 0 on every start and resume."""
        return self._replay.cursor

    def at(self, step_id: str, *, effect: bool = False, args: str | None = None) -> Position:
        """The agent's code is at its next position and wants step `step_id` (an effect if
        `effect`; `args`, a journaled call's argument digest). DONE: the step is recorded
        there (its outcome is `run.outcome(step_id)`). PENDING: it is decided and not done,
        maybe by this call, which commits the decision (a growing plan) before it returns;
        do its work and commit it (asked again before that, as a retry after the work
        raised asks, it is PENDING again). PlanDriftError (ReplayDriftError) if the task recorded
        another step, kind or argument digest there."""
        return self._replay.at(step_id, effect, args)

    def decide(self, step_id: str, *, effect: bool = False, args: str | None = None) -> None:
        """`at`, for a step that must not be done yet: UsageError if it is."""
        if self.at(step_id, effect=effect, args=args) is Position.DONE:
            raise UsageError(
                f"step {step_id!r} of task {self.task_id!r} is done already (position "
                f"{self.position - 1}); use run.at() to replay it"
            )

    def append(self, step_id: str, result: Any = None, *, args: str | None = None) -> str | None:
        """Decide plain step `step_id` and record its `result` in one commit (a growing
        plan; data already in hand). At a position already recorded it checks the step is
        the one recorded and commits nothing (returns None); else the snapshot id."""
        return self._replay.append(step_id, result, args)

    def finish(self) -> str:
        """A growing task says it is done (a FINISH commit; nothing but seal or forget may
        follow); returns HEAD's id. Refused while a step is decided and not done."""
        return self._replay.finish()

    @property
    def next_step(self) -> str | None:
        """The step to do next, or None when every step is done."""
        return self.head.frontier.step

    def pending(self) -> Iterator[str]:
        """Yield the next step until the plan is done; the caller commits each one."""
        while (step := self.next_step) is not None:
            yield step
            if self.next_step == step:
                raise UsageError(
                    f"step {step!r} was yielded but not committed; commit it with "
                    "run.commit_step(...) (or run its effect) before asking for the next one"
                )

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

    # -- committing ----------------------------------------------------------------------
    def commit_step(self, step_id: str, result: Any = None, *, args: str | None = None) -> str:
        """Record that plain step `step_id` finished with `result`; returns the snapshot id.
        `args`: the argument digest of a journaled call, recorded with it (format v2).

        Pass a `BlobRef` from `store.put_blob(...)` for a large result.
        """
        step = self._frontier_step(step_id)
        if step.effect:
            raise UsageError(
                f"step {step_id!r} is an effect: run it with `with run.effect({step_id!r}) as "
                "call:` so its key is persisted before the request"
            )
        inline, ref = self.checked_result(step_id, result)
        return self.record_step(step_id, inline, ref, args=args)

    def checked_result(self, step_id: str, result: Any) -> tuple[Any, str | None]:
        """(inline value, object id) of step `step_id`'s result: a stored object's reference
        must name an object of its kind in this store."""
        stored = stored_result(result)  # a BlobRef, RawRef or TreeRef: (id, kind)
        inline, ref = (None, stored[0]) if stored else (result, None)
        if ref is not None:
            self._objects.restore(validate_object_id(ref))  # gc took it before this commit
        kind = self._objects.kind_of(stored[0]) if stored is not None else None
        if stored is not None and kind is None:
            # gc on another client may remove it between restore's look and this read (the
            # look answered from a cache): store it again if this process has its bytes.
            self._objects.restore(stored[0], known_gone=True)
            kind = self._objects.kind_of(stored[0])
        if stored is not None and kind != stored[1]:
            raise UsageError(
                f"{stored[1]} {ref} is not in this store; store it with store.put_{stored[1]}()"
            )
        return inline, ref

    def record_step(
        self,
        step_id: str,
        inline: Any,
        ref: str | None,
        *,
        args: str | None = None,
        decided: Step | None = None,
    ) -> str:
        """Commit the STEP transition of `step_id` (checked by the caller); `decided`: the
        step is decided by this very commit (a growing plan's `append`)."""
        transition = Transition(
            TransitionKind.STEP,
            step=step_id,
            result=inline,
            result_ref=ref,
            decided=decided,
            args=args,
        )
        grown = None
        if decided is not None:
            grown = self.grown_by(decided, args)
        index = self.head.frontier.index
        snapshot_id = self.advance(transition, self.head.effects, move_frontier=True, grown=grown)
        self._outcomes.record(Outcome(step_id, self.head.seq, inline, ref, args=args, index=index))
        self._replay.passed(index)
        return snapshot_id

    def grown_by(self, step: Step, args: str | None) -> Grown:
        """HEAD's `grown` once `step` is decided (refusing a repeat or a plan too long)."""
        grown = self.head.grown
        if grown is None:
            raise UsageError(
                f"task {self.task_id!r} has a fixed plan ({self.plan.name!r}): only a plan "
                "made with Plan.grow decides steps as it runs"
            )
        if grown.finished:
            raise UsageError(f"task {self.task_id!r} is finished: nothing more may be decided")
        if grown.steps >= limits.MAX_GROWN_STEPS:
            raise PlanTooLongError(self.task_id, limits.MAX_GROWN_STEPS)
        validate_step_id(step.id)
        repeated, first = self._first_position(step.id)
        if repeated:
            raise StepRepeatedError(self.task_id, step.id, first)
        return Grown(grown.steps + 1, roll_digest(grown.digest, step, args))

    def _first_position(self, step_id: str) -> tuple[bool, int | None]:
        """(True, its position) if the task has step `step_id` already, else (False, None)."""
        if self._base_ids is None:
            self._base_ids = {step.id: position for position, step in enumerate(self.plan.steps)}
        if step_id in self._base_ids:
            return True, self._base_ids[step_id]
        if self.head.frontier.step == step_id:
            return True, self.head.frontier.index
        if self._outcomes.has(step_id):
            return True, self._outcomes[step_id].index
        return False, None

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

    def frontier_step(self) -> Step | None:
        """The step at the frontier (decided, not done), or None."""
        frontier = self.head.frontier
        if frontier.step is None:
            return None
        if frontier.index < len(self.plan.steps):
            return self.plan.steps[frontier.index]
        # A decided step: an effect has its record (PLANNED at least) until it is CONFIRMED.
        return Step(frontier.step, self.head.effect(frontier.step) is not None)

    def _frontier_step(self, step_id: str) -> Step:
        step = self.frontier_step()
        if step is None or step.id != step_id:
            what = "the next step" if not self.grows else "the decided step"
            raise UsageError(
                f"step {step_id!r} is not {what} of task {self.task_id!r} "
                f"(next: {self.head.frontier.step!r}); steps run in plan order"
                + ("; decide it first with run.at() or run.decide()" if self.grows else "")
            )
        return step

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
        if snapshot_version(snapshot) > self._settings.version:
            raise UsageError(
                f"task {self.task_id!r}: this commit writes format-2 records into a "
                f"format-{self._settings.version} store; run `castore upgrade` first"
            )
        data = encode_snapshot(snapshot, self._settings)
        if not self._head_durable:
            if self._settings.version >= 2 and name_is_lost(self._objects, self.head_id):
                # A power loss took HEAD's object name (v2 commits leave it unsynced): back
                # before a successor names HEAD (FORMAT.md §13, "A lost snapshot name").
                restore_name(self._objects, self._slots.path(self.head.seq), self.head_id)
            fsio.fsync_dir(self._slots.directory)
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
            self._sealer.committed(data, snapshot.sealed)
        return snapshot_id

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

    # -- journaled calls (the rules are in castore.run.journal) ------------------------------
    def call(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once as plain step `step_id` and record its result; a
        replay returns the recorded result without calling `fn`. Wrap `fn` with
        `castore.vouch(fn, "$.field")` to vouch for model output the secret guard refuses."""
        return journal.call(self, step_id, fn, args, kwargs)

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
        """The real path of the task's chain directory: what identifies the task in this
        process, however the store was opened (castore.run.inflight)."""
        return os.path.realpath(self._slots.directory)

    @property
    def run_id(self) -> str:
        """This run's random id, the `writer.run` of the snapshots it commits."""
        return self._writer.run

    @property
    def writes_v2(self) -> bool:
        """True in a format-2 store (raw and tree objects may be written)."""
        return self._settings.seal_every is not None

    def brief(self, *, budget_tokens: int = 512, now_ms: int | None = None) -> Brief:
        """The resume brief of this task (castore.run.brief.make_brief), from what the run holds."""
        view = view_of(
            self.task_id,
            self.head,
            self.head_id,
            self.plan,
            clock=self.chain_clock,
            outcomes=self._outcomes,
        )
        return make_brief(view, budget_tokens=budget_tokens, now_ms=now_ms)

    # -- effects (the protocol itself is in castore.run.protocol) --------------------------
    def next_action(self, step_id: str | None = None) -> NextAction:
        """The one next action for `step_id` (default: the frontier step), per PROTOCOL.md."""
        return protocol.next_action(self, step_id)

    def effect(
        self, step_id: str, service: Service, *, key: str | None = None
    ) -> AbstractContextManager[Call]:
        """Submit effect `step_id`: SUBMITTED is durable before the body runs; the body
        sends the request with `call.key` and ends with `call.confirm(receipt)`."""
        protocol.replay_effect(self, step_id)
        return protocol.effect(self, step_id, service, key)

    def perform(
        self, step_id: str, service: Service, send: Callable[[str], str], *, key: str | None = None
    ) -> str:
        """Drive effect `step_id` to CONFIRMED whatever its state: submit, resubmit, reconcile
        or mark it unresolved, per the next-action table. Returns the receipt.
        StepInFlightError while a send of it may still run, in any run of this process or
        in the live process of this host that submitted it (castore.run.inflight): the service
        may not have it yet."""
        return protocol.perform(self, step_id, service, send, key)

    def reconcile(self, step_id: str, service: Service) -> NextAction:
        """Ask the service by key what happened to an in-flight effect, and commit the answer."""
        return protocol.reconcile(self, step_id, service)

    def settle(self, service: Service) -> NextAction:
        """After a restart: reconcile or mark unresolved the frontier effect, as the table says;
        returns what is left to do (submit, resubmit, skip, escalate, ...)."""
        return protocol.settle(self, service)

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

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(finish=exc is None)
