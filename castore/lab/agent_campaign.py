"""The agent campaign: SIGKILL the sample agent (castore.lab.agent) at random moments and at
named crash points, restart it until it finishes, then judge from the fake service's ledger
and the fake model's bill (castore.lab.agent_judge), and compare each final answer with an
uninterrupted run of the same seed.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import castore
from castore.chain.outcomes import Outcome
from castore.format.model import attrs
from castore.lab import agent, agent_judge, worker
from castore.lab.agent_judge import Attempt
from castore.lab.campaign import finish, resolve_from_ledger, spawn, wait_ready
from castore.lab.fakemodel import FakeModel, read_model_log
from castore.lab.service import ServiceProcess, read_ledger, start_service

MAX_ATTEMPTS = 400
Say = Callable[[str], None]

# Where a kill is aimed, and up to which arrival: the agent's own moments and castore's.
KILL_POINTS = (
    ("agent.model_answered", 8),
    ("agent.thought", 8),
    ("agent.tool_returned", 5),
    ("agent.acted", 7),
    ("agent.answered", 1),
    ("grow.decided", 16),
    ("effect.submitted", 3),
    ("effect.sent", 3),
    ("effect.confirmed", 3),
    ("commit.before_link", 24),
    ("commit.linked", 24),
    ("commit.done", 24),
    ("object.temp_synced", 24),
)

# Points every run reaches at least twice (two model calls: an action and the answer): each
# run's first attempt is killed at one of them, so no run finishes without a kill.
SURE_POINTS = ("agent.model_answered", "agent.thought", "commit.linked", "object.temp_synced")


@attrs.frozen
class AgentSettings:
    mode: str
    seed: int
    use_async: bool = False
    point_share: float = 0.4
    fault_share: float = 0.1
    latency_ms: float = 2.0
    pay_first: bool = False  # a broken agent, to show the judge catching re-billed calls
    store: str | None = None  # where the agents commit (an s3:// URL); None: workdir/store


@attrs.define
class AgentTally:
    """What the campaign counted; `line()` is its last line."""

    runs: int = 0
    kills: int = 0
    point_kills: int = 0
    random_kills: int = 0
    faults: int = 0
    restarts: int = 0
    calls: int = 0
    duplicates: int = 0
    rebilled: int = 0
    inflight_repeats: int = 0
    differ: int = 0
    unresolved: int = 0
    lost: int = 0
    corrupt: int = 0
    other: int = 0  # a repeated call with other messages, or a bill no attempt of ours made
    problems: list[str] = attrs.field(factory=list)

    @property
    def ok(self) -> bool:
        return (
            not (self.duplicates or self.rebilled or self.differ or self.lost or self.corrupt)
            and not self.other
        )

    def details(self) -> str:
        keys = ("point_kills", "random_kills", "faults", "restarts", "calls", "lost", "corrupt")
        return " ".join(f"{key}={getattr(self, key)}" for key in (*keys, "other"))

    def line(self) -> str:
        keys = ("runs", "kills", "duplicates", "rebilled", "inflight_repeats", "differ")
        return "agent " + " ".join(f"{key}={getattr(self, key)}" for key in (*keys, "unresolved"))


@attrs.define
class Lab:
    """One campaign's fixtures: the stores, the bills, the service and the kill schedule."""

    workdir: Path
    settings: AgentSettings
    svc: ServiceProcess
    rng: random.Random
    tally: AgentTally
    attempts: list[Attempt] = attrs.field(factory=list)
    expected: list[dict[str, Any]] = attrs.field(factory=list)  # the reference answers

    @property
    def store_path(self) -> Path | str:
        return self.settings.store or self.workdir / "store"

    @property
    def model_log(self) -> Path:
        return self.workdir / "model.jsonl"

    @property
    def ledger(self) -> Path:
        return self.workdir / f"ledger-{self.settings.mode}.jsonl"

    def command(self, task: str, model_seed: str) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "castore.lab.agent",
            "--store",
            str(self.store_path),
            "--task",
            task,
            "--service",
            self.svc.url,
            "--mode",
            self.settings.mode,
            "--seed",
            model_seed,
            "--model-log",
            str(self.model_log),
            "--latency-ms",
            str(self.settings.latency_ms),
        ]
        if self.settings.pay_first:
            argv.append("--pay-first")
        return [*argv, "--async"] if self.settings.use_async else argv


def reference(lab: Lab, index: int) -> tuple[dict[str, Any], float]:
    """An uninterrupted run of the same seed (its own task, store and bill): its answer and
    how long it took (random kills land within that)."""
    store = castore.Store.open(lab.workdir / "reference", create=True)
    client = lab.svc.client(timeout=10.0)
    declared = worker.services(client, lab.settings.mode)
    model = FakeModel(model_seed(lab, index), lab.workdir / "reference-model.jsonl")
    task = f"reference-{lab.settings.seed}-{index}"
    started = time.monotonic()
    try:
        if lab.settings.use_async:
            from castore.lab import agent_async  # noqa: PLC0415 - the sync campaign does without

            answer = asyncio.run(agent_async.run_task(store, task, model, client, declared))
        else:
            answer = agent.run_task(store, task, model, client, declared)
    finally:
        model.close()
    return answer, time.monotonic() - started


def model_seed(lab: Lab, index: int) -> str:
    return f"{lab.settings.seed}-{index}"


def committed(store: castore.Store, task: str) -> frozenset[str]:
    """The steps castore has a durable result for (read while no agent runs)."""
    if task not in set(store.tasks()):
        return frozenset()
    return frozenset(store.verify(task).outcomes)


