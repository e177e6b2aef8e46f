"""The store facade: create or open a store; start, resume and inspect tasks."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Collection, Iterator
from typing import Any

from castore import codec, fsio, gate, resolution, status, storeinit
from castore.errors import (
    ConflictError,
    FormatVersionError,
    IntegrityError,
    ObjectCorruptError,
    StoreExistsError,
    StoreIOError,
    StoreNotFoundError,
    TaskExistsError,
    TaskNotFoundError,
    UnsafeFileError,
    UsageError,
)
from castore.guard import DEFAULT_SNAPSHOT_BUDGET, refuse_secrets
from castore.layout import Layout, decode_task_id
from castore.objects import ObjectStore
from castore.plans import plan_bytes, validate_plan
from castore.plans import plan_id as plan_digest
from castore.records import BlobRef, Plan, Snapshot
from castore.refs import TaskSlots
from castore.run import (
    Clock,
    EnvSource,
    Run,
    RunSettings,
    encode_snapshot,
    initial_snapshot,
    refuse_recorded_secrets,
    wall_clock_ms,
)
from castore.status import TaskStatus
from castore.tasklock import TaskLock
from castore.verify import (
    VerifiedChain,
    decode_snapshot,
    verified_head,
    verify_chain,
    verify_head,
)

MARKER = storeinit.MARKER
DEFAULT_LOCK_TIMEOUT = 10.0


@fsio.translating_methods  # no OSError leaves the public API: a castore error names the path
class Store:
    """One store directory. Open it with `Store.open` or create it with `Store.init`."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        snapshot_budget: int = DEFAULT_SNAPSHOT_BUDGET,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self.layout = Layout(root)
        self.root = self.layout.root
        self.objects = ObjectStore(self.layout)
        self._budget = snapshot_budget
        self._clock = clock
        self._check_marker()

    @classmethod
    def unmarked(cls, root: str | os.PathLike[str]) -> Store:
        """The store at `root` without its marker checked: for fsck to look at a store whose
        marker is missing or empty (never to write to)."""
        store = cls.__new__(cls)
        store.layout = Layout(root)
        store.root = store.layout.root
        store.objects = ObjectStore(store.layout)
        store._budget = DEFAULT_SNAPSHOT_BUDGET
        store._clock = wall_clock_ms
        store.format_version = codec.FORMAT_VERSION  # never written to: nothing depends on it
        for directory in (store.layout.objects, store.layout.tasks):
            fsio.require_real_directory(directory)
        return store

    # -- creating and opening --------------------------------------------------------------
    @classmethod
    def init(cls, root: str | os.PathLike[str], **options: Any) -> Store:
        """Create a new, empty store at `root`: a path that does not exist, an empty
        directory, or what an interrupted init left there (which init completes)."""
        layout = Layout(root)
        if os.path.islink(layout.root):
            raise StoreExistsError(layout.root)
        found = storeinit.leftovers_only(layout.root)
        if found is not None:
            raise StoreExistsError(layout.root, found)
        storeinit.build(layout)
        return cls(layout.root, **options)

    @classmethod
    def open(cls, root: str | os.PathLike[str], *, create: bool = False, **options: Any) -> Store:
        """Open the store at `root`; with `create=True`, create it first if absent (or
        complete what an interrupted init left). Any number of processes may do this at once."""
        layout = Layout(root)
        # Anything else in the directory, and it is not ours to adopt: the open below says
        # what it is. (A store another process completed meanwhile has its marker.)
        if (
            create
            and not os.path.lexists(layout.marker)
            and not os.path.islink(layout.root)
            and storeinit.leftovers_only(layout.root) is None
        ):
            storeinit.build(layout)
        return cls(root, **options)

    def _check_marker(self) -> None:
        try:
            data = fsio.read_regular(self.layout.marker)
        except FileNotFoundError:
            raise self._no_marker("") from None
        except StoreIOError as exc:
            if exc.errno != errno.ENOTDIR:
                raise
            what = "it is a file, not a directory" if os.path.isfile(self.root) else None
            raise StoreNotFoundError(
                self.root,
                what or "a component of it is not a directory",
                "give the path of a store directory",
            ) from None
        except UnsafeFileError as exc:
            raise StoreNotFoundError(self.root, f"{self.layout.marker} is a {exc.found}") from None
        except OSError as exc:
            raise StoreIOError(self.layout.marker, "reading the store marker", exc) from exc
        # A symlinked directory inside the store would let commits write outside it.
        for directory in (self.layout.objects, self.layout.tasks):
            try:
                fsio.require_real_directory(directory)
            except UnsafeFileError:
                raise
            except OSError as exc:
                raise StoreIOError(directory, "looking at", exc) from exc
        if not data:
            raise self._no_marker(f"{self.layout.marker} is empty")
        try:
            marker = codec.decode_value(data)
        except ValueError:
            raise StoreNotFoundError(self.root, f"{self.layout.marker} is not castore's") from None
        if not isinstance(marker, dict) or marker.get("format") != "castore":
            raise StoreNotFoundError(self.root, f"{self.layout.marker} is not castore's")
        version = marker.get("version")
        # type(): a JSON `true` equals 1 in Python, and is no version.
        if type(version) is not int or version not in codec.SUPPORTED_VERSIONS:
            raise FormatVersionError(self.layout.marker, version, codec.SUPPORTED_VERSIONS)
        # A v1 store is read and written as v1 until `castore upgrade` (FORMAT.md §18).
        self.format_version: int = version

    def _no_marker(self, empty: str) -> StoreNotFoundError:
        """What a directory without a (usable) marker is, and what to do about it."""
        root = self.root
        if not os.path.isdir(root) or not storeinit.listdir(root):
            return StoreNotFoundError(root)  # nothing there yet: init makes a store of it
        found = storeinit.leftovers_only(root, but_marker=bool(empty))
        if empty and found is None:
            # Only the empty marker beside init's directories: not written by castore.
            return StoreNotFoundError(
                root,
                f"{empty}, and nothing else is there but empty directories",
                f"remove {self.layout.marker}, then `castore init {root}` completes the store",
            )
        if found is None:
            return StoreNotFoundError(
                root,
                "an interrupted `castore init`: no castore.json yet, only the empty "
                "directories init makes",
                f"`castore init {root}` (or Store.open(..., create=True)) completes it",
            )
        objects, tasks = storeinit.content_counts(root)
        if objects or tasks:
            what = empty or f"{self.layout.marker} is missing"
            return StoreNotFoundError(
                root,
                f"{what}, but objects/ holds {objects} file(s) and tasks/ {tasks} task(s): "
                "the marker was deleted or damaged",
                "if this is a castore store, restore castore.json from a backup (its 33 bytes "
                'are {"format":"castore","version":2} and a newline, or 1 for a store older '
                "than castore 0.2, docs/FORMAT.md §3), then "
                f"run `castore fsck {root}`; `castore fsck` shows what is there meanwhile",
            )
        return StoreNotFoundError(
            root,
            empty or f"the directory is not empty: {found}",
            "castore init needs a new or empty directory; choose another path, or point "
            "--store / $CASTORE_STORE at an existing store",
        )

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
        settings = RunSettings(env, allow_fields, self._budget, self._clock)
        validate_plan(plan)
        # Built and checked (a secret in the id or the env anchor) before anything is written.
        head = initial_snapshot(task_id, plan, plan_digest(plan), settings)
        data = encode_snapshot(head, settings)
        plan_id = self.put_plan(plan)
        fsio.make_dir_durable(self.layout.task_dir(task_id))
        fsio.make_dir_durable(slots.directory)
        with self._locked(task_id, lock_timeout) as lock:
            try:
                head_id = slots.commit(data, 0, "<none: new task>", (plan_id,))
            except ConflictError:
                raise TaskExistsError(task_id) from None
        chain = VerifiedChain(task_id, head, head_id, plan, plan_id, plan_id, {}, (head_id,))
        return Run(self.objects, slots, chain, settings, lock)

    def resume(
        self,
        task_id: str,
        plan: Plan,
        *,
        env: EnvSource = None,
        allow_fields: Collection[str] = (),
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    ) -> Run:
        """Verify task `task_id` from HEAD to its plan root, pass the gate, return its run."""
        slots = self._slots(task_id)
        settings = RunSettings(env, allow_fields, self._budget, self._clock)
        refuse_recorded_secrets(task_id, None, settings)  # each commit would write it again
        validate_plan(plan)
        plan_id = plan_digest(plan)
        with self._locked(task_id, lock_timeout) as lock:
            chain = verify_chain(self.objects, slots, (plan_id, plan))
            gate.check_plan(chain, plan, plan_id)
            gate.check_frontier(task_id, chain.head, chain.plan)
            gate.check_keys(task_id, chain.head)
            deferred = gate.in_flight(chain.head)
            if not deferred:
                gate.check_environment(task_id, chain.head, settings.live_env())
        run = Run(self.objects, slots, chain, settings, lock)
        # An effect still in flight may explain a difference: it is settled first and the
        # environment compared after, before the next commit that is not about that effect.
        run.env_unverified = deferred
        return run

    def open_task(self, task_id: str, plan: Plan, **options: Any) -> Run:
        """Start task `task_id`, or resume it if it exists: what a worker calls on (re)start."""
        if self._slots(task_id).started():
            return self.resume(task_id, plan, **options)
        try:
            return self.start(task_id, plan, **options)
        except TaskExistsError:
            return self.resume(task_id, plan, **options)

    def resolve(
        self,
        task_id: str,
        step_id: str,
        *,
        receipt: str | None = None,
        not_done: bool = False,
        reason: str | None = None,
        who: str | None = None,
    ) -> str:
        """A person's decision on an in-flight effect, recorded as its own snapshot (who, why):
        CONFIRMED with `receipt`, or NOT_DONE (`not_done=True`, `reason` required)."""
        with self._decision_run(task_id, keep_env=True) as run:
            return resolution.resolve(
                run, step_id, receipt=receipt, not_done=not_done, reason=reason, who=who
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

    def status(self, task_id: str, *, verify: bool = False) -> TaskStatus:
        """Where a task stands, from its HEAD alone, trusting the chain below it (a HEAD that
        does not verify is reported in `.error`, not raised). `verify=True` checks the whole
        chain first, as a resume does, and reports any damage in it the same way."""
        try:
            if verify:
                head = verified_head(self.verify(task_id))
            else:
                head = verify_head(self.objects, self._slots(task_id))
        except (IntegrityError, FormatVersionError) as exc:  # a planted file included
            return status.broken(task_id, exc)
        return status.describe(head, self._clock())

    def _decision_run(self, task_id: str, *, keep_env: bool, env: EnvSource = None) -> Run:
        """A run for recording a person's decision: the chain must verify, the drift checks
        are what the decision is about, so they are not applied."""
        slots = self._slots(task_id)
        if not slots.started():
            raise TaskNotFoundError(task_id)  # before the lock, which would create files
        with self._locked(task_id, DEFAULT_LOCK_TIMEOUT) as lock:
            chain = verify_chain(self.objects, slots)
        anchor: EnvSource = chain.head.env if keep_env else env
        settings = RunSettings(anchor, (), self._budget, self._clock)
        return Run(self.objects, slots, chain, settings, lock)

    def verify(self, task_id: str) -> VerifiedChain:
        """Verify one task's chain without resuming it (read-only; ChainError if broken)."""
        return verify_chain(self.objects, self._slots(task_id))

    def tasks(self) -> list[str]:
        """Every started task's id, sorted (an interrupted start, without slot 0, is fsck's
        `no-chain` warning, not a task)."""
        try:
            names = os.listdir(self.layout.tasks)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            try:
                task_id = decode_task_id(name)
            except UsageError:
                continue  # not castore's: fsck reports it
            # Slot 0 of a long task may be pruned: its sealed mark then says it started.
            if os.path.lexists(self.layout.slot_path(task_id, 0)) or os.path.lexists(
                self.layout.mark_path(task_id)
            ):
                found.append(task_id)
        return sorted(found)

    def history(self, task_id: str) -> list[tuple[str, Snapshot]]:
        """(id, snapshot) for every snapshot of a verified task, newest first."""
        chain = verify_chain(self.objects, self._slots(task_id))
        return [(i, decode_snapshot(self.objects.read(i))) for i in chain.ids]

    # -- objects -----------------------------------------------------------------------------
    def put_plan(self, plan: Plan) -> str:
        """Store a plan object (after validating it); return its id, the plan digest."""
        validate_plan(plan)
        refuse_secrets(codec.to_builtins(plan))
        return self.objects.put_framed(plan_bytes(plan))

    def put_blob(self, value: Any, *, allow_fields: Collection[str] = ()) -> BlobRef:
        """Store a large result as a blob; record the returned BlobRef in its place."""
        codec.check_depth(value)  # before the secret scan, which recurses
        refuse_secrets(value, allow_fields)
        return BlobRef(self.objects.put("blob", codec.encode_value(value)))

    def get_blob(self, ref: BlobRef | str) -> Any:
        """The value of a blob, verified."""
        blob_id = ref.blob if isinstance(ref, BlobRef) else ref
        try:
            return codec.decode_value(self.objects.get(blob_id, "blob"))
        except ValueError as exc:  # hash-valid but not a value castore writes (too deep, ...)
            raise ObjectCorruptError(blob_id, self.objects.path(blob_id), str(exc)) from exc

    def _slots(self, task_id: str) -> TaskSlots:
        slots = TaskSlots(self.layout, self.objects, task_id)
        # One lstat each (status calls this per task): absent is fine, a symlink is refused.
        for directory in (os.path.dirname(slots.directory), slots.directory):
            fsio.require_real_directory(directory)
        return slots

    @contextlib.contextmanager
    def _locked(self, task_id: str, timeout: float | None) -> Iterator[TaskLock | None]:
        """The task's local lock for the code that builds a Run: released if that code
        fails, handed over to the Run if it succeeds. None without a lock (timeout None, no
        task directory yet, or a filesystem without flock)."""
        lock = None
        if timeout is not None and os.path.isdir(self.layout.task_dir(task_id)):
            lock = TaskLock(self.layout.lock_path(task_id), task_id)
            lock = lock if lock.acquire(timeout) else None
        try:
            yield lock
        except BaseException:
            if lock is not None:
                lock.release()
            raise
