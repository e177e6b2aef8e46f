"""Crash campaigns: kill the sample worker at random moments and at named points, restart it
until its task completes, and check the outside world's ledger against castore's store.

The judge is the fake service's own ledger, read from its file, not castore's view: an effect
applied twice is a duplicate whatever castore believes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import castore
from castore.crashpoints import ENV_VAR, POINTS
from castore.format.model import attrs
from castore.lab import worker
from castore.lab.service import ServiceProcess, read_ledger, start_service

MAX_ATTEMPTS = 400
WORKER_TIMEOUT_S = 60.0
Say = Callable[[str], None]


@attrs.define
class Tally:
    """What a campaign counted; the key=value lines of its report."""

    runs: int = 0
    kills: int = 0
    point_kills: int = 0
    random_kills: int = 0
    faults: int = 0
    restarts: int = 0
    duplicates: int = 0
    lost: int = 0
    unresolved_reported: int = 0
    corrupt: int = 0
    mismatched: int = 0
    problems: list[str] = attrs.field(factory=list)

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.lost or self.corrupt or self.mismatched)

    def lines(self) -> list[str]:
        keys = (
            "runs",
            "kills",
            "point_kills",
            "random_kills",
            "faults",
            "restarts",
            "duplicates",
            "lost",
            "unresolved_reported",
            "corrupt",
            "mismatched",
        )
        return [f"{key}={getattr(self, key)}" for key in keys]


@attrs.frozen
class Settings:
    mode: str
    seed: int
    blind: bool = False
    kill_window_ms: float = 30.0
    point_share: float = 0.35
    fault_share: float = 0.15


def worker_command(store: Path, task: str, url: str, mode: str, blind: bool) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "castore.lab.worker",
        "--store",
        str(store),
        "--task",
        task,
        "--service",
        url,
        "--mode",
        mode,
    ]
    return [*command, "--blind-resubmit"] if blind else command


def spawn(command: list[str], crash_at: str | None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop(ENV_VAR, None)
    if crash_at:
        env[ENV_VAR] = crash_at
    # The command is the sample worker with paths this campaign made: nothing untrusted.
    return subprocess.Popen(  # noqa: S603
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def wait_ready(process: subprocess.Popen[str]) -> bool:
    """Block until the worker printed 'ready' (imports done) or exited."""
    stdout: IO[str] | None = process.stdout
    line = stdout.readline() if stdout is not None else ""
    return line.strip() == "ready"


def finish(process: subprocess.Popen[str], kill_after_s: float | None) -> tuple[int, str]:
    """Wait for the worker; SIGKILL it after `kill_after_s` if it is still running."""
    try:
        out, err = process.communicate(
            timeout=kill_after_s if kill_after_s is not None else WORKER_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        out, err = process.communicate(timeout=WORKER_TIMEOUT_S)
    return process.returncode, out + err


def choose_point(rng: random.Random) -> str:
    point = rng.choice(POINTS)
    top = 3 if point.startswith("effect.") else 12
    return f"{point}:{rng.randint(1, top)}"


def resolve_from_ledger(store: castore.Store, task: str, svc: ServiceProcess, ledger: Path) -> None:
    """What the person on call does for an UNRESOLVED effect: ask the service's records."""
    status = store.status(task)
    for effect in status.effects:
        if effect.state != "UNRESOLVED":
            continue
        receipts = [e["receipt"] for e in read_ledger(ledger) if e["key"] == effect.key]
        if receipts:
            store.resolve(
                task, effect.step, receipt=receipts[0], who="campaign", reason="ledger has it"
            )
        else:
            store.resolve(task, effect.step, not_done=True, who="campaign", reason="not in ledger")


