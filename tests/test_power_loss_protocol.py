"""Power loss during the side-effect protocol: every crash state resumes to a legal next action
and nothing is sent twice.

The recorder and crash model are those of tests/test_power_loss.py (read its docstring). The
workload here drives the protocol's other paths: reconcile → CONFIRMED, reconcile → NOT_DONE →
submitted again, an UNRESOLVED effect resolved by a person (confirmed, and not done then
resubmitted), an audited override of environment drift, and a failed fsync (of a temp file, and of
the chain directory after the commit point) followed by the next call. Its services are in-process
fakes whose ledger is the outside world: a power loss does not undo what the service applied. Each
application is stamped with the number of operations recorded before it, so a crash after op i
leaves the world as it was then (sends at most i, or fewer than i: the crash may have come before
or after a send that no operation separates from op i).

Each distinct (crash state, world) pair is materialised and judged: the store opens, every task
resumes (an EnvironmentDriftError only while the override is not in the chain), its next action
is the table's row for its HEAD, and driving it to the end (with a person resolving an
UNRESOLVED effect from the ledger's truth) applies no key twice. Every acknowledged commit
survives, as in the original test.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_power_loss import (
    STORE,
    Model,
    Op,
    Recorder,
    Verdict,
    _join,
    check_state,
    crash_states,
    lost_acks,
    materialize,
    scratch_dir,
    state_key,
)
from test_power_loss import _remove as remove_trees

import castore
from castore import Action, EffectState
from castore.format.layout import CHAIN_DIR, TASKS_DIR, parse_temp_name

PLAN = castore.Plan.build(
    "protocol", castore.effect("pay"), castore.effect("ship", "pay"), castore.Step("report")
)
OLD_ENV, NEW_ENV = castore.env_digest("config v1"), castore.env_digest("config v2")
# task -> how its services are declared: "lookup", "none" or "idempotent"
TASKS = {"reconcile": "lookup", "decide": "none", "override": "idempotent", "fsync": "lookup"}
SEED = int(os.environ.get("CASTORE_POWER_SEED", "20261130"))
# Distinct (state, world) pairs to resume at most; the S_min / S_max ones are always kept.
MAX_CHECKS = int(os.environ.get("CASTORE_POWER_PROTOCOL_MAX", "1500"))
WHO = "ana@ops"
# The rows of the next-action table, by HEAD's state of the frontier effect.
LEGAL = {
    EffectState.PLANNED: {Action.SUBMIT},
    EffectState.NOT_DONE: {Action.SUBMIT},
    EffectState.UNRESOLVED: {Action.ESCALATE},
    EffectState.SUBMITTED: {Action.RECONCILE, Action.RESUBMIT, Action.MARK_UNRESOLVED},
}


class Lost(Exception):
    """The service's answer did not come back (it may have applied the request)."""


@dataclass
class World:
    """The services' ledger: (key, receipt, ops recorded before the application)."""

    applied: list[tuple[str, str, int]] = field(default_factory=list)
    clock: Callable[[], int] = lambda: 0

    def apply(self, key: str, *, dedupe: bool) -> str:
        for known, receipt, _ in self.applied:
            if known == key and dedupe:
                return receipt
        receipt = f"rcpt-{len(self.applied) + 1}"
        self.applied.append((key, receipt, self.clock()))
        return receipt

    def truth(self, key: str) -> str | None:
        return next((receipt for known, receipt, _ in self.applied if known == key), None)

    def service(self, mode: str) -> castore.Service:
        if mode == "idempotent":
            return castore.Service("svc", idempotent=True, retention=3600)
        if mode == "lookup":

            def lookup(key: str) -> castore.Reconciled:
                found = self.truth(key)
                return castore.NOT_FOUND if found is None else castore.found(found)

            return castore.Service("svc", reconcile=lookup)
        return castore.Service("svc")

    def sender(self, mode: str) -> Callable[[str], str]:
        return lambda key: self.apply(key, dedupe=mode == "idempotent")

    def until(self, ops: int) -> World:
        """The ledger as it stood when `ops` operations had been recorded."""
        return World([entry for entry in self.applied if entry[2] <= ops])


