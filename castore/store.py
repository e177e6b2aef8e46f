"""The store facade: create or open a store; start, resume and inspect tasks."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from castore.chain import briefview, sealmark, status, storeinit, trees
from castore.chain.objects import ObjectStore
from castore.chain.outcomes import Outcomes
from castore.chain.packwalk import read_pack
from castore.chain.refs import TaskSlots
from castore.chain.seal import SEAL_EVERY
from castore.chain.status import TaskStatus
from castore.chain.trees import RawRef, Tree, TreeRef
from castore.chain.verify import (
    VerifiedChain,
    decode_snapshot,
    verified_head,
    verify_chain,
    verify_head,
)
from castore.errors import (
    ConflictError,
    EncodingError,
    ForkError,
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
from castore.format import codec
from castore.format.digest import hash_bytes
from castore.format.guard import DEFAULT_SNAPSHOT_BUDGET, refuse_secrets
from castore.format.layout import CHAIN_DIR, Layout, decode_task_id, slot_name
from castore.format.plans import plan_bytes, validate_plan
from castore.format.plans import plan_id as plan_digest
from castore.format.records import BlobRef, Plan, Snapshot
from castore.medium import fsio
from castore.medium.tasklock import TaskLock
from castore.run import brief, forget, fork, gate, resolution
from castore.run.forget import Forgotten
from castore.run.fork import Forked
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

MARKER = storeinit.MARKER
DEFAULT_LOCK_TIMEOUT = 10.0
FIRST_SLOT = slot_name(0)
_HEIGHTS_KEPT = 1 << 16  # tree heights remembered by one Store (put_tree's depth check)


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
        self._heights: dict[str, int] = {}
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
        store._heights = {}
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
        self.objects.snapshot_names_durable = version < 2

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
        settings = self._settings(env, allow_fields)
        validate_plan(plan)
        self._require_fixed_in_v1(plan)
        # Built and checked (a secret in the id or the env anchor) before anything is written.
        head = initial_snapshot(task_id, plan, plan_digest(plan), settings)
        data = encode_snapshot(head, settings)
        plan_id = self.put_plan(plan)
        if os.path.isdir(slots.directory):
            # A forgotten task whose history gc reclaimed has no slot 0 to conflict on.
            forget.refuse_forgotten(slots)
        fsio.make_dir_durable(self.layout.task_dir(task_id))
        fsio.make_dir_durable(slots.directory)
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
        plan: Plan,
        *,
        env: EnvSource = None,
        allow_fields: Collection[str] = (),
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    ) -> Run:
        """Verify task `task_id` from HEAD to its plan root, pass the gate, return its run."""
        slots = self._slots(task_id)
        settings = self._settings(env, allow_fields)
        refuse_recorded_secrets(task_id, None, settings)  # each commit would write it again
        validate_plan(plan)
        self._require_fixed_in_v1(plan)
        plan_id = plan_digest(plan)
        with self._locked(task_id, lock_timeout) as lock:
            chain = self._verify_live(slots, (plan_id, plan), keep_tail=self._sealing)
            # A fork's outcomes, by their tree (format 2 only: a v1 store holds no fork).
            carried = fork.carried_by(self.objects, chain) if self._sealing else {}
            gate.check_plan(chain, plan, plan_id)
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
            tombstone = forget.tombstone_head(self._slots(task_id)) if verify else None
            if tombstone is not None:
                head = tombstone  # the history below a tombstone may be reclaimed (gc)
            elif verify:
                head = verified_head(self.verify(task_id))
            else:
                head = verify_head(self._slots(task_id))
        except (IntegrityError, FormatVersionError) as exc:  # a planted file included
            return status.broken(task_id, exc)
        return status.describe(head, self._clock())

    def brief(
        self,
        task_id: str,
        *,
        budget_tokens: int = brief.DEFAULT_BUDGET,
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
        return SEAL_EVERY if self._sealing else None

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

    def _require_v2(self, verb: str) -> None:
        """A v1 store is written as v1 until it is upgraded: nothing v2-only (a raw or tree
        object, a tombstone, a fork) goes into it, so every reader of it still reads it all."""
        if self.format_version < 2:
            raise UsageError(
                f"{verb} writes format-2 records, and {self.root} is a "
                f"format-{self.format_version} store; run `castore upgrade {self.root}` first "
                "(a castore that reads only format 1 then refuses the store)"
            )

    def _verify_live(
        self,
        slots: TaskSlots,
        expected_plan: tuple[str, Plan] | None = None,
        *,
        keep_tail: bool = False,
    ) -> VerifiedChain:
        """The verified chain of a task that may still be worked on: TaskForgottenError if
        it ends with a tombstone (whose history gc may have reclaimed, breaking the walk).
        `keep_tail`: keep the tail's bytes, for a run that seals."""
        try:
            chain = verify_chain(self.objects, slots, expected_plan, keep_tail=keep_tail)
        except (IntegrityError, TaskNotFoundError):
            forget.refuse_forgotten(slots)
            raise
        if forget.is_tombstone(chain.head):
            raise forget.forgotten_error(slots.task_id, chain.head)
        return chain

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
            # From the name decode_task_id checked (status pays for each id once, not thrice).
            # Slot 0 of a long task may be pruned: its sealed mark then says it started.
            task_dir = os.path.join(self.layout.tasks, name)
            if os.path.lexists(
                os.path.join(task_dir, CHAIN_DIR, FIRST_SLOT)
            ) or sealmark.started_by_mark(task_dir):
                found.append(task_id)
        return sorted(found)

    def history(self, task_id: str) -> list[tuple[str, Snapshot]]:
        """(id, snapshot) for every snapshot of a verified task, newest first: the tail as
        the walk kept it, then each pack's snapshots (its digest was verified by the walk)."""
        chain = verify_chain(self.objects, self._slots(task_id), keep_tail=True)
        found = [(hash_bytes(data), decode_snapshot(data)) for data in reversed(chain.tail)]
        for ref in chain.outcomes.pack_refs:
            pack = read_pack(self.objects, task_id, ref.id)
            found += [
                (hash_bytes(data), decode_snapshot(data)) for data in reversed(pack.inflate())
            ]
        return found

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

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Objects put in this thread inside the block (put_blob, put_raw, put_tree) are
        published together when it ends: two flushes for all of them instead of two each,
        on filesystems whose flushes castore shares (FORMAT.md 9.2; elsewhere each put
        publishes itself). Commit only after the block: until it ends nothing is named.

            with store.batch():
                parts = {name: store.put_raw(body) for name, body in bodies.items()}
                tree = store.put_tree(parts)
            run.commit_step("save", tree)
        """
        return self.objects.batch()

    def put_raw(self, data: bytes) -> RawRef:
        """Store bytes verbatim (serialized framework state, an encrypted payload) as one raw
        object; record the returned RawRef as a step's result or name it in a tree.

        The secret guard cannot look inside: bytes have no fields to judge and may be
        compressed or encrypted, so a credential in them is stored as it is. Encrypt what
        must not be at rest in the store."""
        framed = trees.raw_bytes(data)
        self._require_v2("put_raw")
        return RawRef(self.objects.put_framed(framed))

    def get_raw(self, ref: RawRef | str) -> bytes:
        """The bytes of a raw object, verified."""
        return self.objects.get(trees.ref_id(ref), "raw")

    def put_tree(
        self,
        refs: Mapping[str, trees.Ref | str],
        data: Any = None,
        *,
        allow_fields: Collection[str] = (),
    ) -> TreeRef:
        """Store a tree: `refs` names its parts (blobs, raw objects, trees) by name, `data`
        is any value. gc keeps and fsck checks every part a committed tree names. Each part
        must be stored already (UsageError otherwise) and is made young again, as storing it
        again would. `data` and the part names pass the secret guard, as a blob does."""
        tree = trees.tree_of(refs, data)
        codec.check_depth(data)  # before the secret scan, which recurses
        refuse_secrets(data, allow_fields, "$.data")
        refuse_secrets(list(tree.refs), allow_fields, "$.refs")  # names as text: a token?
        framed = trees.tree_bytes(tree)
        self._require_v2("put_tree")
        tallest = 0
        for name, part in sorted(tree.refs.items()):
            kind = self.objects.kind_of(part)
            # A part put in this thread's open batch is named once the batch ends (batch()).
            fresh = self.objects.pending(part) is not None
            if kind not in trees.PART_KINDS or not (
                fresh or fsio.refresh_mtime(self.objects.path(part))
            ):
                found = "no such object" if kind is None else f"a {kind}"
                raise UsageError(
                    f"part {name!r} of the tree names {part}: {found} in {self.root}; store "
                    "it first with put_blob, put_raw or put_tree and name what they return"
                )
            if kind == "tree":
                tallest = max(tallest, self._tree_height(part))
        if tallest >= trees.MAX_TREE_DEPTH:
            raise EncodingError(
                "$.refs",
                f"the tree would nest {tallest + 1} trees deep (castore's limit is "
                f"{trees.MAX_TREE_DEPTH})",
                "name the parts of the deep trees from a flatter tree",
            )
        return TreeRef(self.objects.put_framed(framed))

    def get_tree(self, ref: TreeRef | str) -> Tree:
        """The record of a tree object, verified: its `data` and `refs` (name -> id)."""
        tree_id = trees.ref_id(ref)
        body = self.objects.get(tree_id, "tree")
        try:
            return trees.decode_tree(body)
        except ValueError as exc:  # hash-valid but not a tree castore writes
            raise ObjectCorruptError(tree_id, self.objects.path(tree_id), str(exc)) from exc

    def _tree_height(self, tree_id: str) -> int:
        """How many trees deep a stored tree nests (memoised: an id's height never changes)."""

        def tree_children(parent: str) -> list[str]:
            refs = self.get_tree(parent).refs.values()
            return [part for part in refs if self.objects.kind_of(part) == "tree"]

        if len(self._heights) > _HEIGHTS_KEPT:
            self._heights.clear()
        try:
            return trees.height(tree_id, tree_children, self._heights)
        except ValueError as exc:
            path = self.objects.path(tree_id)
            raise ObjectCorruptError(tree_id, path, str(exc)) from exc

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