def drive(
    store_paths: list[Path],
    task: str,
    svc: ServiceProcess,
    *,
    ledger: Path,
    settings: Settings,
    rng: random.Random,
    tally: Tally,
) -> str:
    """Start, kill and restart one task's worker until it finishes; returns its final output.
    With several paths (mounts of one store on different clients) the attempts alternate."""
    client = svc.client()
    for attempt in range(MAX_ATTEMPTS):
        store_path = store_paths[attempt % len(store_paths)]
        command = worker_command(store_path, task, svc.url, settings.mode, settings.blind)
        roll = rng.random()
        crash_at = choose_point(rng) if roll < settings.point_share else None
        if settings.point_share <= roll < settings.point_share + settings.fault_share:
            client.control(drop_after_commit=1)
            tally.faults += 1
        process = spawn(command, crash_at)
        ready = wait_ready(process)
        random_kill = (
            crash_at is None and ready and roll >= settings.point_share + settings.fault_share
        )
        delay = rng.uniform(0, settings.kill_window_ms) / 1000 if random_kill else None
        code, output = finish(process, delay)
        client.control(drop_after_commit=0)
        if code == -signal.SIGKILL:
            tally.kills += 1
            tally.point_kills += crash_at is not None
            tally.random_kills += crash_at is None
        if code == worker.EXIT_DONE:
            return output
        if code == worker.EXIT_UNKNOWN:
            tally.unresolved_reported += 1
            resolve_from_ledger(castore.Store.open(store_path), task, svc, ledger)
        elif code == worker.EXIT_REFUSED:
            tally.corrupt += 1
            tally.problems.append(f"{task}: resume refused: {output.strip()[-300:]}")
            return output
        elif code not in (-signal.SIGKILL, worker.EXIT_INTERRUPTED, worker.EXIT_CONFLICT):
            raise RuntimeError(f"worker for {task} exited {code}:\n{output}")
        tally.restarts += 1
    raise RuntimeError(f"{task} did not finish in {MAX_ATTEMPTS} attempts")


def check_task(store: castore.Store, task: str, ledger: list[dict[str, Any]], tally: Tally) -> None:
    """Judge one finished task against the ledger and a crash-free reference run."""
    try:
        chain = store.verify(task)
    except castore.CastoreError as exc:
        tally.corrupt += 1
        tally.problems.append(f"{task}: {exc}")
        return
    plan_digest = castore.plan_id(worker.PLAN)
    receipts: dict[str, str | None] = {}
    for name in worker.EFFECTS:
        outcome = chain.outcomes.get(name)
        receipts[name] = outcome.receipt if outcome else None
        key = castore.derive_key(task, plan_digest, name)
        applied = [entry["receipt"] for entry in ledger if entry["key"] == key]
        if len(applied) > 1:
            tally.duplicates += len(applied) - 1
            tally.problems.append(f"{task}: {name} applied {len(applied)} times")
        if receipts[name] is None or receipts[name] not in applied:
            tally.lost += 1
            tally.problems.append(f"{task}: {name} receipt {receipts[name]} not in the ledger")
    summary = chain.outcomes["summary"].result if "summary" in chain.outcomes else None
    expected = {**REFERENCE, "receipts": receipts}
    if summary != expected:
        tally.mismatched += 1
        tally.problems.append(f"{task}: final results {summary} differ from {expected}")


# The crash-free run's results (receipts aside, which the service makes up).
REFERENCE = {"amount": 3750, "slot": "bay-5"}


def campaign(
    workdir: Path,
    runs: int,
    settings: Settings,
    say: Say | None = None,
    store_paths: list[Path] | None = None,
) -> Tally:
    """Run `runs` tasks of the sample worker under fire; return the tally. `store_paths`:
    several mounts of one store (two network-filesystem clients); workers alternate."""
    rng = random.Random(settings.seed)  # noqa: S311 - reproducible fault schedule, not crypto
    paths = store_paths or [workdir / "store"]
    store_path = paths[0]
    castore.Store.open(store_path, create=True)
    ledger = workdir / f"ledger-{settings.mode}.jsonl"
    tally = Tally()
    started = time.monotonic()
    with start_service(ledger, settings.mode) as svc:
        for index in range(runs):
            task = f"order-{settings.seed}-{index}"
            drive(paths, task, svc, ledger=ledger, settings=settings, rng=rng, tally=tally)
            tally.runs += 1
            if say and (index + 1) % max(1, runs // 10) == 0:
                elapsed = time.monotonic() - started
                say(f"  {index + 1}/{runs} runs, {tally.kills} kills, {elapsed:.0f}s")
    store = castore.Store.open(store_path)
    entries = read_ledger(ledger)
    for index in range(runs):
        check_task(store, f"order-{settings.seed}-{index}", entries, tally)
    return tally
