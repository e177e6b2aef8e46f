"""The store facade: create or open a store; start, resume and inspect tasks."""

from __future__ import annotations

import contextlib
import os
import typing
from collections.abc import Collection, Iterator
from typing import Any

from castore.chain import briefview
from castore.chain.marker import open_marker
from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcomes
from castore.chain.planread import read_plan
from castore.chain.seal import SEAL_EVERY
from castore.chain.verify import VerifiedChain
from castore.errors import (
    ConflictError,
    ForkError,
    IntegrityError,
    StoreExistsError,
    TaskExistsError,
    TaskNotFoundError,
    UsageError,
)
from castore.format import codec
from castore.format.guard import DEFAULT_SNAPSHOT_BUDGET
from castore.format.layout import (
    MARKER_KEY,
    OBJECTS_DIR,
    TASKS_DIR,
    Layout,
    lock_key,
    task_key,
    validate_object_id,
)
from castore.format.marker import marker_bytes
from castore.format.plans import plan_id as plan_digest
from castore.format.plans import validate_plan
from castore.format.records import Plan
from castore.medium import oserrors
from castore.medium.base import Medium
from castore.medium.posix import PosixMedium
from castore.medium.readonly import ReadOnlyMedium
from castore.medium.select import open_medium
from castore.medium.tasklock import HeldLock
from castore.run import brief, budget, forget, fork, gate, resolution
from castore.run.forget import Forgotten
from castore.run.fork import Forked
from castore.run.reading import Reading
from castore.run.run import Run
from castore.run.settings import (
    Clock,
    EnvSource,
    RunSettings,
    encode_snapshot,
    initial_snapshot,
    refuse_recorded_secrets,
    wall_clock_ms,
)

DEFAULT_LOCK_TIMEOUT = 10.0


