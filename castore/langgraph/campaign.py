"""The LangGraph crash campaign: SIGKILL the paying agent at random moments and right after the
service committed, restart it until its thread finishes, and judge the service's own ledger.

Two arms share one run and one service: `baseline` (SqliteSaver, a plain tool, any durability)
and `castore` (a durable_tool, durability "sync" or "async"). The judge counts ledger entries
per order (the payload, not castore's key): more than one is a duplicate, none (or a receipt
the graph reports that the ledger lacks) is lost.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from castore.crashpoints import ENV_VAR
from castore.format.model import attrs
from castore.lab.campaign import WORKER_TIMEOUT_S
from castore.lab.service import ServiceProcess, read_ledger, start_service
from castore.langgraph import agentlab
from castore.langgraph.durability import SAFE_MODES

MAX_ATTEMPTS = 200
ARMS = ("baseline", "castore")
DURABILITIES = ("sync", "async", "exit")
# Points of castore's protocol where a kill leaves the payment in flight or just confirmed.
CASTORE_POINTS = ("effect.submitted:1", "effect.sent:1", "effect.confirmed:1", "commit.linked:2")


@attrs.define
class Tally:
    """What a campaign counted; its last line is the key=value report."""

    runs: int = 0
    kills: int = 0  # both arms
    duplicates: int = 0
    baseline_duplicates: int = 0
    unresolved: int = 0
    lost: int = 0
    baseline_lost: int = 0
    problems: list[str] = attrs.field(factory=list)  # castore's arm
    notes: list[str] = attrs.field(factory=list)  # the baseline's losses
    # (arm, durability) -> [threads, kills, duplicates]: the campaign table
    table: dict[str, list[int]] = attrs.field(factory=dict)

    def row(self, arm: str, durability: str) -> list[int]:
        return self.table.setdefault(f"{arm}/{durability}", [0, 0, 0])

    def line(self) -> str:
        keys = ("runs", "kills", "duplicates", "baseline_duplicates", "unresolved", "lost")
        return "langgraph " + " ".join(f"{key}={getattr(self, key)}" for key in keys)


@attrs.frozen
class Settings:
    seed: int
    kill_window_ms: float = 400.0
    after_apply_share: float = 0.3
    point_share: float = 0.2
    random_share: float = 0.3
    # Each thread's first run is killed right after the service committed its payment: the
    # moment a re-execution pays twice. Later runs follow the random schedule.
    first_after_apply: bool = True


def command(workdir: Path, arm: str, thread: str, svc: ServiceProcess, **extra: str) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "castore.langgraph.agentlab",
        "--arm",
        arm,
        "--store",
        str(workdir / "store"),
        "--sqlite",
        str(workdir / f"{arm}.sqlite"),
        "--thread",
        thread,
        "--service",
        svc.url,
    ]
    for name, value in extra.items():
        argv += [f"--{name}", value]
    return argv


def answer_from_ledger(ledger: Path, interrupt: dict[str, Any]) -> dict[str, Any]:
    """What the person on call does for an UNRESOLVED call: ask the service's records."""
    receipts = [e["receipt"] for e in read_ledger(ledger) if e["key"] == interrupt["key"]]
    about = {"attempt": interrupt["attempt"], "who": "campaign"}
    if receipts:
        return {"confirmed": receipts[0], "reason": "the ledger has it", **about}
    return {"not_done": "the ledger has no entry with this key", **about}