def drive(lab: Lab, index: int, window_s: float) -> None:
    """Start, kill and restart one task's agent until it finishes."""
    task = f"agent-{lab.settings.seed}-{index}"
    settings, rng, tally = lab.settings, lab.rng, lab.tally
    client = lab.svc.client()
    store = castore.Store.open(lab.store_path, create=True)
    for attempt in range(MAX_ATTEMPTS):
        roll = rng.random()
        crash_at = None
        if attempt == 0:
            crash_at = f"{rng.choice(SURE_POINTS)}:{rng.randint(1, 2)}"
        elif roll < settings.point_share:
            point, top = rng.choice(KILL_POINTS)
            crash_at = f"{point}:{rng.randint(1, top)}"
        elif roll < settings.point_share + settings.fault_share:
            client.control(drop_after_commit=1)
            tally.faults += 1
        before = committed(store, task)
        process = spawn(lab.command(task, model_seed(lab, index)), crash_at)
        lab.attempts.append(Attempt(task, process.pid, before))
        ready = wait_ready(process)
        random_kill = (
            ready and crash_at is None and roll >= settings.point_share + settings.fault_share
        )
        code, output = finish(process, rng.uniform(0, window_s) if random_kill else None)
        client.control(drop_after_commit=0)
        if code == -signal.SIGKILL:
            tally.kills += 1
            tally.point_kills += crash_at is not None
            tally.random_kills += crash_at is None
        if code == worker.EXIT_DONE:
            return
        if code == worker.EXIT_UNKNOWN:
            tally.unresolved += 1
            resolve_from_ledger(store, task, lab.svc, lab.ledger)
        elif code == worker.EXIT_REFUSED:
            tally.corrupt += 1
            tally.problems.append(f"{task}: resume refused: {output.strip()[-300:]}")
            return
        elif code not in (-signal.SIGKILL, worker.EXIT_INTERRUPTED, worker.EXIT_CONFLICT):
            raise RuntimeError(f"agent for {task} exited {code}:\n{output}")
        tally.restarts += 1
    raise RuntimeError(f"{task} did not finish in {MAX_ATTEMPTS} attempts")


def check_task(
    lab: Lab, index: int, expected: dict[str, Any], ledger: list[dict[str, Any]]
) -> None:
    """The task's answer against the reference, its receipts against the ledger."""
    task = f"agent-{lab.settings.seed}-{index}"
    tally = lab.tally
    try:
        chain = castore.Store.open(lab.store_path).verify(task)
    except castore.CastoreError as exc:
        tally.corrupt += 1
        tally.problems.append(f"{task}: {exc}")
        return
    answer = recorded(lab, chain.outcomes.get("answer"))
    if answer != expected:
        tally.differ += 1
        tally.problems.append(f"{task}: answer {answer} differs from the reference {expected}")
    for step, outcome in chain.outcomes.items():
        if outcome.receipt is None:
            continue
        key = castore.derive_step_key(task, step)
        applied = [entry["receipt"] for entry in ledger if entry["key"] == key]
        if outcome.receipt not in applied:
            tally.lost += 1
            tally.problems.append(f"{task}: {step} receipt {outcome.receipt} not in the ledger")


def recorded(lab: Lab, outcome: Outcome | None) -> Any:
    """A step's recorded result, from its blob when it was stored by reference."""
    if outcome is None or outcome.result_ref is None:
        return None if outcome is None else outcome.result
    return castore.Store.open(lab.store_path).get_blob(outcome.result_ref)


def judge(lab: Lab) -> None:
    """Fold the bill's and the ledger's verdicts into the tally."""
    bills = agent_judge.judge_bills(read_model_log(lab.model_log), lab.attempts)
    tally = lab.tally
    tally.calls = bills.calls
    tally.rebilled, tally.inflight_repeats = bills.rebilled, bills.inflight_repeats
    tally.other += bills.changed_args + bills.stray
    surplus, problems = agent_judge.duplicates(read_ledger(lab.ledger))
    tally.duplicates += surplus
    tally.problems += bills.problems + problems


def run_campaign(workdir: Path, runs: int, settings: AgentSettings, say: Say | None = None) -> Lab:
    """Drive `runs` agent tasks under fire and judge them; the lab keeps what was judged
    (files under `workdir`, the attempts) for a second look."""
    rng = random.Random(settings.seed)  # noqa: S311 - a reproducible kill schedule
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with start_service(workdir / f"ledger-{settings.mode}.jsonl", settings.mode) as svc:
        lab = Lab(workdir, settings, svc, rng, AgentTally())
        castore.Store.open(lab.store_path, create=True)
        for index in range(runs):
            answer, took = reference(lab, index)
            lab.expected.append(answer)
            drive(lab, index, window_s=1.5 * took + 0.005)
            lab.tally.runs += 1
            if say and (index + 1) % max(1, runs // 10) == 0:
                elapsed = time.monotonic() - started
                say(f"  {index + 1}/{runs} runs, {lab.tally.kills} kills, {elapsed:.0f}s")
    ledger = read_ledger(lab.ledger)
    for index in range(runs):
        check_task(lab, index, lab.expected[index], ledger)
    judge(lab)
    return lab


def agent_campaign(
    workdir: Path, runs: int, settings: AgentSettings, say: Say | None = None
) -> AgentTally:
    """Drive `runs` agent tasks under fire; return the tally."""
    return run_campaign(workdir, runs, settings, say).tally
