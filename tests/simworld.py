"""One simulated world per seed (tests/sim.py's endpoint, tests/interleave.py's scheduler):
writers of one task with a side effect, two `fsck --quarantine`, gc, a forgetter and readers
run together, and afterwards every promise is checked:

- no acknowledged commit lost: every snapshot a writer's commit returned is in the chain a
  fresh, fault-free resume verifies (an object missing is a lost commit);
- no effect sent twice: the fake service's own ledger holds each key at most once;
- no reader wrote: the endpoint saw no write request from a reader's threads;
- fsck is clean apart from the planted damage.

`MUTATIONS` re-plants each hole of issue 38 as it was before its fix; the self-test runs the
same seeds with one planted and requires the checker to catch it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import sim
from interleave import Scheduler

import castore
from castore import crashpoints
from castore.errors import (
    ConflictError,
    IntegrityError,
    StepInFlightError,
    StoreIOError,
    TaskBusyError,
    TaskExistsError,
)
from castore.format import identity
from castore.format.layout import object_key
from castore.maintenance.fsck import check_store
from castore.maintenance.fsck.quarantine import quarantine
from castore.maintenance.gc import collect
from castore.medium import s3client
from castore.medium.base import Judge, SetAside
from castore.medium.s3 import S3Medium
from castore.medium.s3client import Client, Missing
from castore.store import Store

TASK = "job-1"
FORGOTTEN = "old-1"
STEPS = ("fetch", "charge", "b", "c", "d", "e", "f", "g")
SHARED = "x" * 6000  # the result of SHARED_STEP: a blob, which the setup stores damaged
SHARED_STEP = "d"  # late enough that fsck may see the damage before a writer heals it
WRITERS = ("w1", "w2", "w3")
TASK2 = "job-2"  # w3's: every step stores the shared blob, a few turns apart
TASK2_STEPS = ("s0", "s1", "s2", "s3", "s4", "s5")
ATTEMPTS = 60
GRACE_S = 20
GCS = 12
READS = 40  # a reader reads again this often while the writers work
FSCKS = 12  # and an fsck --quarantine runs this often, FSCK_GAP turns or fewer apart
FSCK_GAP = 40
WAIT_TICKS = 2000  # the damager waits this many turns at most for the intact blob
DAMAGE_WITHIN = 30  # then spoils it within this many of its turns
DAMAGED = b"damaged bytes, not an object"
STEP_GAP = 80
_TOLERATED = (
    ConflictError,
    StepInFlightError,
    StoreIOError,
    TaskBusyError,
    TaskExistsError,
)


class _Everything(frozenset[str]):
    """Every point is a choice of the schedule."""

    def __contains__(self, item: object) -> bool:
        return True


@attrs.define
class Outcome:
    seed: int
    problems: list[str]
    schedule: str
    choices: int
    fates: dict[str, int]


class Service:
    """A payment service that can be asked by key; its ledger is the truth of what it did.
    Its send is a point of the schedule (the window in which a request may still be running)
    and loses its answer now and then."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ledger: list[str] = []
        self.spec = castore.Service("payments", reconcile=self.lookup)

    def send(self, key: str) -> str:
        crashpoints.reach("svc.sending")
        self.ledger.append(key)
        if self.rng.random() < 0.1:
            raise TimeoutError("the service's answer was lost")
        return f"rcpt-{key[:8]}"

    def lookup(self, key: str) -> Any:
        return castore.found(f"rcpt-{key[:8]}") if key in self.ledger else castore.NOT_FOUND