@oserrors.translating_methods  # no OSError leaves the public API: a castore error names the path
class Store(Reading):
    """One store: a directory, or an s3:// bucket prefix. Open it with `Store.open` or create
    it with `Store.init`."""

    def __init__(
        self,
        root: str | os.PathLike[str] | Medium,
        *,
        snapshot_budget: int = DEFAULT_SNAPSHOT_BUDGET,
        clock: Clock = wall_clock_ms,
        read_only: bool = False,
        **medium_options: Any,
    ) -> None:
        medium = open_medium(root, **medium_options)
        # A reader's store: every write raises (castore.medium.readonly, FORMAT.md §12).
        self.medium = ReadOnlyMedium(medium) if read_only and not medium.read_only else medium
        self.root = self.medium.url
        # The path arithmetic of a store in a directory (POSIX tools: fsck, gc, watch).
        self.layout = Layout(self.root) if isinstance(self.medium, PosixMedium) else None
        self.objects = ObjectStore(self.medium)
        self._budget = snapshot_budget
        self._clock = clock
        self._heights: dict[str, int] = {}
        # A v1 store is read and written as v1 until `castore upgrade` (FORMAT.md §18).
        self.format_version: int = open_marker(self.medium)
        self.medium.check_safe()
        self.objects.snapshot_names_durable = self.format_version < 2

    @classmethod
    def unmarked(cls, root: str | os.PathLike[str]) -> Store:
        """The store at `root` without its marker checked: for fsck to look at a store whose
        marker is missing or empty (never to write to)."""
        store = cls.__new__(cls)
        store.medium = open_medium(root)
        store.root = store.medium.url
        store.layout = Layout(store.root) if isinstance(store.medium, PosixMedium) else None
        store.objects = ObjectStore(store.medium)
        store._budget = DEFAULT_SNAPSHOT_BUDGET
        store._clock = wall_clock_ms
        store._heights = {}
        store.format_version = codec.FORMAT_VERSION  # never written to: nothing depends on it
        for directory in (OBJECTS_DIR, TASKS_DIR):
            store.medium.require_dir(directory)
        return store

    # -- creating and opening --------------------------------------------------------------
    @classmethod
    def init(cls, root: str | os.PathLike[str], **options: Any) -> Store:
        """Create a new, empty store at `root`: a path that does not exist, an empty
        directory, or what an interrupted init left there (which init completes)."""
        medium = open_medium(root, **_medium_options(options))
        found = medium.interrupted_init()  # a symlink in the store's place included
        if found is not None:
            raise StoreExistsError(medium.url, found)
        medium.init_store(marker_bytes())
        return cls(medium, **options)

    @classmethod
    def open(cls, root: str | os.PathLike[str], *, create: bool = False, **options: Any) -> Store:
        """Open the store at `root`; with `create=True`, create it first if absent (or
        complete what an interrupted init left). Any number of processes may do this at once.
        `read_only=True`: a reader's store, whose every write raises ReadOnlyStoreError (what
        a reader with read-only S3 keys or a read-only mount can do)."""
        if create and options.get("read_only"):
            raise UsageError("a store opened read_only=True cannot be created: drop one")
        medium = open_medium(root, **_medium_options(options))
        # Anything else there, and it is not ours to adopt: the open below says what it is.
        # (A store another process completed meanwhile has its marker.)
        if create and not medium.exists(MARKER_KEY) and medium.interrupted_init() is None:
            medium.init_store(marker_bytes())
        return cls(medium, **options)

    # -- tasks -------------------------------------------------------------------------------
    def start(
        self,
        task_id: str,
        plan: Plan,
        *,
        env: EnvSource = None,
        allow_fields: Collection[str] = (),
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    ) -> Run:
        """Create task `task_id` with `plan` and return its run; TaskExistsError if it exists."""
        slots = self._slots(task_id)
        settings = self._settings(env, allow_fields)
        validate_plan(plan)
        self._require_fixed_in_v1(plan)
        # Built and checked (a secret in the id or the env anchor) before anything is written.
        head = initial_snapshot(task_id, plan, plan_digest(plan), settings)
        data = encode_snapshot(head, settings)
        plan_id = self.put_plan(plan)
        if self.medium.exists(slots.chain_key):
            # A forgotten task whose history gc reclaimed has no slot 0 to conflict on.
            forget.refuse_forgotten(slots)
        self.medium.make_dir(slots.task_key)
        self.medium.make_dir(slots.chain_key)
        with self._locked(task_id, lock_timeout) as lock:
            try:
                head_id = slots.commit(data, 0, "<none: new task>", (plan_id,))
            except ConflictError:
                forget.refuse_forgotten(slots)
                raise TaskExistsError(task_id) from None
        chain = VerifiedChain(
            task_id, head, head_id, plan, plan_id, plan_id, Outcomes(), 1, tail=(data,)
        )
        return Run(self.objects, slots, chain, settings, lock)

    def resume(
        self,
        task_id: str,
        plan: Plan | None = None,
        *,
        plan_id: str | None = None,
        env: EnvSource = None,
        allow_fields: Collection[str] = (),
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    ) -> Run:
        """Verify task `task_id` from HEAD to its plan root, pass the gate, return its run.

        Give the task's `plan`, or its `plan_id` alone (`run.plan_id`, or what `put_plan`
        returned): the run then has the plan stored with the task, read and verified from
        the store, and the caller's plan is neither built nor hashed; a task of another
        plan is refused (PlanDriftError) as a changed plan is."""
        slots = self._slots(task_id)
        settings = self._settings(env, allow_fields)
        refuse_recorded_secrets(task_id, None, settings)  # each commit would write it again
        expected = self._expected_plan(plan, plan_id)
        with self._locked(task_id, lock_timeout) as lock:
            chain = self._verify_live(slots, expected, keep_tail=self._sealing)
            # A fork's outcomes, by their tree (format 2 only: a v1 store holds no fork).
            carried = fork.carried_by(self.objects, chain) if self._sealing else {}
            if expected is None:
                gate.check_plan_id(chain, typing.cast(str, plan_id))
                validate_plan(chain.plan)  # a stored plan is checked as a caller's is
            else:
                gate.check_plan(chain, expected[1], expected[0])
            gate.check_frontier(task_id, chain.head, chain.plan)
            gate.check_keys(task_id, chain.head)
            deferred = gate.in_flight(chain.head)
            if not deferred:
                gate.check_environment(task_id, chain.head, settings.live_env())
        run = Run(self.objects, slots, chain, settings, lock)
        fork.carry_into(run, carried)
        # An effect still in flight may explain a difference: it is settled first and the
        # environment compared after, before the next commit that is not about that effect.
        run.env_unverified = deferred
        return run

    def open_task(
        self, task_id: str, plan: Plan | None = None, *, plan_id: str | None = None, **options: Any
    ) -> Run:
        """Start task `task_id`, or resume it if it exists: what a worker calls on (re)start.
        With `plan_id` instead of `plan` (see `resume`), a new task starts with the plan of
        that id, which must be in the store already (`put_plan`)."""
        _require_plan_or_id(plan, plan_id)
        if self._slots(task_id).started():
            return self.resume(task_id, plan, plan_id=plan_id, **options)
        if plan is None:
            plan = self._stored_plan(task_id, typing.cast(str, plan_id))
        try:
            return self.start(task_id, plan, **options)
        except TaskExistsError:
            return self.resume(task_id, plan, plan_id=plan_id, **options)

    def _expected_plan(self, plan: Plan | None, plan_id: str | None) -> tuple[str, Plan] | None:
        """(digest, plan) of a caller's plan, validated; None when the caller named the
        task's plan by `plan_id` instead."""
        _require_plan_or_id(plan, plan_id)
        if plan is None:
            return None
        validate_plan(plan)
        self._require_fixed_in_v1(plan)
        return plan_digest(plan), plan

    def _stored_plan(self, task_id: str, plan_id: str) -> Plan:
        """The plan of id `plan_id` from this store, for a task that starts by plan id."""
        if not self.objects.exists(plan_id):
            raise UsageError(
                f"plan {plan_id[:16]} is not in this store: store it first "
                "(plan_id = store.put_plan(plan)) and start tasks with that id"
            )
        return read_plan(self.objects, task_id, plan_id)

    def resolve(
        self,
        task_id: str,
        step_id: str,
        *,
        receipt: str | None = None,
        not_done: bool = False,
        reason: str | None = None,
        who: str | None = None,
        submitter_ended: bool = False,
    ) -> str:
        """A person's decision on an in-flight effect, recorded as its own snapshot (who, why):
        CONFIRMED with `receipt`, or NOT_DONE (`not_done=True`, `reason` required; refused
        while the live process of this host that submitted it may still be sending, unless
        `submitter_ended`: you know its send ended)."""
        with self._decision_run(task_id, keep_env=True) as run:
            return resolution.resolve(
                run,
                step_id,
                receipt=receipt,
                not_done=not_done,
                reason=reason,
                who=who,
                submitter_ended=submitter_ended,
            )

    def override(
        self,
        task_id: str,
        *,
        who: str,
        why: str,
        plan: Plan | None = None,
        env: EnvSource = None,
    ) -> str:
        """Accept plan drift (`plan`) and/or environment drift (`env`, the live digest) as an
        audited snapshot naming who and why. The only way past those gate checks."""
        new_plan_id = self.put_plan(plan) if plan is not None else None
        # Without a new environment, the anchor stays: a plan override accepts no env drift.
        with self._decision_run(task_id, keep_env=env is None, env=env) as run:
            return resolution.override(run, plan, new_plan_id, who=who, why=why)

    def brief(
        self,
        task_id: str,
        *,
        budget_tokens: int = budget.DEFAULT_BUDGET,
        now_ms: int | None = None,
        verify: bool = False,
    ) -> brief.Brief:
        """The resume brief of task `task_id` (castore.run.brief): HEAD checked as `status`
        checks it and the few newest outcomes read back from it, never the whole history;
        `verify=True` verifies the whole chain first, as a resume does."""
        slots = self._slots(task_id)
        if verify:
            view = briefview.view_of_chain(self._verify_live(slots))
        else:
            view = briefview.view_of_head(self.objects, slots)
        return brief.make_brief(view, budget_tokens=budget_tokens, now_ms=now_ms)

    def _decision_run(
        self, task_id: str, *, keep_env: bool, env: EnvSource = None, seal: bool = False
    ) -> Run:
        """A run for recording a person's decision: the chain must verify, the drift checks
        are what the decision is about, so they are not applied. `seal`: a run that seals
        (`seal_run`); a decision run otherwise only carries HEAD's anchor forward."""
        slots = self._slots(task_id)
        if not slots.started():
            raise TaskNotFoundError(task_id)  # before the lock, which would create files
        with self._locked(task_id, DEFAULT_LOCK_TIMEOUT) as lock:
            chain = self._verify_live(slots, keep_tail=seal and self._sealing)
        anchor: EnvSource = chain.head.env if keep_env else env
        every = self._seal_every if seal else None
        settings = RunSettings(
            anchor, (), self._budget, self._clock, every, version=self.format_version
        )
        return Run(self.objects, slots, chain, settings, lock)

    def seal_run(self, task_id: str) -> Run:
        """A run of task `task_id` for sealing it (`castore.maintenance.sealing.seal_task`): its
        chain must verify; no gate check applies, since a SEAL commit changes nothing but the
        anchor."""
        return self._decision_run(task_id, keep_env=True, seal=True)

    @property
    def _sealing(self) -> bool:
        return self.format_version >= 2

    @property
    def _seal_every(self) -> int | None:
        """How often runs seal: format v2 only (a v1 store gets nothing v1 cannot read)."""
        if not self._sealing:
            return None
        return min(SEAL_EVERY, self.medium.seal_every or SEAL_EVERY)

    def forget(
        self,
        task_id: str,
        *,
        who: str,
        why: str,
        force_in_flight: bool = False,
        only_if_head: str | None = None,
    ) -> Forgotten:
        """End task `task_id` for good: commit its tombstone (who, why) at HEAD + 1. It is
        never started or resumed again (TaskForgottenError) and its id is not reused; gc may
        then reclaim its history. ForgetRefusedError while an effect is SUBMITTED or
        UNRESOLVED, unless `force_in_flight` (its outcome then stays unknown for good).
        `only_if_head`: ConflictError unless HEAD is still that snapshot id."""
        self._require_v2("forget")
        settings = RunSettings(None, (), self._budget, self._clock)
        return forget.forget(
            self.objects,
            self._slots(task_id),
            settings,
            who=who,
            why=why,
            force_in_flight=force_in_flight,
            only_if_head=only_if_head,
        )

    def fork(
        self,
        source: str | tuple[str, int],
        new_task: str,
        *,
        allow_fields: Collection[str] = (),
    ) -> Forked:
        """Start task `new_task` from snapshot `source` ("task@seq" or (task, seq)) of a
        verified task: same plan, frontier and environment anchor, the outcomes it had
        carried (resume returns them), open effects PLANNED again under new keys. ForkError
        if an effect is SUBMITTED or UNRESOLVED there; TaskExistsError if `new_task` exists."""
        self._require_v2("fork")
        task_id, seq = fork.parse_ref(source) if isinstance(source, str) else source
        new_slots = self._slots(new_task)
        source_slots = self._slots(task_id)
        try:
            history = self.history(task_id)
        except (IntegrityError, TaskNotFoundError) as exc:
            if forget.tombstone_head(source_slots) is None:
                raise
            raise ForkError(
                task_id,
                seq,
                "the task was forgotten and gc reclaimed its history",
                "fork from a task that is still there (a fork of it carries what it had)",
            ) from exc
        settings = RunSettings(None, allow_fields, self._budget, self._clock)
        refuse_recorded_secrets(new_task, None, settings)
        return fork.fork(self.objects, history, seq, new_slots, settings)

    def _settings(self, env: EnvSource, allow_fields: Collection[str]) -> RunSettings:
        """How a task's run commits in this store."""
        return RunSettings(
            env,
            allow_fields,
            self._budget,
            self._clock,
            self._seal_every,
            version=self.format_version,
        )

    def _require_fixed_in_v1(self, plan: Plan) -> None:
        """A growing plan is format 2 (its plan object and every snapshot of its task)."""
        if plan.grows:
            self._require_v2(f"a growing plan ({plan.name!r})")

    @contextlib.contextmanager
    def _locked(self, task_id: str, timeout: float | None) -> Iterator[HeldLock | None]:
        """The task's local lock for the code that builds a Run: released if that code
        fails, handed over to the Run if it succeeds. None without a lock (timeout None, no
        task directory yet, or a filesystem without flock)."""
        lock = None
        if timeout is not None and self.medium.exists(task_key(task_id)):
            lock = self.medium.lock(lock_key(task_id), task_id, timeout)
        try:
            yield lock
        except BaseException:
            if lock is not None:
                lock.release()
            raise


_STORE_OPTIONS = frozenset({"snapshot_budget", "clock", "read_only"})


def _require_plan_or_id(plan: Plan | None, plan_id: str | None) -> None:
    """UsageError unless exactly one of `plan` and `plan_id` is given; a plan_id that is
    not an object id is refused before it names a file."""
    if (plan is None) == (plan_id is None):
        raise UsageError(
            "give the task's plan or its plan_id (not both, not neither): "
            "resume(task, plan) or resume(task, plan_id=run.plan_id)"
        )
    if plan_id is not None:
        validate_object_id(plan_id)


def _medium_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options of `Store.open`/`init` that are the medium's (an s3:// store's client)."""
    return {k: v for k, v in options.items() if k not in _STORE_OPTIONS}