class FaultyRecorder(Recorder):
    """The recorder, able to fail the next fsync of a file or of one directory (EIO): a failed
    fsync is not recorded, so it makes nothing durable, as on a real disk."""

    def __init__(self, base: str) -> None:
        super().__init__(base)
        self.fail_next: str | None = None  # "file", or a directory's path relative to base

    def _sync(self, real: str, fd: Any) -> None:
        entry = self.tracked(fd)
        if entry is not None and self.fail_next is not None:
            target = "file" if entry[0] == "file" else entry[1]
            if target == self.fail_next:
                self.fail_next = None
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        super()._sync(real, fd)


# -- the workload ----------------------------------------------------------------------------------


def _lose_the_answer(run: castore.Run, step: str, world: World, mode: str, *, sent: bool) -> None:
    """Submit `step`; the request is applied (`sent`) or not, and no answer comes back."""
    with pytest.raises(Lost):
        _send(run, step, world, mode, sent=sent)


def _send(run: castore.Run, step: str, world: World, mode: str, *, sent: bool) -> None:
    with run.effect(step, world.service(mode)) as call:
        if sent:
            world.apply(call.key, dedupe=mode == "idempotent")
        raise Lost(step)


def _reconcile(store: castore.Store, world: World) -> None:
    """lookup: pay applied, answer lost → reconcile → CONFIRMED; ship never sent → NOT_DONE →
    submitted again with the same key."""
    mode, service = "lookup", world.service("lookup")
    with store.start("reconcile", PLAN) as run:
        _lose_the_answer(run, "pay", world, mode, sent=True)
    with store.resume("reconcile", PLAN) as run:
        assert Action.SKIP == run.settle(service).action
        _lose_the_answer(run, "ship", world, mode, sent=False)
    with store.resume("reconcile", PLAN) as run:
        run.perform("ship", service, world.sender(mode))
        run.commit_step("report", "done")


def _decide(store: castore.Store, world: World) -> None:
    """none: pay applied, answer lost → UNRESOLVED → resolved CONFIRMED; ship never sent →
    UNRESOLVED → resolved NOT_DONE → submitted again."""
    mode, service = "none", world.service("none")
    with store.start("decide", PLAN) as run:
        _lose_the_answer(run, "pay", world, mode, sent=True)
        assert Action.ESCALATE == run.settle(service).action
    store.resolve("decide", "pay", receipt=world.truth(run.head.effects[0].key or ""), who=WHO)
    with store.resume("decide", PLAN) as run:
        _lose_the_answer(run, "ship", world, mode, sent=False)
        assert Action.ESCALATE == run.settle(service).action
    store.resolve("decide", "ship", not_done=True, reason="not in the ledger", who=WHO)
    with store.resume("decide", PLAN) as run:
        run.perform("ship", service, world.sender(mode))
        run.commit_step("report", "done")


def _override(store: castore.Store, world: World) -> None:
    """idempotent: pay confirmed; the environment changes; an audited override accepts it."""
    mode, service = "idempotent", world.service("idempotent")
    with store.start("override", PLAN, env=OLD_ENV) as run:
        run.perform("pay", service, world.sender(mode))
    store.override("override", who=WHO, why="config rotated on purpose", env=NEW_ENV)
    with store.resume("override", PLAN, env=NEW_ENV) as run:
        run.perform("ship", service, world.sender(mode))
        run.commit_step("report", "done")


def _fsync(store: castore.Store, world: World, recorder: FaultyRecorder) -> None:
    """lookup: the SUBMITTED commit's temp-file fsync fails (nothing sent; the same run tries
    again); the chain directory's fsync after ship's SUBMITTED link fails (CommitUncertainError,
    nothing sent; a new run resumes and reconciles)."""
    mode, service = "lookup", world.service("lookup")
    chain = f"{STORE}/{TASKS_DIR}/fsync/{CHAIN_DIR}"
    with store.start("fsync", PLAN) as run:
        recorder.fail_next = "file"
        with pytest.raises(castore.DurabilityError):
            run.perform("pay", service, world.sender(mode))
        assert recorder.fail_next is None
        run.perform("pay", service, world.sender(mode))
        recorder.fail_next = chain
        with pytest.raises(castore.CommitUncertainError):
            run.perform("ship", service, world.sender(mode))
        assert recorder.fail_next is None
    with store.resume("fsync", PLAN) as run:
        assert EffectState.SUBMITTED == run.head.effect("ship").state  # type: ignore[union-attr]
        run.perform("ship", service, world.sender(mode))
        run.commit_step("report", "done")