class World:
    def __init__(
        self, seed: int, profile: sim.Profile, faults: sim.Faults, *, fscks: int = 2
    ) -> None:
        self.seed = seed
        self.fscks = fscks
        self.rng = random.Random(seed)
        self.server = sim.Server(profile, self.rng, sim.NO_FAULTS)
        self.service = Service(self.rng)
        self.faults = faults
        self.plan = castore.Plan.build(
            "sim", *(castore.effect(s, "fetch") if s == "charge" else s for s in STEPS)
        )
        self.acked: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
        self.planted: set[str] = set()
        self.dirs: dict[str, str] = {}
        self.writers_done = 0

    def store(self, *, read_only: bool = False) -> Store:
        return Store(
            sim.medium(self.server),
            clock=lambda: int(self.server.now().timestamp() * 1000),
            read_only=read_only,
        )

    # -- setup: no faults, no scheduler --------------------------------------------------------
    def setup(self) -> None:
        Store.init(sim.medium(self.server))
        store = self.store()
        # The forgotten task is the shared blob's only holder: gc may reclaim the blob while
        # writers store it again (gc's handshake with them), and its bytes are the planted
        # damage until a writer heals them or fsck sets them aside.
        with store.open_task(FORGOTTEN, castore.Plan.build("old", "a")) as run:
            run.commit_step("a", store.put_blob(SHARED))
            blob = run.outcome("a").result_ref
        assert blob is not None
        key = f"{sim.medium(self.server).s3_key(object_key(blob))}"
        self.server.put(key, DAMAGED)
        self.planted.add(blob)
        self.shared = blob

    # -- actors --------------------------------------------------------------------------------
    def writer(self, name: str) -> None:
        try:
            self._write(name)
        finally:
            self.writers_done += 1

    def _write(self, name: str) -> None:
        """Attempts until the task is done, as a worker that is restarted after each error."""
        attempt = self._shared_attempt if name == "w3" else self._attempt
        for _ in range(ATTEMPTS):
            try:
                attempt(name)
            except (*_TOLERATED, _Again):
                continue
            except castore.CastoreError as exc:
                if not self._planted_in(exc):
                    raise
                continue  # the planted damage, until a writer heals it or a quarantine acts
            else:
                return

    def _attempt(self, name: str) -> None:
        store = self.store()
        with store.open_task(TASK, self.plan, lock_timeout=None) as run:
            for step in run.pending():
                if step == "charge":
                    with contextlib.suppress(TimeoutError):
                        run.perform(step, self.service.spec, self.service.send)
                    _require_done(run, step)
                else:
                    result = store.put_blob(SHARED) if step == SHARED_STEP else step
                    run.commit_step(step, result)
                self.acked[name].append((run.head.seq, run.head_id))

    def _shared_attempt(self, name: str) -> None:
        store = self.store()
        plan = castore.Plan.build("shared", *TASK2_STEPS)
        with store.open_task(TASK2, plan, lock_timeout=None) as run:
            for step in run.pending():
                for _ in range(self.rng.randrange(STEP_GAP)):
                    crashpoints.reach("sim.tick")
                run.commit_step(step, store.put_blob(SHARED))
                self.acked[name].append((run.head.seq, run.head_id))

    def _planted_in(self, exc: BaseException) -> bool:
        return any(blob in str(exc) for blob in self.planted)

    def fsck(self) -> None:
        """`fsck --quarantine`, again and again while the writers work."""
        for _ in range(FSCKS):
            if self.writers_done == len(WRITERS):
                return
            for _ in range(self.rng.randrange(FSCK_GAP)):
                crashpoints.reach("sim.tick")
            medium = sim.medium(self.server)
            with contextlib.suppress(StoreIOError):
                quarantine(medium, list(check_store(medium)))

    def damager(self) -> None:
        """Bit rot: soon after a writer stored the shared blob intact, its bytes are spoilt
        where they lie (a writer that needs them next heals them; fsck may quarantine them)."""
        key = sim.medium(self.server).s3_key(object_key(self.shared))
        for _ in range(WAIT_TICKS):
            crashpoints.reach("sim.tick")
            found = self.server.objects.get(key)
            if found is not None and found.data != DAMAGED:
                break
        for _ in range(self.rng.randrange(DAMAGE_WITHIN)):
            crashpoints.reach("sim.tick")
        crashpoints.reach("sim.damage")
        if key in self.server.objects:
            self.server.put(key, DAMAGED)

    def gc(self) -> None:
        """gc, again and again while the writers work, on the endpoint's clock (one second a
        request) with a grace period of GRACE_S requests: what a writer published in that
        time is young, as in a real store."""
        for _ in range(GCS):
            if self.writers_done == len(WRITERS):
                return
            for _ in range(self.rng.randrange(FSCK_GAP)):
                crashpoints.reach("sim.tick")
            with contextlib.suppress(StoreIOError, ConflictError):
                now = self.server.now().timestamp()
                collect(sim.medium(self.server), grace_s=GRACE_S, now=now)  # type: ignore[arg-type]

    def forgetter(self) -> None:
        with contextlib.suppress(StoreIOError, ConflictError):
            self.store().forget(FORGOTTEN, who="sim", why="the simulation forgets it")

    def reader(self) -> None:
        """What a reader does (status, a verified read, a saver's get_tuple: a resume that
        commits nothing), on a store that is *not* read-only: the endpoint's log says
        whether it wrote."""
        for _ in range(READS):
            if self.writers_done == len(WRITERS):
                return
            with contextlib.suppress(StoreIOError, IntegrityError, castore.TaskNotFoundError):
                store = self.store()
                store.status(TASK)
                run = store.resume(TASK, self.plan, lock_timeout=None)
                run.close(finish=False)

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> Outcome:
        with deterministic(self.rng):
            self.setup()
            scheduler = Scheduler({"*": _Everything()}, [], chooser=Pauses(self.rng))
            self.server.actor_of = scheduler.current
            self.server.faults = self.faults
            actors: dict[str, Callable[[], None]] = {
                "w1": lambda: self.writer("w1"),
                "w2": lambda: self.writer("w2"),
                "w3": lambda: self.writer("w3"),
                **{f"q{n}": self.fsck for n in range(1, self.fscks + 1)},
                "gc": self.gc,
                "forget": self.forgetter,
                "damage": self.damager,
                "reader": self.reader,
            }
            with tempfile.TemporaryDirectory() as scratch, scheduler.installed():
                for name in actors:
                    self.dirs[name] = os.path.join(scratch, name)
                    os.mkdir(self.dirs[name])
                _chdir_per_actor(scheduler, self.dirs)
                for name, body in actors.items():
                    scheduler.spawn(name, body)
                try:
                    scheduler.drive()
                finally:
                    scheduler.release()
            self.server.faults = sim.NO_FAULTS
            self.server.actor_of = lambda: None
            self.server.land_all()
            problems = self.check(scheduler)
        trace = scheduler.trace
        return Outcome(
            self.seed, problems, trace.schedule(), len(trace.steps), dict(self.server.fates)
        )

    # -- the promises --------------------------------------------------------------------------
    def check(self, scheduler: Scheduler) -> list[str]:
        problems = [
            f"actor {name} raised {type(exc).__name__}: {exc}"
            for name, exc in scheduler.trace.errors.items()
        ]
        self.errors = dict(scheduler.trace.errors)
        problems += self._lost_commits()
        for key, sent in collections.Counter(self.service.ledger).items():
            if sent > 1:
                problems.append(f"the effect with key {key} was sent {sent} times")
        for actor, key in self.server.intact_removed:
            if actor.startswith("q"):
                problems.append(f"fsck --quarantine ({actor}) removed the intact object {key}")
        readers = {k: v for k, v in self.server.writes_by.items() if k.startswith("reader")}
        if readers:
            problems.append(f"a reader wrote: {readers}")
        for finding in check_store(sim.medium(self.server)):
            if finding.severity == "error" and not self._planted_in(
                Exception(f"{finding.object_id} {finding.message}")
            ):
                problems.append(f"fsck: {finding.code} {finding.path}")
        return problems

    def _lost_commits(self) -> list[str]:
        problems = []
        store = self.store()
        for task, names in ((TASK, ("w1", "w2")), (TASK2, ("w3",))):
            try:
                history = dict(store.history(task))
                store.verify(task)
            except Exception as exc:  # noqa: BLE001 - any failure to read a task is the finding
                # The planted damage, or its quarantine, explains a damaged or missing shared
                # blob; the endpoint's log says whether intact bytes were removed (check).
                if not self._planted_in(exc):
                    problems.append(f"{task} does not verify: {type(exc).__name__}: {exc}")
                continue
            for name in names:
                for seq, snapshot_id in self.acked[name]:
                    if snapshot_id not in history:
                        problems.append(f"{name}'s acknowledged commit {seq} of {task} is lost")
        return problems