def _run_once(argv: list[str], armed: dict[str, str], delay: float | None) -> tuple[int, str]:
    """One agent process: `armed` crash variables set (none inherited), SIGKILLed `delay`
    seconds after it is ready. Its stdout is read through one buffered reader only (the
    "ready" line and its result can arrive in one read)."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, agentlab.CRASH_AFTER_APPLY)}
    with tempfile.TemporaryFile() as stderr:
        # The command is the lab agent with paths this campaign made: nothing untrusted.
        process = subprocess.Popen(  # noqa: S603
            argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env={**env, **armed}
        )
        stdout = process.stdout
        assert stdout is not None  # noqa: S101 - stdout=PIPE
        ready = stdout.readline().strip() == "ready"
        timer = threading.Timer(delay, process.kill) if ready and delay is not None else None
        if timer is not None:
            timer.start()
        try:
            out = stdout.read()
            code = process.wait(timeout=WORKER_TIMEOUT_S)
        finally:
            if timer is not None:
                timer.cancel()
            stdout.close()
        stderr.seek(0)
        return code, out + stderr.read().decode(errors="replace")


def drive(
    workdir: Path,
    arm: str,
    thread: str,
    svc: ServiceProcess,
    *,
    ledger: Path,
    rng: random.Random,
    settings: Settings,
    tally: Tally,
) -> tuple[str | None, list[int]]:
    """Kill and restart one thread's agent until it finishes; returns the receipt it reports
    and its row of the table (threads, kills, duplicates of its arm and durability)."""
    declare = rng.choice(("lookup", "none"))
    durability = rng.choice(DURABILITIES if arm == "baseline" else SAFE_MODES)
    resume: str | None = None
    row = tally.row(arm, durability)
    row[0] += 1
    for attempt in range(MAX_ATTEMPTS):
        extra = {"declare": declare, "durability": durability}
        if resume is not None:
            extra["resume"] = resume
        argv = command(workdir, arm, thread, svc, **extra)
        roll = rng.random()
        armed: dict[str, str] = {}
        delay: float | None = None
        if roll < settings.after_apply_share or (attempt == 0 and settings.first_after_apply):
            armed[agentlab.CRASH_AFTER_APPLY] = "1"
        elif roll < settings.after_apply_share + settings.point_share and arm == "castore":
            armed[ENV_VAR] = rng.choice(CASTORE_POINTS)
        elif roll < settings.after_apply_share + settings.point_share + settings.random_share:
            delay = rng.uniform(0, settings.kill_window_ms) / 1000
        code, output = _run_once(argv, armed, delay)
        if code == -signal.SIGKILL:
            tally.kills += 1
            row[1] += 1
            continue
        resume = None
        if code == agentlab.EXIT_DONE:
            done: str | None = _last_json(output, code).get("done")
            return done, row
        if code == agentlab.EXIT_UNRESOLVED:
            tally.unresolved += 1
            interrupt = _last_json(output, code)["unresolved"]
            resume = json.dumps(answer_from_ledger(ledger, interrupt))
        elif code != agentlab.EXIT_INTERRUPTED:
            raise RuntimeError(f"{arm} agent for {thread} exited {code}:\n{output}")
    raise RuntimeError(f"{arm} thread {thread} did not finish in {MAX_ATTEMPTS} attempts")


def _last_json(output: str, code: int) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            found: dict[str, Any] = json.loads(line)
            return found
    raise RuntimeError(f"the agent exited {code} with no JSON result:\n{output!r}")


def judge(
    arm: str, thread: str, receipt: str | None, ledger: Path, *, tally: Tally, row: list[int]
) -> None:
    """Count what the service applied for this thread's order against what the graph says."""
    applied = [e["receipt"] for e in read_ledger(ledger) if e["payload"]["order"] == thread]
    extra = max(0, len(applied) - 1)
    missing = int(not applied or receipt not in applied)
    row[2] += extra
    if arm == "baseline":
        tally.baseline_duplicates += extra
        tally.baseline_lost += missing
        if missing:
            tally.notes.append(f"{thread}: applied {applied}, the graph reports {receipt!r}")
        return
    tally.duplicates += extra
    tally.lost += missing
    if extra or missing:
        tally.problems.append(f"{thread}: applied {applied}, the graph reports {receipt!r}")


def campaign(
    workdir: Path, runs: int, settings: Settings, say: Callable[[str], None] | None = None
) -> Tally:
    """`runs` threads per arm under fire; returns the tally. `say` gets the tally so far
    every tenth of the way."""
    rng = random.Random(settings.seed)  # noqa: S311 - a reproducible fault schedule
    ledger = workdir / "ledger.jsonl"
    tally = Tally()
    with start_service(ledger, "lookup") as svc:
        for index in range(runs):
            for arm in ARMS:
                thread = f"{arm}-{settings.seed}-{index}"
                receipt, row = drive(
                    workdir,
                    arm,
                    thread,
                    svc,
                    ledger=ledger,
                    rng=rng,
                    settings=settings,
                    tally=tally,
                )
                judge(arm, thread, receipt, ledger, tally=tally, row=row)
            tally.runs += 1
            if say is not None and (index + 1) % max(1, runs // 10) == 0:
                say(f"  after {index + 1}/{runs}: {tally.line()}")
    return tally