def record_protocol(base: Path) -> tuple[list[Op], World]:
    base.mkdir()
    recorder = FaultyRecorder(str(base))
    world = World(clock=lambda: len(recorder.ops))
    with recorder.installed():
        store = castore.Store.init(base / STORE)
        recorder.ops.append(Op("ack_init"))
        _reconcile(store, world)
        _decide(store, world)
        _override(store, world)
        _fsync(store, world, recorder)
    return recorder.ops, world


# -- judging one crash state -----------------------------------------------------------------------


def resume_and_drive(root: Path, world: World, acks: tuple[Op, ...]) -> list[str]:
    """Resume every task of the store at `root` and drive it to the end: what went wrong,
    including an acknowledged commit that did not survive."""
    store = castore.Store.open(root)
    verdict = Verdict(store=True)
    problems: list[str] = []
    for task in store.tasks():
        try:
            verdict.histories[task] = tuple(i for i, _ in reversed(store.history(task)))
            problems += _drive(store, task, TASKS[task], world)
        except castore.CastoreError as exc:
            problems.append(f"task {task!r}: {type(exc).__name__}: {exc}")
    problems += lost_acks(verdict, acks)
    twice = sorted({key for key, _, _ in world.applied if _count(world, key) > 1})
    problems += [f"key {key} applied {_count(world, key)} times" for key in twice]
    return problems


def _count(world: World, key: str) -> int:
    return sum(1 for known, _, _ in world.applied if known == key)


def _drive(store: castore.Store, task: str, mode: str, world: World) -> list[str]:
    env = NEW_ENV if task == "override" else None
    try:
        run = store.resume(task, PLAN, env=env)
    except castore.EnvironmentDriftError:
        # Legal only while the override is not in the chain (lost_acks judges whether it had
        # been acknowledged): the person makes the decision again.
        store.override(task, who=WHO, why="again, after a power loss", env=NEW_ENV)
        run = store.resume(task, PLAN, env=env)
    try:
        problem = _illegal_row(run)
        if problem:
            return [f"task {task!r}: {problem}"]
        for _ in range(4):  # each pass finishes the task or needs a person's decision
            _finish(run, mode, world)
            if run.finished:
                return []
            record = run.head.effect(run.next_step or "")
            if record is None or record.state is not EffectState.UNRESOLVED:
                return [f"task {task!r}: stopped at {run.next_step} with {record}"]
            truth = world.truth(record.key or "")
            run.close()
            if truth is None:
                store.resolve(task, record.step, not_done=True, reason="not applied", who=WHO)
            else:
                store.resolve(task, record.step, receipt=truth, who=WHO)
            run = store.resume(task, PLAN, env=env)
    finally:
        run.close()
    return [f"task {task!r} did not finish"]


def _illegal_row(run: castore.Run) -> str | None:
    action = run.next_action()
    step = run.next_step
    record = run.head.effect(step) if step is not None else None
    if record is not None and action.action not in LEGAL[record.state]:
        return f"{step} is {record.state} at HEAD, but its next action is {action.action}"
    if record is None and action.action not in (Action.RUN, Action.DONE):
        return f"{step} has no record at HEAD, but its next action is {action.action}"
    return None


def _finish(run: castore.Run, mode: str, world: World) -> None:
    """Every remaining step, until done or an effect's outcome is unknown."""
    for step in run.pending():
        if step == "report":
            run.commit_step(step, "done")
        else:
            try:
                run.perform(step, world.service(mode), world.sender(mode))
            except castore.OutcomeUnknownError:
                return


@dataclass
class Judged:
    candidates: int = 0  # distinct (state, world) pairs
    checks: int = 0  # of which resumed and driven
    problems: list[str] = field(default_factory=list)