# Where an actor may be held back for a long while (a slow request, a GC pause, a process
# stopped): the windows the promises are about.
WINDOWS = frozenset(
    {
        "actor.start",  # actors start at random times
        "quarantine.moved",  # fsck: copied aside, before the DELETE
        "svc.sending",  # an effect's request is on its way
        "effect.submitted",
        "seal.committed",  # a SEAL snapshot committed, its mark and prune not yet
        "mark.before_write",
        "commit.before_link",
        "gc.set_aside",
        "s3.delete_object",
        "s3.put_object",
    }
)
PAUSE_P = 0.5
PAUSE_CHOICES = (10, 200)


class Pauses:
    """The schedule's chooser: uniform among the actors that may go on, except that an actor
    arriving at one of the WINDOWS is, half the time, held back for a random number of
    choices (while any other can go on), all drawn from the seed."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.held: dict[str, int] = {}  # actor -> the choice index it is held until
        self.decided: set[str] = set()  # actors whose present point was decided on

    def __call__(self, index: int, options: tuple[tuple[str, str], ...]) -> int:
        for name, point in options:
            if name not in self.decided:  # a new arrival: an actor goes on from a point once
                self.decided.add(name)
                if point in WINDOWS and self.rng.random() < PAUSE_P:
                    self.held[name] = index + self.rng.randint(*PAUSE_CHOICES)
        free = [n for n, (name, _) in enumerate(options) if self.held.get(name, -1) < index]
        if free:
            pick = self.rng.choice(free)
        else:
            pick = min(range(len(options)), key=lambda n: self.held[options[n][0]])
        self.decided.discard(options[pick][0])
        return pick


class _Again(Exception):
    """The effect's send failed: the writer starts over, as a restarted worker would."""


def _require_done(run: Any, step: str) -> None:
    if not run.done(step):
        raise _Again


def _chdir_per_actor(scheduler: Scheduler, dirs: dict[str, str]) -> None:
    """Each actor works in its own directory (agents that work per task do): the process's
    working directory changes at every turn, as it does between two runs of one process."""
    hook = scheduler._hook

    def turning(point: str, ready: Any) -> None:
        hook(point, ready)
        name = scheduler.current()
        if name is not None:
            os.chdir(dirs[name.split(".")[0]])

    crashpoints.install_hook(turning)


@contextlib.contextmanager
def deterministic(rng: random.Random) -> Iterator[None]:
    """Run ids and temp names from `rng`; castore's backoff and settle waits take no time."""
    saved = (identity.token_hex, identity.random_bits, s3client.time, os.getcwd())

    class _Time:
        monotonic = staticmethod(lambda: 0.0)

        @staticmethod
        def sleep(seconds: float) -> None:
            del seconds

    identity.token_hex = lambda n: rng.randbytes(n).hex()  # type: ignore[assignment]
    identity.random_bits = rng.getrandbits  # type: ignore[assignment]
    s3client.time = _Time  # type: ignore[assignment]
    try:
        yield
    finally:
        identity.token_hex, identity.random_bits, s3client.time = saved[:3]  # type: ignore[assignment]
        os.chdir(saved[3])


def explore(
    seeds: range, profile: sim.Profile, faults: sim.Faults | None = None, *, fscks: int = 2
) -> list[Outcome]:
    return [World(seed, profile, faults or sim.Faults(), fscks=fscks).run() for seed in seeds]


# -- the holes of issue 38, re-planted as they were before their fixes -------------------------
def _blind_quarantine(medium: S3Medium, key: str, target: str, still_bad: Judge) -> SetAside:
    """Hole 1: a copy, judged, then an unconditional DELETE of the original."""
    try:
        data, entry = medium.read_entry(key)
    except FileNotFoundError:
        return "kept"
    if not still_bad(data, entry):
        return "kept"
    try:
        medium.client.call(
            medium.where(target),
            "copy_object",
            Key=medium.s3_key(target),
            CopySource={"Bucket": medium.client.bucket, "Key": medium.s3_key(key)},
        )
    except Missing:
        return "kept"
    try:
        copied = medium.read_entry(target)
    except FileNotFoundError:
        return "kept"
    if not still_bad(*copied):
        medium.remove(target)
        return "kept"
    medium.remove(key)
    return "moved"


def _retrying_call(self: Client, where: str, operation: str, **params: Any) -> Any:
    """Hole 2: every request retried, a plain DELETE included (so none is ever unanswered,
    and `settle` has nothing to wait for)."""
    method = getattr(self._s3, operation)
    return self._retrying(
        where, operation, lambda: method(Bucket=self.bucket, **params), s3client.ATTEMPTS
    )


def _path_place(self: Any) -> str:
    """Hole 3: the in-flight registry keyed by a path string (relative for an s3:// URL)."""
    return os.path.realpath(self._slots.directory)


def _pruning_init(original: Callable[..., None]) -> Callable[..., None]:
    """Hole 4: a resume finishes an interrupted prune at once, whoever resumes (a reader)."""

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._finish_prune_if_due()

    return init


@contextlib.contextmanager
def planted(mutation: str) -> Iterator[None]:
    """Re-plant one hole for the self-test (`MUTATIONS`)."""
    from castore.run import core  # noqa: PLC0415 - the class the mutations patch

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    if mutation == "blind-quarantine-delete":
        patch(S3Medium, "set_aside", _blind_quarantine)
    elif mutation == "retried-delete":
        # As the issue found it: the old client retries a plain DELETE, and quarantine's
        # DELETE is plain, with one fsck (so a second remover is not what loses the commit).
        patch(S3Medium, "set_aside", _blind_quarantine)
        patch(Client, "call", _retrying_call)
    elif mutation == "identity-from-path":
        patch(core.RunCore, "task_place", property(_path_place))
    elif mutation == "reader-prunes":
        patch(core.RunCore, "__init__", _pruning_init(core.RunCore.__init__))
    else:
        raise ValueError(mutation)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


MUTATIONS = ("blind-quarantine-delete", "retried-delete", "identity-from-path", "reader-prunes")
# The world each mutation is run in: hole 2 with one fsck, as the issue reproduced it.
FSCKS_FOR = {"retried-delete": 1}