def explore_protocol(
    ops: list[Op], world: World, scratch: Path, *, stop_at_first: bool = False
) -> Judged:
    model = Model(ops)
    marker = f"{STORE}/castore.json"
    judged = Judged()
    seen: set[tuple[frozenset[Any], int]] = set()
    candidates: list[tuple[bool, str, Any, Any, World]] = []
    # Every path a temp file ever had, named once (a state's tree is a subset of them): not a
    # regular expression per path per state, 11 million of them.
    temp_paths = {
        _join(op.dir, op.name)
        for op in ops
        if op.dir is not None and op.name is not None and parse_temp_name(op.name)
    }
    for point, label, variant, tree, contents in crash_states(model):
        if marker not in tree or not any(op.kind == "ack_init" for op in point.acks):
            continue  # an interrupted init: tests/test_power_loss.py covers those states
        # Temp files are left out: no reader of a chain opens one (tests/test_power_loss.py
        # judges them), and states that differ only in them resume alike.
        kept = {path: kind for path, kind in tree.items() if path not in temp_paths}
        key = state_key(kept, contents)
        for sent in sorted({point.index, max(point.index - 1, 0)}):
            mark = (key, len(world.until(sent).applied))
            if mark in seen:
                continue
            seen.add(mark)
            where = f"crash after op {point.index - 1} ({label}, {variant}), {sent} ops sent"
            essential = label in ("S_min", "S_max")
            candidates.append((essential, where, (point, kept, contents), key, world.until(sent)))
    rng = random.Random(SEED)
    must = [c for c in candidates if c[0]]
    rest = [c for c in candidates if not c[0]]
    chosen = must + rng.sample(rest, min(len(rest), max(0, MAX_CHECKS - len(must))))
    judged.candidates = len(candidates)
    done: list[str] = []
    try:
        for number, (_, where, (point, tree, contents), _, seen_world) in enumerate(chosen):
            dest = os.path.join(scratch, f"state-{number}")
            materialize(dest, tree, contents, model.modes)
            problems = []
            if number % 10 == 0:  # the full invariant check and fsck, on a sample (they cost)
                verdict = check_state(Path(dest))
                problems += verdict.problems + verdict.fsck_errors
            problems += resume_and_drive(Path(dest) / STORE, seen_world, point.acks)
            judged.problems += [f"{where}: {p}" for p in problems]
            judged.checks += 1
            done.append(dest)
            if stop_at_first and judged.problems:
                break
            if len(done) >= 100:
                remove_trees(done)
    finally:
        remove_trees(done)
    return judged


def test_every_protocol_crash_state_resumes_legally_and_sends_nothing_twice(
    tmp_path: Path,
) -> None:
    """reconcile, NOT_DONE and resubmission, resolve, override and failed fsyncs, cut by a
    power loss at every operation: each state resumes to the table's row, a person's decision
    is only ever needed for an UNRESOLVED effect, and no key is applied twice."""
    ops, world = record_protocol(tmp_path / "base")
    assert 8 == len(world.applied)  # pay + ship of 4 tasks, each applied once
    assert len({key for key, _, _ in world.applied}) == len(world.applied)
    (tmp_path / "states").mkdir()
    with scratch_dir(tmp_path / "states") as scratch:
        judged = explore_protocol(ops, world, scratch)
    print(
        f"\npower loss (protocol): {len(ops)} ops, {judged.candidates} distinct crash states "
        f"and worlds, {judged.checks} resumed and driven"
    )
    assert judged.checks > 200
    assert [] == judged.problems[:10]


def test_self_test_a_reconcile_that_never_finds_sends_twice_and_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checker fails when the protocol is broken: with every lookup answering "not found"
    (after the recording), some crash state resubmits an applied effect."""
    ops, world = record_protocol(tmp_path / "base")
    monkeypatch.setattr(castore.run.protocol, "_ask", lambda service, key: castore.NOT_FOUND)
    (tmp_path / "states").mkdir()
    with scratch_dir(tmp_path / "states") as scratch:
        judged = explore_protocol(ops, world, scratch, stop_at_first=True)
    assert any("applied 2 times" in problem for problem in judged.problems), judged.problems[:3]
